// Bit-exact conversions of the storage types against hand-computed values and exhaustive
// searches over every code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/numeric.hpp"

namespace moekit::numeric {
namespace {

float bits(uint32_t u) { return bits_to_float(u); }

// e4m3fn by its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits.
double e4m3_by_definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(E4M3, EveryCodeDecodes) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), e4m3_by_definition(c)) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 128) << "code " << c;
    EXPECT_EQ(e4m3_to_float_hd(static_cast<uint8_t>(c)), v) << "code " << c;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x08), 0.015625f);     // smallest normal 2^-6
  EXPECT_EQ(e4m3_to_float(0x07), 0.013671875f);  // largest subnormal 7 * 2^-9
  EXPECT_EQ(e4m3_to_float(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(e4m3_to_float(0x5a), 20.0f);         // 2^4 * 1.25
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(E4M3, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // halfway 1 and 1.125: even mantissa 0
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);  // halfway 1.125 and 1.25: even mantissa 2
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);
  EXPECT_EQ(float_to_e4m3(-1.1875f), 0xba);
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7e);  // halfway 416 and 448: even (448)
  EXPECT_EQ(float_to_e4m3(424.0f), 0x7d);  // 416
  EXPECT_EQ(float_to_e4m3(449.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);  // would round to 480: saturates
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_e4m3(-NAN), 0x7f);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  // Subnormals count units of 2^-9.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // half a unit: even 0
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.5f, -10)), 0x01);   // 0.75 unit
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.5f, -9)), 0x02);    // 1.5 units: even 2
  EXPECT_EQ(float_to_e4m3(std::ldexp(2.5f, -9)), 0x02);    // 2.5 units: even 2
  EXPECT_EQ(float_to_e4m3(std::ldexp(7.5f, -9)), 0x08);    // rounds up into the normals
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -140)), 0x00);  // fp32 subnormal input
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -140)), 0x80);
}

// Nearest finite code by search, ties to the even code; saturating.
template <class Decode>
int nearest_code(float x, int n_codes, Decode decode) {
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < n_codes; ++c) {
    const double v = decode(c);
    if (std::isnan(v)) continue;
    const double err = std::fabs(v - static_cast<double>(x));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

TEST(E4M3, MatchesExhaustiveSearchOnRandomValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-12, 9);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(mant(rng), ex(rng));
    if (i & 1) x = -x;
    const int want = nearest_code(std::fabs(x), 127, e4m3_by_definition) | (x < 0 ? 0x80 : 0);
    ASSERT_EQ(float_to_e4m3(x), want) << "x = " << x;
  }
}

TEST(E2M1, EveryNibbleDecodes) {
  const float want[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (int n = 0; n < 16; ++n) {
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(n)), want[n]) << "nibble " << n;
    EXPECT_EQ(std::signbit(e2m1_to_float(static_cast<uint8_t>(n))), n >= 8) << "nibble " << n;
    EXPECT_EQ(float_to_e2m1(want[n]), n) << "nibble " << n;
  }
  // Only the low nibble matters.
  EXPECT_EQ(e2m1_to_float(0xf7), 6.0f);
}

TEST(E2M1, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_e2m1(0.25f), 0x0);  // 0 | 0.5: even 0
  EXPECT_EQ(float_to_e2m1(0.26f), 0x1);
  EXPECT_EQ(float_to_e2m1(0.75f), 0x2);  // 0.5 | 1: even code 2
  EXPECT_EQ(float_to_e2m1(1.25f), 0x2);  // 1 | 1.5: even code 2
  EXPECT_EQ(float_to_e2m1(1.75f), 0x4);  // 1.5 | 2: even code 4
  EXPECT_EQ(float_to_e2m1(2.5f), 0x4);   // 2 | 3: even code 4
  EXPECT_EQ(float_to_e2m1(3.5f), 0x6);   // 3 | 4: even code 6
  EXPECT_EQ(float_to_e2m1(5.0f), 0x6);   // 4 | 6: even code 6
  EXPECT_EQ(float_to_e2m1(5.01f), 0x7);
  EXPECT_EQ(float_to_e2m1(7.0f), 0x7);
  EXPECT_EQ(float_to_e2m1(1e20f), 0x7);
  EXPECT_EQ(float_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(float_to_e2m1(-INFINITY), 0xf);
  EXPECT_EQ(float_to_e2m1(-5.0f), 0xe);
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1(NAN), 0x7);
  EXPECT_EQ(float_to_e2m1(std::ldexp(1.0f, -130)), 0x0);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-8.0f, 8.0f);
  auto dec = [](int c) { return static_cast<double>(e2m1_to_float(static_cast<uint8_t>(c))); };
  for (int i = 0; i < 5000; ++i) {
    const float x = d(rng);
    ASSERT_EQ(float_to_e2m1(x), nearest_code(std::fabs(x), 8, dec) | (x < 0 ? 8 : 0)) << x;
  }
}

