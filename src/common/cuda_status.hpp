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

}  // namespace moekit
