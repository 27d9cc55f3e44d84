// W4A16 / W8A16 grouped GEMM over experts on the device for the microscaling formats
// (include/moekit/types.hpp): kMXFP4 (e2m1 values, one e8m0 scale per 32 along k), kNVFP4
// (e2m1, one e4m3 scale per 16, one fp32 global scale per group) and kMXFP8 (e4m3, e8m0 per
// 32); bf16 or fp16 activations, fp32 accumulation:
//   D_g[m, n] = round(sum over k of A_g[m, k] * w_g[n, k] + bias_g[n])
//   w_g[n, k] = v[n, k] * s[n, k / block]                      (MXFP4, MXFP8: s = 2^(e - 127))
//   w_g[n, k] = v[n, k] * (e4m3(s[n, k / 16]) * global[g])     (NVFP4)
// each weight decoded in fp32 exactly as quant::dequantize_expert decodes it (bit-equal; an
// e8m0 scale 0xff is NaN there and here, so the rows it touches come out NaN). A bf16/fp16
// [rows, k] row-major (each group's rows from row_offsets); the weights in the device layout of
// pipeline/sm90_mx_layout.hpp (values [groups, n, k * bits / 8], scale bytes [groups, n,
// k / block], both row-major); D bf16/fp16 [rows, n].
// Tactics: the CUDA-core streaming GEMV (sm90_mx_gemv.cu, stream_gemv.cuh), 8 or 2 rows of a
// group per pass over its weights: exact for any row count, but it re-reads the weights (from
// L2) once per 8 rows, so it is the decode tactic. For prefill, with bf16 activations and k a
// multiple of 64, the tensor-core tactic (sm90_mx_wgmma.cu): weights decoded to bf16 in
// registers for wgmma, 128 or 64 tokens per tile.
// Row counts live only in device memory (no host sync), so a run can be graph-captured.
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::gemm {

struct MxGroupedShape {
  int groups = 0;
  int64_t n = 0, k = 0;                        // n a multiple of 8, k of 32
  int64_t max_rows = 0;                        // upper bound of row_offsets[groups]
  DType elem = DType::kBFloat16;               // A and D: kBFloat16 or kFloat16
  WeightFormat format = WeightFormat::kMXFP4;  // kMXFP4, kNVFP4 or kMXFP8
  bool bias = false;                           // Call::bias is read
};

class MxGroupedGemm {
 public:
  // Loads every tactic's kernel. Throws Error: kInvalidArgument or kUnsupported (shape, checked
  // before any CUDA call), kCuda. Ends with a device synchronize: build it outside any graph
  // capture.
  MxGroupedGemm(const MxGroupedShape& shape, int device);
  ~MxGroupedGemm();
  MxGroupedGemm(const MxGroupedGemm&) = delete;
  MxGroupedGemm& operator=(const MxGroupedGemm&) = delete;

  // Named tactics ("sm90.mxfp4.gemv.n8", "sm90.mxfp4.gemv.n2" where built; nvfp4, mxfp8).
  std::vector<std::string> tactics() const;
  // The tactic for `rows_per_group_hint` rows per group on average (host-known).
  std::string pick_tactic(double rows_per_group_hint) const;

  struct Call {
    const void* a = nullptr;               // [max_rows, k] elem
    const void* w = nullptr;               // values [groups, n, k * bits / 8]
    const uint8_t* scales = nullptr;       // scale bytes [groups, n, k / block]
    const float* global_scales = nullptr;  // [groups] (kNVFP4 only)
    const float* bias = nullptr;           // [groups, n] (shape.bias)
    void* d = nullptr;                     // [max_rows, n] elem
    std::string tactic;                    // empty: pick_tactic(rows_per_group_hint)
    double rows_per_group_hint = 1.0;
    int64_t rows_bound = 0;  // > 0: row_offsets[groups] <= rows_bound (sizes the grid)
  };
  // Enqueues on `stream` the tactic's kernel (no allocation, no host sync). Any row
  // distribution (all rows in one group, empty groups). Contract: row_offsets (int32
  // [groups + 1], device) non-decreasing, row_offsets[groups] <= max_rows; a, w, d and the
  // scales 16-byte aligned; `device` current. Errors: kNotFound (tactic), kInvalidArgument (null
  // or misaligned pointer), kCuda.
  Status run(const Call& call, const int32_t* row_offsets, cudaStream_t stream);

  const MxGroupedShape& shape() const;
  // Device bytes its tactics hold besides the caller's arrays (none: the GEMVs keep nothing).
  std::size_t workspace_bytes() const;

  // Host-only shape checks (also on machines without a GPU): ok, or kInvalidArgument /
  // kUnsupported naming the value.
  static Status validate(const MxGroupedShape& shape);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace moekit::gemm