TEST(E8M0, EdgeValues) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(128), 2.0f);
  EXPECT_EQ(e8m0_to_float(120), 0.0078125f);
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_to_float(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));  // an fp32 subnormal, not zero
  EXPECT_GT(e8m0_to_float(0), 0.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  for (int v = 0; v < 255; ++v)
    EXPECT_EQ(e8m0_to_float(static_cast<uint8_t>(v)), std::ldexp(1.0f, v - 127)) << v;

  EXPECT_EQ(float_to_e8m0_ceil(1.0f), 127);
  EXPECT_EQ(float_to_e8m0_ceil(1.5f), 128);
  EXPECT_EQ(float_to_e8m0_ceil(0.75f), 127);
  EXPECT_EQ(float_to_e8m0_ceil(0.5f), 126);
  EXPECT_EQ(float_to_e8m0_ceil(std::nextafter(2.0f, 3.0f)), 129);
  EXPECT_EQ(float_to_e8m0_ceil(std::ldexp(1.0f, -126)), 1);
  EXPECT_EQ(float_to_e8m0_ceil(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(float_to_e8m0_ceil(std::ldexp(1.5f, -127)), 1);
  EXPECT_EQ(float_to_e8m0_ceil(std::ldexp(1.0f, -140)), 0);
  EXPECT_EQ(float_to_e8m0_ceil(0.0f), 0);
  EXPECT_EQ(float_to_e8m0_ceil(-3.0f), 0);
  EXPECT_EQ(float_to_e8m0_ceil(std::ldexp(1.0f, 127)), 254);
  EXPECT_EQ(float_to_e8m0_ceil(3e38f), 254);  // 2^128 does not exist: clamped
  EXPECT_EQ(float_to_e8m0_ceil(INFINITY), 254);
  EXPECT_EQ(float_to_e8m0_ceil(NAN), 255);
}

TEST(BF16, RoundsToNearestEvenKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits(0x3f808000u)), 0x3f80);  // tie: even
  EXPECT_EQ(float_to_bf16(bits(0x3f818000u)), 0x3f82);  // tie: even
  EXPECT_EQ(float_to_bf16(bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits(0xbf818000u)), 0xbf82);
  EXPECT_EQ(float_to_bf16(bits(0x7f7fffffu)), 0x7f80);  // overflow to inf
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  const uint16_t nan = float_to_bf16(bits(0x7f800001u));  // a NaN whose payload is all low bits
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
}

TEST(FP16, RoundsToNearestEvenOverflowsToInf) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: even
  EXPECT_EQ(float_to_fp16(-2.5f), 0xc100);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // tie between 65504 and 65536: inf
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: even 0
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: even 2
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  const uint16_t n = float_to_fp16(NAN);
  EXPECT_EQ(n & 0x7c00, 0x7c00);
  EXPECT_NE(n & 0x3ff, 0);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(bits(0x7f800001u)))));
  EXPECT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_float(0x7c00), INFINITY);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x83ff), -1023 * std::ldexp(1.0f, -24));
}

TEST(FP16, EveryCodeRoundTripsAndMatchesDefinition) {
  for (int c = 0; c < 65536; ++c) {
    const float v = fp16_to_float(static_cast<uint16_t>(c));
    const int e = (c >> 10) & 31, m = c & 1023;
    if (e == 31) {
      EXPECT_EQ(std::isnan(v), m != 0) << c;
      if (m == 0) EXPECT_EQ(float_to_fp16(v), c) << c;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
    ASSERT_EQ(static_cast<double>(v), (c & 0x8000) ? -mag : mag) << c;
    ASSERT_EQ(float_to_fp16(v), c) << c;
  }
}

TEST(FP16, MatchesNeighbourSearchOnRandomValues) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> d(0x33000000u, 0x477fefffu);  // 2^-25 .. just below 65520
  for (int i = 0; i < 20000; ++i) {
    const float x = bits(d(rng));
    const uint16_t h = float_to_fp16(x);
    const double v = fp16_to_float(h);
    const double below = fp16_to_float(static_cast<uint16_t>(h - (h > 0 ? 1 : 0)));
    const double above = fp16_to_float(static_cast<uint16_t>(h + 1));
    const double err = std::fabs(v - x);
    ASSERT_LE(err, std::fabs(below - x)) << x;
    ASSERT_LE(err, std::fabs(above - x)) << x;
    if (err == std::fabs(above - x) || (h > 0 && err == std::fabs(below - x))) {
      ASSERT_EQ(h & 1, 0) << "tie not to even at " << x;
    }
  }
}

}  // namespace
}  // namespace moekit::numeric
