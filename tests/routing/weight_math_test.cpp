// The fp32 terms the host reference and the routing warp share (routing/weight_math.hpp): exp
// within 2 fp32 ulps over its whole range, exact at 0, zero below -87 and for -inf and NaN; the
// sigmoid within 4 ulps. routing_device_test.cu checks that the GPU gives the same bits.
#include "routing/weight_math.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace moekit::routing {
namespace {

// Distance in fp32 ulps between a float and the exact value rounded to double.
double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(WeightMath, ExpWithinTwoUlpsOverItsRange) {
  double worst = 0.0;
  float worst_at = 0.0f;
  // Every 997th float in [-87, 0] (negative floats grow in magnitude with their bits): ~1.1
  // million points, every binade of the argument.
  const uint32_t last = std::bit_cast<uint32_t>(-87.0f);
  for (uint32_t bits = 0x80000000u; bits <= last; bits += 997) {
    const float d = std::bit_cast<float>(bits);
    const double e = ulps(exp_nonpositive(d), std::exp(static_cast<double>(d)));
    if (e > worst) worst = e, worst_at = d;
  }
  EXPECT_LE(worst, 2.0) << "at " << worst_at;
}

TEST(WeightMath, ExpEdges) {
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_GT(exp_nonpositive(-87.0f), 0.0f);
  EXPECT_TRUE(std::isnormal(exp_nonpositive(-87.0f)));
  EXPECT_EQ(exp_nonpositive(std::nextafter(-87.0f, -INFINITY)), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e30f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_nonpositive(std::numeric_limits<float>::quiet_NaN()), 0.0f);
}

TEST(WeightMath, SigmoidWithinFourUlps) {
  double worst = 0.0;
  float worst_at = 0.0f;
  // Every 997th float of [-87, 87] (both signs).
  const uint32_t last = std::bit_cast<uint32_t>(87.0f);
  for (uint32_t bits = 0; bits <= last; bits += 997) {
    for (float x : {std::bit_cast<float>(bits), -std::bit_cast<float>(bits)}) {
      const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
      const double e = ulps(sigmoid_fp32(x), want);
      if (e > worst) worst = e, worst_at = x;
    }
  }
  EXPECT_LE(worst, 4.0) << "at " << worst_at;
  EXPECT_EQ(sigmoid_fp32(0.0f), 0.5f);
  EXPECT_EQ(sigmoid_fp32(INFINITY), 1.0f);
  EXPECT_EQ(sigmoid_fp32(200.0f), 1.0f);
  EXPECT_EQ(sigmoid_fp32(-INFINITY), 0.0f);
  EXPECT_EQ(sigmoid_fp32(std::numeric_limits<float>::quiet_NaN()), 0.0f);
}

TEST(WeightMath, WeightIsTermOverSumScaled) {
  const float t = exp_nonpositive(-1.0f);
  const double sum = 1.0 + static_cast<double>(t);
  EXPECT_NEAR(normalized_weight(t, sum, 1.0f), std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(normalized_weight(1.0f, sum, 2.5f), 2.5 / (1.0 + std::exp(-1.0)), 3e-7);
}

}  // namespace
}  // namespace moekit::routing
