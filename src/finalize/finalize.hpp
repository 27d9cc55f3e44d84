// Finalize on the device: unpermute and combine the top-k expert outputs of every token,
//   out[t, :] = sum over slots s in order of w[t, s] * (Y[row(t, s), :] + fc2_bias[e])
// with fp32 accumulation, rounded once to the element type. Every token is written (zeros when
// none of its experts runs here). C++17: CUDA translation units include this.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::finalize {

struct DeviceFinalize {
  DType elem = DType::kBFloat16;  // kBFloat16 or kFloat16 (Y and out)
  int64_t hidden = 0;             // H, a multiple of 8
  int top_k = 0;
  const float* fc2_bias = nullptr;  // device [local experts, H], null = none (or not this rank)
};

// Checks `f` and loads its kernel (call before any graph capture).
Status prepare(const DeviceFinalize& f);

// y [rows, H] in expert order; slot_row / weights / slot_expert [tokens, k] (row -1: the slot
// does not run here; slot_expert: its local expert, read for the bias); out [tokens, H].
// slots_ready: the slot arrays were final before the previous kernel on the stream started
// (they come two or more kernels back, all launched with programmatic dependent launch), so
// the kernel reads them before its PDL wait.
Status run(const DeviceFinalize& f, int64_t tokens, const void* y, const int32_t* slot_row,
           const float* weights, const int32_t* slot_expert, void* out, cudaStream_t stream,
           bool slots_ready = false);

// The same sum where FC2 left fp32 partial sums per slice of the intermediate (one token's
// sliced kernel, gemm::GroupedGemm::launch_sliced): Y[row, :] is the sum of partials
// [row][s][:] over s < slices, in order. Slots whose row is -1 add nothing. The slot arrays
// are final before the previous kernel lets this one start; they are read before the PDL wait.
Status run_slices(const DeviceFinalize& f, int64_t tokens, const float* partials, int64_t slices,
                  const int32_t* slot_row, const float* weights, const int32_t* slot_expert,
                  void* out, cudaStream_t stream);

}  // namespace moekit::finalize
