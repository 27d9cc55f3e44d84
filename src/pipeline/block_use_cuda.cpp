#include <cuda_runtime.h>

#include <string>

#include "pipeline/block_use.hpp"

namespace moekit::pipeline {
namespace {
Status failed(cudaError_t e, const char* what) {
  return Status(ErrorCode::kCuda, std::string(what) + " failed: " + cudaGetErrorString(e));
}
}  // namespace

Status block_use_of(const void* kernel, int threads, std::size_t dynamic_smem, BlockUse& out) {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) return failed(e, "cudaFuncGetAttributes");
  out = BlockUse{threads, attr.numRegs, attr.sharedSizeBytes + dynamic_smem};
  return {};
}

Status sm_limits(int device, SmLimits& out) {
  int v[5] = {};
  const cudaDeviceAttr attrs[5] = {
      cudaDevAttrMaxThreadsPerMultiProcessor, cudaDevAttrMaxRegistersPerMultiprocessor,
      cudaDevAttrMaxBlocksPerMultiprocessor, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
      cudaDevAttrReservedSharedMemoryPerBlock};
  for (int i = 0; i < 5; ++i) {
    const cudaError_t e = cudaDeviceGetAttribute(&v[i], attrs[i], device);
    if (e != cudaSuccess) return failed(e, "cudaDeviceGetAttribute");
  }
  out = SmLimits{v[0], v[1], v[2], static_cast<std::size_t>(v[3]), static_cast<std::size_t>(v[4])};
  return {};
}

}  // namespace moekit::pipeline
