// Bit-exact conversions between fp32 and the storage types moekit reads (host and device).
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstdint>
#include <cstring>

#include "common/hd.hpp"

namespace moekit::numeric {

MOEKIT_HD float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
MOEKIT_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

MOEKIT_HD float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays NaN.
MOEKIT_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE binary16.
float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);  // round to nearest even, overflow to inf

// OCP fp8 e4m3fn: bias 7, max 448, no inf; 0x7f / 0xff are NaN.
float e4m3_to_float(uint8_t v);
uint8_t float_to_e4m3(float f);  // round to nearest even, saturate to +-448, NaN -> 0x7f

// e2m1 (fp4): values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; bit 3 is the sign.
float e2m1_to_float(uint8_t nibble);
uint8_t float_to_e2m1(float f);  // round to nearest even, saturate to +-6, NaN -> 0x7 (+6)

// e8m0 scale: 2^(v-127); 0xff is NaN.
float e8m0_to_float(uint8_t v);
// Smallest power of two >= f, clamped to [2^-127, 2^127]; f <= 0 gives 0 (2^-127), NaN 0xff.
uint8_t float_to_e8m0_ceil(float f);

// ---- Inline forms of the conversions above, for kernels and hot host loops. The out-of-line
// functions above call these, so host and device share one definition.

// m / 2^s rounded to nearest even (m < 2^24).
MOEKIT_HD uint32_t round_shift_rne(uint32_t m, int s) {
  if (s <= 0) return m;
  if (s >= 32) return 0;  // m < 2^24 < half a unit
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}
// Rounds the non-negative finite fp32 bit pattern `u` (sign cleared) to a minifloat with
// `mbits` mantissa bits and exponent bias `bias` (subnormals included), round to nearest even.
// Returns (biased exponent << mbits | mantissa), unbounded: the caller saturates.
MOEKIT_HD uint32_t encode_minifloat_abs(uint32_t u, int mbits, int bias) {
  const int e32 = static_cast<int>(u >> 23);  // biased fp32 exponent
  const int emin = 1 - bias;                  // smallest normal exponent of the target
  if (e32 - 127 >= emin) {
    const int s = 23 - mbits;
    const uint32_t r = u + ((1u << (s - 1)) - 1u) + ((u >> s) & 1u);
    return (r >> s) - (static_cast<uint32_t>(127 - bias) << mbits);
  }
  // Subnormal in the target: count units of 2^(emin - mbits).
  const uint32_t mant = (u & 0x7fffffu) | (e32 != 0 ? 0x800000u : 0u);
  const int e_lsb = (e32 != 0 ? e32 : 1) - 150;  // exponent of mant's lowest bit
  return round_shift_rne(mant, (emin - mbits) - e_lsb);
}

MOEKIT_HD float fp16_to_float_hd(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
    return bits_to_float(float_to_bits(v) | sign);
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
MOEKIT_HD uint16_t float_to_fp16_hd(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  const uint32_t c = encode_minifloat_abs(a, 10, 15);
  return static_cast<uint16_t>(sign | (c >= 0x7c00u ? 0x7c00u : c));
}

MOEKIT_HD float e4m3_to_float_hd(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) {
    const float x = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9, exact
    return bits_to_float(float_to_bits(x) | sign);
  }
  return bits_to_float(sign | ((exp + 120u) << 23) | (mant << 20));
}
MOEKIT_HD uint8_t float_to_e4m3_hd(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                                 // NaN
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf)
  const uint32_t c = encode_minifloat_abs(a, 3, 7);
  return static_cast<uint8_t>(sign | (c > 0x7eu ? 0x7eu : c));
}

MOEKIT_HD float e2m1_to_float_hd(uint8_t nibble) {
  // Magnitudes of codes 0..7 in units of 0.5: 0, 1, 2, 3, 4, 6, 8, 12.
  const uint32_t m = nibble & 7u;
  const float mag = m < 4u ? 0.5f * static_cast<float>(m)
                           : static_cast<float>((m & 1u) ? (m == 5u ? 3 : 6) : (m == 4u ? 2 : 4));
  return (nibble & 8u) ? -mag : mag;
}
MOEKIT_HD uint8_t float_to_e2m1_hd(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 28) & 0x8u;
  const float a = bits_to_float(u & 0x7fffffffu);
  if (!(a == a)) return 0x7;  // NaN has no e2m1 code: +6, as PTX cvt .satfinite does
  // Count the midpoints between neighbouring codes below |f|; at a midpoint the even code
  // wins (> where the upper code is odd, >= where it is even). Saturates at 6, inf included.
  const uint32_t c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                     (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(sign | c);
}

MOEKIT_HD float e8m0_to_float_hd(uint8_t v) {
  if (v == 0xffu) return bits_to_float(0x7fc00000u);
  return bits_to_float(v == 0 ? 0x00400000u : static_cast<uint32_t>(v) << 23);
}
MOEKIT_HD uint8_t float_to_e8m0_ceil_hd(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xff;  // NaN
  if (u & 0x80000000u) return 0;                     // <= 0: the smallest scale
  const uint32_t e = u >> 23, mant = u & 0x7fffffu;
  if (e == 0) return mant <= 0x400000u ? 0 : 1;  // fp32 subnormal: 2^-127 or 2^-126
  const uint32_t c = e + (mant != 0 ? 1u : 0u);
  return static_cast<uint8_t>(c > 254u ? 254u : c);  // inf and > 2^127 clamp to 2^127
}

// Activation quantize-dequantize through e4m3 (the W8A8 formats' rule, quant::prepare_activations,
// shared with the device kernels that apply it): e4m3 of x / scale (IEEE division; nearest even,
// saturated at +-448, NaN kept) times scale.
MOEKIT_HD float round_through_e4m3_hd(float x, float scale) {
  return e4m3_to_float_hd(float_to_e4m3_hd(x / scale)) * scale;
}
// MXFP8's activation scale for a 32-value group whose absolute maximum is `amax`:
// 2^ceil(log2(amax / 448)) as e8m0 (an all-zero group gets 2^-127).
MOEKIT_HD float mxfp8_activation_scale_hd(float amax) {
  return e8m0_to_float_hd(float_to_e8m0_ceil_hd(amax / 448.0f));
}

}  // namespace moekit::numeric
