// Activation quantization to e4m3 on the device, shared by the FP8 engine's two quantizing
// kernels (permute's gather, the activation): the rule of quant::prepare_activations, which the
// CPU reference applies. A group of 128 values is held by one warp, 4 per lane.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace moekit::pipeline {

inline constexpr int kFp8Group = 128;  // columns per activation scale (DeepSeek-V3's 1 x 128)

// The warp's amax of its 4 values a lane (NaN skipped, as fmaxf skips it).
__device__ __forceinline__ float warp_amax4(const float x[4]) {
  float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return amax;
}

// Per-token dynamic scale (WeightQuant::dynamic_activations): amax / 448 floored at
// 1 / (448 * 512), as quant::prepare_activations and vLLM's per-token FP8 quantization.
__device__ __forceinline__ float token_scale(float row_amax) {
  return fmaxf(__fdiv_rn(row_amax, 448.0f), 1.0f / (448.0f * 512.0f));
}

__device__ __forceinline__ void unpack4_bf16(uint2 raw, float x[4]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}

// Quantizes the warp's group (this lane's 4 values `x`) and stores the lane's 4 e4m3 codes at
// `dst` (4-byte aligned); returns the group's scale (every lane). `fixed` > 0: that scale (a
// static per-tensor input scale); 0: max(amax, 1e-10) / 448, the eps of vLLM's
// per_token_group_quant_fp8 (vllm/model_executor/layers/quantization/utils/fp8_utils.py), so an
// all-zero group gets codes 0. Codes: x / scale (IEEE division) rounded to nearest even,
// saturated at +-448 (cvt .satfinite), NaN staying NaN. A NaN is skipped by the amax (fmaxf), as
// std::max skips it in the reference.
__device__ __forceinline__ float quantize_group4(const float x[4], float fixed, uint8_t* dst) {
  float scale = fixed;
  if (!(fixed > 0.0f)) scale = __fdiv_rn(fmaxf(warp_amax4(x), 1e-10f), 448.0f);
  const float2 lo = make_float2(__fdiv_rn(x[0], scale), __fdiv_rn(x[1], scale));
  const float2 hi = make_float2(__fdiv_rn(x[2], scale), __fdiv_rn(x[3], scale));
  const uint32_t q =
      static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3)) |
      (static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3)) << 16);
  *reinterpret_cast<uint32_t*>(dst) = q;
  return scale;
}

}  // namespace moekit::pipeline
