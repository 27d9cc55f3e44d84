// The activation between FC1 and FC2 on the device: FC1 output [rows, fc1_rows] plus the FC1
// bias, then the (gated) activation of activation_math.hpp, rounded to the element type, into
// [rows, intermediate]. Only the rows the permutation filled (offsets[L]) are touched.
// Gated kinds read FC1 rows (and bias) in the engine's blocked order, whatever the checkpoint's
// GateUpLayout (activation_math.hpp: blocked_gate_row / blocked_up_row; gate_up_order.hpp
// reorders at upload).
// C++17, no CUDA device code: host code and CUDA translation units include this.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "activation/activation_math.hpp"
#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::activation {

struct DeviceActivation {
  DType elem = DType::kBFloat16;  // kBFloat16 or kFloat16 (input and output)
  Params params;                  // kind, clamp, alpha, beta
  int64_t intermediate = 0;       // output columns (local I), a multiple of 8
  int64_t fc1_rows() const { return is_gated(params.kind) ? 2 * intermediate : intermediate; }
  const float* fc1_bias = nullptr;  // device [local experts, fc1_rows], null = none;
                                    // blocked order for gated kinds, like the rows
  int local_experts = 0;
};

// Checks `a` (element type, alignment) and loads the kernel run_device() launches for it.
Status prepare_device(const DeviceActivation& a);

// fc1_out [max_rows, fc1_rows] -> out [max_rows, intermediate]; rows [0, offsets[L]) only.
// row_expert [rows] gives each row's local expert (for the bias). `max_rows` bounds the launch.
Status run_device(const DeviceActivation& a, const void* fc1_out, void* out,
                  const int32_t* row_expert, const int32_t* offsets, int64_t max_rows,
                  cudaStream_t stream);

// The FP8 engines' activation: fc1_out [max_rows, fc1_rows] of `fc1_dtype` (bf16, or fp32
// accumulators) in the checkpoint's gate/up `layout` (not the blocked order; the bias,
// DeviceActivation::fc1_bias, likewise), plus the bias, rounded once to bf16, through the
// activation, rounded to bf16, then quantized to e4m3 per 128
// outputs (pipeline/fp8_quantize.cuh) into `out`; rows [0, offsets[L]) only. elem bf16 and
// intermediate a multiple of 128, else kUnsupported.
struct QuantizedActivations {
  void* values = nullptr;               // e4m3 [max_rows, intermediate]
  float* scales = nullptr;              // [max_rows, intermediate / 128]
  const float* static_scale = nullptr;  // [local experts] or null (dynamic)
  // Dynamic: one scale per row (pipeline::token_scale of its amax) written for each of its
  // groups (WeightQuant::dynamic_activations); else one per 128 outputs.
  bool per_token = false;
};
// Loads the kernel run_device_quantized launches for these choices (`per_token`: a dynamic
// QuantizedActivations::per_token).
Status prepare_device_quantized(const DeviceActivation& a, GateUpLayout layout, DType fc1_dtype,
                                bool per_token);
Status run_device_quantized(const DeviceActivation& a, GateUpLayout layout, DType fc1_dtype,
                            const void* fc1_out, const QuantizedActivations& out,
                            const int32_t* row_expert, const int32_t* offsets, int64_t max_rows,
                            cudaStream_t stream);

}  // namespace moekit::activation
