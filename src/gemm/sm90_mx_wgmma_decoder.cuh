// The decoder of the microscaling formats (MXFP4, NVFP4, MXFP8) for the decoded-weight wgmma
// kernel (sm90_decoded_wgmma.cuh, whose header says what a decoder is; sm90_mx_wgmma.cu runs it).
// Each weight becomes a bf16 already times its block's scale, exactly: an e2m1 value times an
// e8m0 scale is a bf16 (one significant bit, bf16's exponent range, subnormals included), and
// so is an e2m1 value times an NVFP4 e4m3 block scale (at most 6 significant bits) and an e4m3
// value times an e8m0 scale unless the product falls under bf16's subnormals (e8m0 < 3 with an
// e4m3 subnormal). NVFP4's fp32 global scale multiplies the fp32 sums. e8m0 0xff and e4m3 NaN
// scales are NaN, as in quant::dequantize_expert. `decode` also runs on the host, where the
// tests check it against the reference's decode (tests/gemm/decoded_wgmma_host_test.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "gemm/wgmma_decode_bits.cuh"
#include "moekit/types.hpp"

namespace moekit::gemm::detail {

constexpr int mx_format_bits(WeightFormat f) { return f == WeightFormat::kMXFP8 ? 8 : 4; }
constexpr int mx_format_block(WeightFormat f) { return f == WeightFormat::kNVFP4 ? 16 : 32; }

// e8m0 as bf16 bits: 2^(e - 127) exactly (e = 0 is bf16's subnormal 2^-127), 0xff NaN.
__host__ __device__ __forceinline__ uint32_t e8m0_bf16(uint32_t e) {
  return e == 0xffu ? 0x7fc0u : e == 0 ? 0x0040u : e << 7;
}

// e4m3 (low byte of `code`) as bf16 bits, exactly (through fp16; NaN stays NaN).
__host__ __device__ __forceinline__ uint32_t e4m3_bf16(uint32_t code) {
  const __half_raw h =
      __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code & 0xffu), __NV_E4M3);
  return float_to_bf16_bits(__half2float(__half(h)));
}

// The bf16 pair product a * b, each half rounded once (on the host: the exact fp32 product,
// rounded to bf16 the same way).
__host__ __device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  uint32_t r = 0;
  for (int half = 0; half < 2; ++half) {
    const float x = bf16_bits_to_float(static_cast<uint16_t>(a >> (16 * half)));
    const float y = bf16_bits_to_float(static_cast<uint16_t>(b >> (16 * half)));
    r |= uint32_t(float_to_bf16_bits(x * y)) << (16 * half);
  }
  return r;
#endif
}

// The two e2m1 values of byte c of `word` (low nibble first) as a bf16 pair times 2^-126: the
// magnitude bits become bf16's exponent low bits and mantissa top bit, the sign its sign (0.5,
// e2m1's subnormal, lands on bf16's subnormal 2^-127).
__host__ __device__ __forceinline__ uint32_t e2m1_byte_bf16x2(uint32_t word, uint32_t c) {
  const uint32_t p = byte_perm(word, word >> 4, c | ((c + 4) << 8));  // byte 0: lo, byte 2: hi
  return ((p << 6) & 0x01c001c0u) | ((p << 12) & 0x80008000u);
}

// e4m3 pair (two bytes, low first) as a bf16 pair, exactly.
__host__ __device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t two) {
  const __half2_raw r =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(r));
  return bf16x2_of(f.x, f.y);
}

struct MxDecArgs {
  const uint8_t* scales;       // [groups, n, k / block]
  const float* global_scales;  // [groups] (kNVFP4) or null
};

// One consumer thread's view of a tile of one microscaling format: its 4 rows' scale bytes.
template <WeightFormat F>
struct MxDecoder {
  static constexpr int kBits = mx_format_bits(F);
  using Args = MxDecArgs;
  // Per row (m64 tile 0's g, g + 8, then tile 1's), the stage's 2 e8m0 or 4 e4m3 scale bytes.
  struct Stage {
    uint32_t bytes[4];
  };
  const uint8_t* srow[4];
  float global;

