// Eight bf16 / fp16 elements moved as one 16-byte vector and computed on in fp32: the unit of
// the activation and finalize kernels; and one element's conversions.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace moekit::pipeline {

template <class T>
struct Pair2;
template <>
struct Pair2<__nv_bfloat16> {
  using Type = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_float2(Type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ Type from_floats(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};
template <>
struct Pair2<__half> {
  using Type = __half2;
  static __device__ __forceinline__ float2 to_float2(Type v) { return __half22float2(v); }
  static __device__ __forceinline__ Type from_floats(float a, float b) {
    return __floats2half2_rn(a, b);
  }
};

// One element to fp32 and back (round to nearest even).
__device__ __forceinline__ float elem_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float elem_to_float(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T float_to_elem(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 float_to_elem<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half float_to_elem<__half>(float v) {
  return __float2half_rn(v);
}

// Unpacks one 16-byte vector of 8 elements into f.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    typename Pair2<T>::Type p;
    memcpy(&p, &w[i], 4);
    const float2 x = Pair2<T>::to_float2(p);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// Rounds 8 floats (to nearest even) into one 16-byte vector.
template <class T>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const typename Pair2<T>::Type p = Pair2<T>::from_floats(f[2 * i], f[2 * i + 1]);
    memcpy(&w[i], &p, 4);
  }
  return uint4{w[0], w[1], w[2], w[3]};
}

// Adds 8 consecutive fp32 values (16-byte aligned) to f.
__device__ __forceinline__ void add8(const float* __restrict__ p, float (&f)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  f[0] += a.x;
  f[1] += a.y;
  f[2] += a.z;
  f[3] += a.w;
  f[4] += b.x;
  f[5] += b.y;
  f[6] += b.z;
  f[7] += b.w;
}

}  // namespace moekit::pipeline
