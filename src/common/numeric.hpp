// Bit-exact conversions between fp32 and the storage types moekit reads (host and device).
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstdint>
#include <cstring>

#include "common/hd.hpp"

namespace moekit::numeric {

MOEKIT_HD float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
MOEKIT_HD uint32_t float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

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
uint8_t float_to_e2m1(float f);  // round to nearest even, saturate to +-6

// e8m0 scale: 2^(v-127); 0xff is NaN.
float e8m0_to_float(uint8_t v);
uint8_t float_to_e8m0_ceil(float f);  // smallest power of two >= f (f > 0), clamped

}  // namespace moekit::numeric
