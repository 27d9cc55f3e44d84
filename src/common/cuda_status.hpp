#pragma once
#include <cuda_runtime_api.h>

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
