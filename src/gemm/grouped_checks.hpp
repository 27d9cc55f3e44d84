// The host checks that the weight-only grouped GEMMs (int_grouped_gemm.hpp, mx_grouped_gemm.hpp)
// share: their extents and activation type, the device they run on, their operands' pointers.
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstdint>
#include <climits>
#include <initializer_list>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "common/cuda_status.hpp"
#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::gemm::detail {

// groups >= 1; n, k in [1, 2^31); max_rows in [0, 2^31); bf16 or fp16 activations; n a multiple
// of 8 (the output's 16-byte rows). `what` names the GEMM in the messages, which name the value.
inline Status check_grouped_extents(const std::string& what, int groups, int64_t n, int64_t k,
                                    int64_t max_rows, DType elem) {
  if (groups < 1)
    return Status(ErrorCode::kInvalidArgument,
                  what + " groups " + std::to_string(groups) + " must be at least 1");
  if (n < 1 || n > INT_MAX || k < 1 || k > INT_MAX)
    return Status(ErrorCode::kInvalidArgument, what + " n " + std::to_string(n) + " and k " +
                                                   std::to_string(k) + " must be in [1, 2^31)");
  if (max_rows < 0 || max_rows > INT_MAX)
    return Status(ErrorCode::kInvalidArgument,
                  what + " max_rows " + std::to_string(max_rows) + " must be in [0, 2^31)");
  if (elem != DType::kBFloat16 && elem != DType::kFloat16)
    return Status(ErrorCode::kUnsupported,
                  what + " runs bf16 or fp16 activations, not " + std::string(to_string(elem)));
  if (n % 8 != 0)
    return Status(ErrorCode::kUnsupported,
                  what + " n " + std::to_string(n) + " must be a multiple of 8 (16-byte rows)");
  return {};
}

// The multiprocessor count of `device`; throws Error(kUnsupported) where it is not sm_90,
// kCuda where the query fails.
inline int require_sm90(int device, const std::string& what) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "querying the device");
  if (prop.major != 9 || prop.minor != 0)
    throw Error(ErrorCode::kUnsupported, what + " needs sm_90 (Hopper), device " +
                                             std::to_string(device) + " is sm_" +
                                             std::to_string(prop.major * 10 + prop.minor));
  return prop.multiProcessorCount;
}

// kInvalidArgument naming the first null operand of `required`, or saying that one of
// `aligned` (nulls allowed) is not 16-byte aligned.
inline Status check_operands(const std::string& what,
                             std::initializer_list<std::pair<const void*, const char*>> required,
                             std::initializer_list<const void*> aligned) {
  for (const auto& [p, name] : required)
    if (p == nullptr) return Status(ErrorCode::kInvalidArgument, what + ": " + name + " is null");
  for (const void* p : aligned)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      return Status(ErrorCode::kInvalidArgument,
                    what + ": an operand is not 16-byte aligned (16-byte vector and TMA loads)");
  return {};
}

}  // namespace moekit::gemm::detail
