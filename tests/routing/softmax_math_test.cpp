// The fp32 softmax term the host reference and the routing warp share (routing/softmax_math.hpp):
// within 2 fp32 ulps of exp() over its whole range, exact at 0, zero below -87 and for -inf and
// NaN. routing_device_test.cu checks that the GPU gives the same bits.
#include "routing/softmax_math.hpp"

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

TEST(SoftmaxMath, ExpWithinTwoUlpsOverItsRange) {
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

TEST(SoftmaxMath, ExpEdges) {
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_GT(exp_nonpositive(-87.0f), 0.0f);
  EXPECT_TRUE(std::isnormal(exp_nonpositive(-87.0f)));
  EXPECT_EQ(exp_nonpositive(std::nextafter(-87.0f, -INFINITY)), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e30f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_nonpositive(std::numeric_limits<float>::quiet_NaN()), 0.0f);
}

TEST(SoftmaxMath, WeightIsTermOverSumScaled) {
  const float t = exp_nonpositive(-1.0f);
  const double sum = 1.0 + static_cast<double>(t);
  EXPECT_NEAR(softmax_weight(t, sum, 1.0f), std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(softmax_weight(1.0f, sum, 2.5f), 2.5 / (1.0 + std::exp(-1.0)), 3e-7);
}

}  // namespace
}  // namespace moekit::routing
