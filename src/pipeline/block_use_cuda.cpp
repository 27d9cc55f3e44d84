#include <cuda_runtime.h>

#include "common/cuda_status.hpp"
#include "pipeline/block_use.hpp"

namespace moekit::pipeline {

Status block_use_of(const void* kernel, int threads, std::size_t dynamic_smem, BlockUse& out) {
  cudaFuncAttributes attr{};
  const Status s = cuda_status(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes");
  if (s.ok()) out = BlockUse{threads, attr.numRegs, attr.sharedSizeBytes + dynamic_smem};
  return s;
}

Status sm_limits(int device, SmLimits& out) {
  int v[5] = {};
  const cudaDeviceAttr attrs[5] = {
      cudaDevAttrMaxThreadsPerMultiProcessor, cudaDevAttrMaxRegistersPerMultiprocessor,
      cudaDevAttrMaxBlocksPerMultiprocessor, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
      cudaDevAttrReservedSharedMemoryPerBlock};
  for (int i = 0; i < 5; ++i) {
    const Status s = cuda_status(cudaDeviceGetAttribute(&v[i], attrs[i], device),
                                 "cudaDeviceGetAttribute");
    if (!s.ok()) return s;
  }
  out = SmLimits{v[0], v[1], v[2], static_cast<std::size_t>(v[3]), static_cast<std::size_t>(v[4])};
  return {};
}

}  // namespace moekit::pipeline
