// Bit helpers of the wgmma decoders (sm90_mx_wgmma_decoder.cuh, sm90_int_wgmma_decoder.cuh) that
// also run on the host, where the decoders are tested: bf16 bits from and to fp32, a byte
// permute (the device's prmt), bf16 pairs.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

// `#pragma unroll` in code that also compiles for the host, whose compiler warns about it.
#if defined(__CUDA_ARCH__)
#define MOEKIT_DEVICE_UNROLL _Pragma("unroll")
#else
#define MOEKIT_DEVICE_UNROLL
#endif

namespace moekit::gemm::detail {

__host__ __device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

__host__ __device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  const __nv_bfloat16 b = __float2bfloat16_rn(f);
  uint16_t u;
  memcpy(&u, &b, 2);
  return u;
}

__host__ __device__ __forceinline__ float bits_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Byte i of the result is byte (sel >> 4i) & 7 of {hi:lo} (the device's prmt, default mode).
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(lo, hi, sel);
#else
  const uint64_t both = (uint64_t(hi) << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= uint32_t((both >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

// A bf16 pair's bits from two halves' bits.
__host__ __device__ __forceinline__ uint32_t bf16x2_bits(uint32_t lo, uint32_t hi) {
  return lo | (hi << 16);
}

// Two fp32 values as a bf16 pair, each rounded once (low first).
__host__ __device__ __forceinline__ uint32_t bf16x2_of(float lo, float hi) {
  return bf16x2_bits(float_to_bf16_bits(lo), float_to_bf16_bits(hi));
}

}  // namespace moekit::gemm::detail
