// The shared activation math on hand-computed values (expected values from exact math in double).
#include "activation/activation_math.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "moekit/spec.hpp"
#include "moekit/types.hpp"

namespace moekit::activation {
namespace {

constexpr double kRel = 2e-6;

void expect_close(double expected, float got) {
  EXPECT_NEAR(got, expected, kRel * std::max(1.0, std::fabs(expected)));
}

Params gated(Kind k) {
  Params p;
  p.kind = k;
  return p;
}

TEST(ActivationMath, KindsMirrorThePublicEnum) {
  for (int i = 1; i <= 9; ++i) {
    EXPECT_EQ(is_gated(static_cast<Kind>(i)), activation_is_gated(static_cast<ActivationKind>(i)))
        << "kind " << i;
  }
}

TEST(ActivationMath, SwiGLU) {
  expect_close(1.4621171572600098, apply_gated(gated(Kind::kSwiGLU), 1.0f, 2.0f));
  expect_close(-0.2384058440442351 * -3.0, apply_gated(gated(Kind::kSwiGLU), -2.0f, -3.0f));
}

TEST(ActivationMath, ClampedWithOnlyLimit) {
  Params p = gated(Kind::kSwiGLUClamped);
  p.limit = 0.5f;
  // gate 1 -> 0.5, up 2 -> 0.5: 0.5 * sigmoid(0.5) * 0.5.
  expect_close(0.15561483280046365, apply_gated(p, 1.0f, 2.0f));
  // up clamped from below too.
  expect_close(-0.15561483280046365, apply_gated(p, 1.0f, -2.0f));
  // gate is clamped from above only: -3 stays -3.
  expect_close(-0.07113880976635018, apply_gated(p, -3.0f, 0.5f));
}

TEST(ActivationMath, ClampedWithOnlyAlpha) {
  Params p = gated(Kind::kSwiGLUClamped);
  p.alpha = 1.702f;
  expect_close(1.6915915318656425, apply_gated(p, 1.0f, 2.0f));
  // No limit: a large gate passes unclamped.
  expect_close(100.0 / (1.0 + std::exp(-170.2)) * 2.0, apply_gated(p, 100.0f, 2.0f));
}

TEST(ActivationMath, ClampedWithOnlyBeta) {
  Params p = gated(Kind::kSwiGLUClamped);
  p.beta = 1.0f;
  expect_close(2.193175735890015, apply_gated(p, 1.0f, 2.0f));
}

TEST(ActivationMath, ClampedGptOss) {
  Params p = gated(Kind::kSwiGLUClamped);
  p.limit = 7.0f;
  p.alpha = 1.702f;
  p.beta = 1.0f;
  // gate 10 -> 7, up -9 -> -7: 7 * sigmoid(1.702 * 7) * (-7 + 1).
  expect_close(-41.99971876981991, apply_gated(p, 10.0f, -9.0f));
}

TEST(ActivationMath, NeutralDefaultsEqualSwiGLU) {
  ActivationParams ap;
  ap.kind = ActivationKind::kSwiGLUClamped;
  EXPECT_EQ(ap.alpha_or_default(), 1.0f);
  EXPECT_EQ(ap.beta_or_default(), 0.0f);
  Params p = gated(Kind::kSwiGLUClamped);  // default limit +inf, alpha 1, beta 0
  for (float g : {-5.0f, -0.3f, 0.0f, 0.7f, 12.0f}) {
    for (float u : {-4.0f, 0.25f, 9.0f}) {
      EXPECT_EQ(apply_gated(p, g, u), apply_gated(gated(Kind::kSwiGLU), g, u)) << g << " " << u;
    }
  }
}

TEST(ActivationMath, ClampKeepsNaN) {
  Params p = gated(Kind::kSwiGLUClamped);
  p.limit = 7.0f;
  EXPECT_TRUE(std::isnan(apply_gated(p, NAN, 1.0f)));
  EXPECT_TRUE(std::isnan(apply_gated(p, 1.0f, NAN)));
}

TEST(ActivationMath, GeGLUTanhVersusErf) {
  expect_close(0.8411919906082768 * 2.0, apply_gated(gated(Kind::kGeGLUTanh), 1.0f, 2.0f));
  expect_close(0.8413447460685429 * 2.0, apply_gated(gated(Kind::kGeGLUErf), 1.0f, 2.0f));
  expect_close(-0.6997857884901164, apply_gated(gated(Kind::kGeGLUTanh), 1.5f, -0.5f));
  expect_close(-0.6998945990483565, apply_gated(gated(Kind::kGeGLUErf), 1.5f, -0.5f));
  // The two differ by more than rounding: a swapped pair would be caught.
  EXPECT_GT(std::fabs(apply_gated(gated(Kind::kGeGLUTanh), 1.0f, 1.0f) -
                      apply_gated(gated(Kind::kGeGLUErf), 1.0f, 1.0f)),
            1e-4f);
}

TEST(ActivationMath, NonGated) {
  Params p;
  p.kind = Kind::kSiLU;
  expect_close(2.3103545499468914, apply_plain(p, 2.5f));
  expect_close(-0.2384058440442351, apply_plain(p, -2.0f));
  p.kind = Kind::kGeLUTanh;
  expect_close(-0.04540230591222494, apply_plain(p, -2.0f));
  p.kind = Kind::kGeLUErf;
  expect_close(-0.04550026389635842, apply_plain(p, -2.0f));
  p.kind = Kind::kReLU2;
  EXPECT_EQ(apply_plain(p, 3.0f), 9.0f);
  EXPECT_EQ(apply_plain(p, -3.0f), 0.0f);
  p.kind = Kind::kIdentity;
  EXPECT_EQ(apply_plain(p, -1.25f), -1.25f);
}

}  // namespace
}  // namespace moekit::activation
