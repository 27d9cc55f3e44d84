// See weight_prefetch.hpp.
#include <cuda_runtime.h>

#include <string>

#include "pipeline/pdl.cuh"
#include "pipeline/weight_prefetch.hpp"

namespace moekit::pipeline {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 64 * 1024;  // bytes per bulk prefetch

struct Params {
  const char* weights;
  const int32_t* row_offsets;
  int groups;
  int64_t expert_bytes, budget_bytes;
};

__global__ void __launch_bounds__(kThreads) prefetch_kernel(Params p) {
  pdl_wait();  // row_offsets come from the permutation
  pdl_launch_dependents();
  int live = 0;
  for (int g0 = 0; g0 < p.groups; g0 += kThreads) {
    const int g = g0 + threadIdx.x;
    live += __syncthreads_count(g < p.groups && p.row_offsets[g + 1] > p.row_offsets[g]);
  }
  if (live == 0) return;
  const int64_t per_expert = min(p.expert_bytes, p.budget_bytes / live) / 16 * 16;
  const int64_t chunks = (per_expert + kChunk - 1) / kChunk;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  // Chunk j of expert g goes to block (g * chunks + j) % gridDim.x: every SM takes a share.
  for (int g = threadIdx.x; g < p.groups; g += kThreads) {
    if (p.row_offsets[g + 1] <= p.row_offsets[g]) continue;
    const char* base = p.weights + int64_t(g) * p.expert_bytes;
    int64_t j = (blockIdx.x - (int64_t(g) * chunks) % gridDim.x + gridDim.x) % gridDim.x;
    for (; j < chunks; j += gridDim.x) {
      const int64_t at = j * kChunk;
      const uint32_t bytes = static_cast<uint32_t>(min(kChunk, per_expert - at));
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(base + at),
                   "r"(bytes), "l"(policy)
                   : "memory");
    }
  }
}

}  // namespace

Status prepare_weight_prefetch() {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, prefetch_kernel);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("loading the weight prefetch kernel failed: ") + cudaGetErrorString(e));
  return {};
}

Status prefetch_weights_l2(const WeightPrefetch& w, const int32_t* row_offsets,
                           cudaStream_t stream) {
  if (w.weights == nullptr || row_offsets == nullptr || w.groups < 1 || w.blocks < 1 ||
      w.expert_bytes < 16 || w.expert_bytes % 16 != 0 || w.budget_bytes < 0)
    return Status(ErrorCode::kInvalidArgument,
                  "weight prefetch: groups " + std::to_string(w.groups) + ", expert bytes " +
                      std::to_string(w.expert_bytes) + ", blocks " + std::to_string(w.blocks) +
                      " (needs weights, offsets, groups >= 1, expert bytes a multiple of 16)");
  Params p{static_cast<const char*>(w.weights), row_offsets, w.groups, w.expert_bytes,
           w.budget_bytes};
  const cudaError_t e = launch_pdl(prefetch_kernel, w.blocks, kThreads, 0, stream, p);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("launching the weight prefetch failed: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace moekit::pipeline
