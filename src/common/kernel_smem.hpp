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
// "invalid argument". Serialized, so set-ups on several threads cannot lower it either. More
// than the device gives one block (with the kernel's static shared memory) is Error(kUnsupported)
// naming both, found before any CUDA call could fail on it.
inline Status raise_dynamic_smem_limit(const void* kernel, std::size_t bytes,
                                       const std::string& what) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  cudaFuncAttributes attr{};
  Status st = cuda_status(cudaFuncGetAttributes(&attr, kernel), what + ": loading the kernel");
  int device = 0, optin = 0;
  if (st.ok()) st = cuda_status(cudaGetDevice(&device), what + ": querying the device");
  if (st.ok())
    st =
        cuda_status(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                    what + ": querying the device's shared memory");
  if (st.ok() && bytes + attr.sharedSizeBytes > static_cast<std::size_t>(optin))
    return Status(ErrorCode::kUnsupported,
                  what + " needs " + std::to_string(bytes) + " bytes of dynamic shared memory (" +
                      std::to_string(attr.sharedSizeBytes) + " static), more than the " +
                      std::to_string(optin) + " a block of device " + std::to_string(device) +
                      " can have");
  if (st.ok() && static_cast<std::size_t>(attr.maxDynamicSharedSizeBytes) < bytes)
    st = cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)),
                     what + ": setting its shared memory");
  if (!st.ok()) cudaGetLastError();  // reported here, not again by the next launch's check
  return st;
}

}  // namespace moekit
