// Decode overlap: while FC1 streams the hit experts' gate/up weights, pull their down weights
// into L2 so FC2 reads them from cache. At T=1 FC1 leaves DRAM bandwidth idle (its GEMV is bound
// by latency, not bytes), and a bulk prefetch costs one instruction per 64 KiB on whatever SM
// issues it. The FC1 GEMV marks its own loads evict-first and the prefetch evict-last, so the
// streamed FC1 weights do not push the prefetched FC2 weights out. C++17, CUDA translation units.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"

namespace moekit::pipeline {

struct WeightPrefetch {
  const void* weights = nullptr;  // [groups][expert_bytes]
  int groups = 0;
  int64_t expert_bytes = 0;  // multiple of 16
  int64_t budget_bytes = 0;  // spread evenly over the non-empty experts
  int blocks = 0;            // one per SM: every SM's bulk-copy unit takes a share
};

// Loads the kernel (call at build time, outside any capture); kCuda on failure.
Status prepare_weight_prefetch();

// Enqueues the prefetch of the experts g with row_offsets[g + 1] > row_offsets[g] (device
// array, int32 [groups + 1], written by the previous kernel: waited for through PDL). Lets the
// next kernel start at once. Never writes memory. kInvalidArgument on a bad description.
Status prefetch_weights_l2(const WeightPrefetch& p, const int32_t* row_offsets,
                           cudaStream_t stream);

}  // namespace moekit::pipeline
