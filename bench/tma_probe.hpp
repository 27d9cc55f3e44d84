// Helpers of the TMA weight-stream probe (tma_stream.cu): errors, tensor maps, timing.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>

#include <cstdio>
#include <cstdlib>

#include "common/event_timing.hpp"

namespace tma_probe {

constexpr int kBoxK = 64;  // 64 bf16: one 128-byte row piece, the 128-byte swizzle's width

// The whole block: a ring's barriers, each stage's full one taking one arrival (with the
// bytes) and its empty one an arrival per consumer warp.
template <int kStages>
__device__ inline void init_ring(uint64_t (&full)[kStages], uint64_t (&empty)[kStages],
                                 int consumers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&full[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty[s], consumers);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

inline PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  check(
      cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q),
      "cuTensorMapEncodeTiled");
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

// How the map reads: the GEMV's (128-byte swizzle, L2 promotion to 128-byte lines) or another.
struct MapStyle {
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
};

inline CUtensorMap make_map(void* base, int64_t rows, int64_t k, int box_rows, MapStyle style) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t pitch[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {kBoxK, cuuint32_t(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  if (encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, pitch, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, style.swizzle, style.promotion,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != 0) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    std::exit(1);
  }
  return m;
}

template <class Launch>
double median_us(Launch&& launch) {
  return moekit::event_median_us(nullptr, 3, 22, launch);
}

}  // namespace tma_probe