  __device__ __forceinline__ MxDecoder(const Args& a, int g, int n, int k, const int (&rows)[4]) {
    const int64_t row_scales = k / mx_format_block(F);
    MOEKIT_DEVICE_UNROLL
    for (int r = 0; r < 4; ++r) srow[r] = a.scales + (int64_t(g) * n + rows[r]) * row_scales;
    global = F == WeightFormat::kNVFP4 ? __ldg(a.global_scales + g) : 1.0f;
  }
  __device__ __forceinline__ float sum_scale() const { return global; }

  __device__ __forceinline__ Stage load(int kb) const {
    Stage s;
    MOEKIT_DEVICE_UNROLL
    for (int r = 0; r < 4; ++r) {
      if constexpr (F == WeightFormat::kNVFP4)
        s.bytes[r] = __ldg(reinterpret_cast<const uint32_t*>(srow[r]) + kb);
      else
        s.bytes[r] = __ldg(reinterpret_cast<const unsigned short*>(srow[r]) + kb);
    }
    return s;
  }

  // Registers of a fragment: row g k 2c.., row g + 8 k 2c.., row g k 2c + 8.., row g + 8
  // k 2c + 8..; a row's half stage is 16 bytes (e2m1: step j's 8 at 8j, this thread's bytes c
  // and c + 4 of them) or 32 (e4m3: step j's 16 at 16j, pairs at 2c and 2c + 8).
  static __host__ __device__ __forceinline__ void decode(const uint8_t* const (&wrow)[4], int h,
                                                         uint32_t c, const Stage& s,
                                                         uint32_t (&a)[2][2][4]) {
    constexpr uint32_t kTwo126 = 0x7e807e80u;  // bf16 pair 2^126, 2^126
    MOEKIT_DEVICE_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int i = r >> 1, half = r & 1;
      if constexpr (F == WeightFormat::kMXFP8) {
        const uint4 lo = *reinterpret_cast<const uint4*>(wrow[r] + 32 * h);
        const uint4 hi = *reinterpret_cast<const uint4*>(wrow[r] + 32 * h + 16);
        const uint32_t e = e8m0_bf16((s.bytes[r] >> (8 * h)) & 0xffu);
        const uint32_t scale = bf16x2_bits(e, e);
        const uint32_t sh = 16 * (c & 1);
        MOEKIT_DEVICE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const uint4& v = j == 0 ? lo : hi;
          const uint32_t first = (c >> 1) == 0 ? v.x : v.y;
          const uint32_t second = (c >> 1) == 0 ? v.z : v.w;
          a[i][j][half] = bf16x2_mul(e4m3x2_bf16x2(first >> sh), scale);
          a[i][j][2 + half] = bf16x2_mul(e4m3x2_bf16x2(second >> sh), scale);
        }
      } else {
        const uint4 v = *reinterpret_cast<const uint4*>(wrow[r] + 16 * h);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        MOEKIT_DEVICE_UNROLL
        for (int j = 0; j < 2; ++j) {
          uint32_t b;
          if constexpr (F == WeightFormat::kNVFP4)
            b = e4m3_bf16(s.bytes[r] >> (8 * (2 * h + j)));
          else
            b = e8m0_bf16((s.bytes[r] >> (8 * h)) & 0xffu);
          const uint32_t scale = bf16x2_bits(b, b);
          a[i][j][half] = bf16x2_mul(bf16x2_mul(e2m1_byte_bf16x2(w[2 * j], c), kTwo126), scale);
          a[i][j][2 + half] =
              bf16x2_mul(bf16x2_mul(e2m1_byte_bf16x2(w[2 * j + 1], c), kTwo126), scale);
        }
      }
    }
  }
};

}  // namespace moekit::gemm::detail
