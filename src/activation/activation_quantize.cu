// The FP8 engines' activation (activation_device.hpp, run_device_quantized): FC1's output (bf16,
// or fp32 where a bias is added) in the checkpoint's gate/up order, plus the bias, through the
// activation, rounded to bf16, then quantized to e4m3 per 128 outputs for FC2. One warp per (row,
// group of 128 outputs); each lane computes 4 of them.
#include <algorithm>
#include <string>

#include <cuda_bf16.h>

#include "activation/activation_device.hpp"
#include "common/cuda_status.hpp"
#include "pipeline/fp8_quantize.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::activation {
namespace {

constexpr int kWarps = 8;  // per block

enum Mode : int { kPlain = 0, kHalves = 1, kInterleaved = 2 };

struct QuantizeArgs {
  Params p;
  const void* in;             // [rows, fc1_rows], bf16 or fp32
  const float* bias;          // [L, fc1_rows] or null
  const float* static_scale;  // [L] or null
  const int32_t* row_expert;
  const int32_t* rows_end;  // &offsets[L]
  uint8_t* values;          // [rows, I]
  float* scales;            // [rows, I / 128]
  int64_t intermediate, fc1_rows;
};

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

// FC1's value at column c of `row` plus its bias, rounded once to bf16 as the reference rounds
// FC1's output: an fp32 row holds the accumulators (the engine's choice where there is a bias), a
// bf16 one is rounded already.
template <class In>
__device__ __forceinline__ float fc1_value(const In* row, const float* bias, int64_t c) {
  const float y = to_float(row[c]);
  return bias ? round_bf16(y + bias[c]) : round_bf16(y);
}

// This lane's 4 activated outputs of group g of `row` (expert e), rounded to bf16.
template <class In, int kMode>
__device__ __forceinline__ void activated4(const QuantizeArgs& a, int64_t row, int32_t e, int64_t g,
                                           int lane, float x[4]) {
  const In* in = static_cast<const In*>(a.in) + row * a.fc1_rows;
  const float* bias = a.bias ? a.bias + static_cast<int64_t>(e) * a.fc1_rows : nullptr;
  const int64_t j0 = g * pipeline::kFp8Group + 4 * lane;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t j = j0 + i;
    float v;
    if (kMode == kPlain) {
      v = apply_plain(a.p, fc1_value(in, bias, j));
    } else if (kMode == kHalves) {  // gate rows [0, I), up rows [I, 2I)
      v = apply_gated(a.p, fc1_value(in, bias, j), fc1_value(in, bias, a.intermediate + j));
    } else {  // gate 2j, up 2j + 1 (gpt-oss)
      v = apply_gated(a.p, fc1_value(in, bias, 2 * j), fc1_value(in, bias, 2 * j + 1));
    }
    x[i] = round_bf16(v);
  }
}

// One warp per (row, group of 128 outputs): a scale per group, static or dynamic.
template <class In, int kMode>
__global__ void __launch_bounds__(kWarps * 32) activation_quantize_kernel(QuantizeArgs a) {
  pipeline::pdl_wait();  // FC1's output and the offsets come from earlier kernels
  pipeline::pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t groups = a.intermediate / pipeline::kFp8Group;
  const int64_t work = static_cast<int64_t>(*a.rows_end) * groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); w < work;
       w += warps) {
    const int64_t row = w / groups, g = w - row * groups;
    const int32_t e = a.row_expert[row];
    float x[4];
    activated4<In, kMode>(a, row, e, g, lane, x);
    const float fixed = a.static_scale ? a.static_scale[e] : 0.0f;
    const float scale = pipeline::quantize_group4(
        x, fixed, a.values + row * a.intermediate + g * pipeline::kFp8Group + 4 * lane);
    if (lane == 0) a.scales[row * groups + g] = scale;
  }
}

