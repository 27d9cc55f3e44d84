// The TMA tensor maps of the kernels that load through TMA (sm90_gemv_tma.cu): the driver's
// encoder, found once, and a 2-D map re-encoded only when its tensor moves (so graph replays
// keep the map their launch captured). Host code; C++17.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "moekit/status.hpp"

namespace moekit::gemm::detail {

// cuTensorMapEncodeTiled from the driver, or null with `status` set.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(Status& status) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                           &q);
    if (err == cudaSuccess && q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  if (fn == nullptr)
    status = Status(ErrorCode::kCuda, std::string("the driver has no cuTensorMapEncodeTiled (") +
                                          cudaGetErrorString(err) + ")");
  return fn;
}

// A row-major [rows, cols] tensor of `type` (elem_bytes each), read in boxes of box_rows x
// box_cols. Out-of-bounds boxes read as zeros.
struct TensorMap2d {
  CUtensorMap desc{};  // what the kernel takes (__grid_constant__)
  const void* base = nullptr;
  int64_t rows = 0;

  Status encode(PFN_cuTensorMapEncodeTiled_v12000 fn, const void* at, CUtensorMapDataType type,
                int elem_bytes, int64_t cols, int64_t row_count, int box_cols, int box_rows,
                CUtensorMapSwizzle swizzle, const std::string& what) {
    if (at == base && row_count == rows) return {};
    if (reinterpret_cast<uintptr_t>(at) % 16 != 0)
      return Status(ErrorCode::kInvalidArgument, what + " not 16-byte aligned");
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(row_count)};
    const cuuint64_t pitch[1] = {cuuint64_t(cols) * cuuint64_t(elem_bytes)};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    const cuuint32_t unit[2] = {1, 1};
    const CUresult r = fn(&desc, type, 2, const_cast<void*>(at), dims, pitch, box, unit,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
      return Status(ErrorCode::kCuda, "cuTensorMapEncodeTiled failed for " + what + " (CUresult " +
                                          std::to_string(r) + ")");
    base = at;
    rows = row_count;
    return {};
  }
};

}  // namespace moekit::gemm::detail
