#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <string>

#include "moekit/status.hpp"

namespace moekit {

// A CUDA runtime call's result as a Status naming what failed (ok for cudaSuccess).
inline Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return {};
  return Status(ErrorCode::kCuda, what + " failed: " + cudaGetErrorString(e));
}

// The same, thrown as Error(kCuda).
inline void check_cuda(cudaError_t e, const std::string& what) {
  throw_if_error(cuda_status(e, what));
}

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

// Makes `device` current for a scope and restores the caller's device after it; throws
// Error(kCuda) where either call fails.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check_cuda(cudaGetDevice(&previous_), "querying the current CUDA device");
    if (previous_ != device_)
      check_cuda(cudaSetDevice(device_), "selecting CUDA device " + std::to_string(device_));
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace moekit