// One warp per row, one dynamic scale for the whole row (WeightQuant::dynamic_activations): a
// pass for the row's amax, then the activation again, quantized.
template <class In, int kMode>
__global__ void __launch_bounds__(kWarps * 32) activation_quantize_token_kernel(QuantizeArgs a) {
  pipeline::pdl_wait();
  pipeline::pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t groups = a.intermediate / pipeline::kFp8Group;
  const int64_t rows = *a.rows_end;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); row < rows;
       row += warps) {
    const int32_t e = a.row_expert[row];
    float amax = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      float x[4];
      activated4<In, kMode>(a, row, e, g, lane, x);
      amax = fmaxf(amax, pipeline::warp_amax4(x));
    }
    const float scale = pipeline::token_scale(amax);
    for (int64_t g = 0; g < groups; ++g) {
      float x[4];
      activated4<In, kMode>(a, row, e, g, lane, x);
      pipeline::quantize_group4(
          x, scale, a.values + row * a.intermediate + g * pipeline::kFp8Group + 4 * lane);
      if (lane == 0) a.scales[row * groups + g] = scale;
    }
  }
}

using KernelFn = void (*)(QuantizeArgs);

template <class In, int kMode>
KernelFn pick_scale(bool per_token) {
  return per_token ? activation_quantize_token_kernel<In, kMode>
                   : activation_quantize_kernel<In, kMode>;
}

template <class In>
KernelFn pick_for(const DeviceActivation& a, GateUpLayout layout, bool per_token) {
  if (!is_gated(a.params.kind)) return pick_scale<In, kPlain>(per_token);
  return layout == GateUpLayout::kInterleaved ? pick_scale<In, kInterleaved>(per_token)
                                              : pick_scale<In, kHalves>(per_token);
}

KernelFn pick(const DeviceActivation& a, GateUpLayout layout, DType fc1_dtype, bool per_token) {
  return fc1_dtype == DType::kFloat32 ? pick_for<float>(a, layout, per_token)
                                      : pick_for<__nv_bfloat16>(a, layout, per_token);
}

Status check(const DeviceActivation& a, DType fc1_dtype) {
  if (fc1_dtype != DType::kBFloat16 && fc1_dtype != DType::kFloat32)
    return Status(
        ErrorCode::kUnsupported,
        std::string("the quantizing activation reads FC1's output as bf16 or fp32, not ") +
            to_string(fc1_dtype));
  if (a.elem != DType::kBFloat16)
    return Status(ErrorCode::kUnsupported,
                  std::string("the quantizing activation reads bf16, not ") + to_string(a.elem));
  if (a.intermediate <= 0 || a.intermediate % pipeline::kFp8Group != 0)
    return Status(ErrorCode::kUnsupported, "intermediate " + std::to_string(a.intermediate) +
                                               " is not a positive multiple of 128");
  return {};
}

}  // namespace

Status prepare_device_quantized(const DeviceActivation& a, GateUpLayout layout, DType fc1_dtype,
                                bool per_token) {
  Status s = check(a, fc1_dtype);
  if (!s.ok()) return s;
  cudaFuncAttributes attr;
  return cuda_status(cudaFuncGetAttributes(&attr, pick(a, layout, fc1_dtype, per_token)),
                     "loading the quantizing activation kernel");
}

Status run_device_quantized(const DeviceActivation& a, GateUpLayout layout, DType fc1_dtype,
                            const void* fc1_out, const QuantizedActivations& out,
                            const int32_t* row_expert, const int32_t* offsets, int64_t max_rows,
                            cudaStream_t stream) {
  Status s = check(a, fc1_dtype);
  if (!s.ok()) return s;
  if (max_rows <= 0) return {};
  QuantizeArgs k{};
  k.p = a.params;
  k.in = fc1_out;
  k.bias = a.fc1_bias;
  k.static_scale = out.static_scale;
  k.row_expert = row_expert;
  k.rows_end = offsets + a.local_experts;
  k.values = static_cast<uint8_t*>(out.values);
  k.scales = out.scales;
  k.intermediate = a.intermediate;
  k.fc1_rows = a.fc1_rows();
  const bool per_token = out.per_token && out.static_scale == nullptr;
  // Warps: one per row and group, or one per row.
  const int64_t work = per_token ? max_rows : max_rows * (a.intermediate / pipeline::kFp8Group);
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((work + kWarps - 1) / kWarps, 1, 132 * 32));
  return cuda_status(pipeline::launch_pdl(pick(a, layout, fc1_dtype, per_token), blocks,
                                          kWarps * 32, 0, stream, k),
                     "launching the quantizing activation kernel");
}

}  // namespace moekit::activation
