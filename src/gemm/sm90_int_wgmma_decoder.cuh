// The decoder of int4 / int8 group weights for the decoded-weight wgmma kernel
// (sm90_decoded_wgmma.cuh, whose header says what a decoder is; sm90_int_wgmma.cu runs it), over
// the int engine's layout (pipeline/sm90_int_layout.hpp: signed codes, fp32 scales and zero
// terms [k / group, n]), any group size. Each weight is the reference's fp32 q' * s + zero_term
// (the code exact through the 2^23 float trick, one fma) rounded once to bf16, the one rounding
// the tensor cores' bf16 operand adds (CUTLASS's mixed-input path rounds the same product).
// `decode` also runs on the host, where the tests check it (tests/gemm/decoded_wgmma_host_test.cu).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "gemm/wgmma_decode_bits.cuh"

namespace moekit::gemm::detail {

struct IntDecArgs {
  const float* scales;  // [groups, k / group, n]
  const float* zeros;   // [groups, k / group, n] or null
  int group_size;
};

// The code in the low bits of `u`, offset to unsigned (int4: nibble ^ 8, int8: byte ^ 0x80), as
// the signed value in fp32, exactly: 2^23 + u has u in its mantissa.
template <int kBits>
__host__ __device__ __forceinline__ float code_value(uint32_t u) {
  constexpr float kBias = 8388608.0f + (kBits == 4 ? 8.0f : 128.0f);
  return bits_as_float(0x4b000000u | u) - kBias;
}

// One consumer thread's view of a tile: its 4 rows' scales (and zero terms) for each 32-deep
// half stage.
template <int kBitsT, bool kZero>
struct IntDecoder {
  static constexpr int kBits = kBitsT;
  using Args = IntDecArgs;
  struct Stage {
    float s[2][4], z[2][4];  // [half][row]
  };
  const float* srow[4];  // row r's entry of group 0
  const float* zrow[4];
  int64_t n;
  int group_size;

  __device__ __forceinline__ IntDecoder(const Args& a, int g, int n_rows, int k,
                                        const int (&rows)[4])
      : n(n_rows), group_size(a.group_size) {
    const int64_t base = int64_t(g) * (k / a.group_size) * n_rows;
    MOEKIT_DEVICE_UNROLL
    for (int r = 0; r < 4; ++r) {
      srow[r] = a.scales + base + rows[r];
      zrow[r] = kZero ? a.zeros + base + rows[r] : nullptr;
    }
  }
  __device__ __forceinline__ float sum_scale() const { return 1.0f; }

  __device__ __forceinline__ Stage load(int kb) const {
    Stage st;
    MOEKIT_DEVICE_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int64_t at = int64_t((kb * 64 + 32 * h) / group_size) * n;
      MOEKIT_DEVICE_UNROLL
      for (int r = 0; r < 4; ++r) {
        st.s[h][r] = __ldg(srow[r] + at);
        st.z[h][r] = kZero ? __ldg(zrow[r] + at) : 0.0f;
      }
    }
    return st;
  }

  // Two codes (int4: the nibbles of byte `b`; int8: bytes 0 and 1 of `b`) of row r as a bf16
  // pair, low code first.
  static __host__ __device__ __forceinline__ uint32_t pair(uint32_t b, float s, float z) {
    uint32_t lo, hi;
    if constexpr (kBits == 4) {
      lo = (b & 0xfu) ^ 0x8u;
      hi = ((b >> 4) & 0xfu) ^ 0x8u;
    } else {
      lo = (b & 0xffu) ^ 0x80u;
      hi = ((b >> 8) & 0xffu) ^ 0x80u;
    }
    return bf16x2_of(fmaf(code_value<kBits>(lo), s, z), fmaf(code_value<kBits>(hi), s, z));
  }

  // A row's half stage is 16 bytes (int4: step j's 8 at 8j, this thread's bytes c and c + 4 of
  // them) or 32 (int8: step j's 16 at 16j, pairs at 2c and 2c + 8).
  static __host__ __device__ __forceinline__ void decode(const uint8_t* const (&wrow)[4], int h,
                                                         uint32_t c, const Stage& st,
                                                         uint32_t (&a)[2][2][4]) {
    MOEKIT_DEVICE_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int i = r >> 1, half = r & 1;
      const float s = st.s[h][r], z = st.z[h][r];
      if constexpr (kBits == 8) {
        const uint4 lo = *reinterpret_cast<const uint4*>(wrow[r] + 32 * h);
        const uint4 hi = *reinterpret_cast<const uint4*>(wrow[r] + 32 * h + 16);
        const uint32_t sh = 16 * (c & 1);
        MOEKIT_DEVICE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const uint4& v = j == 0 ? lo : hi;
          a[i][j][half] = pair(((c >> 1) == 0 ? v.x : v.y) >> sh, s, z);
          a[i][j][2 + half] = pair(((c >> 1) == 0 ? v.z : v.w) >> sh, s, z);
        }
      } else {
        const uint4 v = *reinterpret_cast<const uint4*>(wrow[r] + 16 * h);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        MOEKIT_DEVICE_UNROLL
        for (int j = 0; j < 2; ++j) {
          a[i][j][half] = pair(w[2 * j] >> (8 * c), s, z);
          a[i][j][2 + half] = pair(w[2 * j + 1] >> (8 * c), s, z);
        }
      }
    }
  }
};

}  // namespace moekit::gemm::detail
