// A kernel's dynamic shared-memory limit, raised where a caller needs it. C++17: CUDA
// translation units include this.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <string>

#include "common/cuda_status.hpp"

namespace moekit {

// Raises `kernel`'s limit on dynamic shared memory on the current device to at least `bytes`,
// never lowers it. The limit belongs to the kernel, shared by every layer and GEMM that launches
// it: set to one caller's need, it would make the launch of another that needs more fail with
// "invalid argument". Serialized, so set-ups on several threads cannot lower it either.
inline Status raise_dynamic_smem_limit(const void* kernel, std::size_t bytes,
                                       const std::string& what) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  cudaFuncAttributes attr{};
  Status st = cuda_status(cudaFuncGetAttributes(&attr, kernel), what + ": loading the kernel");
  if (st.ok() && static_cast<std::size_t>(attr.maxDynamicSharedSizeBytes) < bytes)
    st = cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)),
                     what + ": setting its shared memory");
  if (!st.ok()) cudaGetLastError();  // reported here, not again by the next launch's check
  return st;
}

}  // namespace moekit
