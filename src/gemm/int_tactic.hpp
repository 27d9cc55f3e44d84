// Internal to src/gemm: the tactics of IntGroupedGemm (int_grouped_gemm.hpp), one compiled kernel
// configuration each, behind a small virtual interface, so that the CUTLASS translation units
// (one per activation type and weight width) and the GEMV stay independent of each other and of
// IntGroupedGemm. C++17.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gemm/int_grouped_gemm.hpp"
#include "moekit/status.hpp"

namespace moekit::gemm::int_detail {

// One run's operands, as every tactic takes them (IntGroupedGemm::Call after its checks).
struct IntProblem {
  const int32_t* row_offsets = nullptr;
  const void* a = nullptr;
  const uint8_t* w = nullptr;
  const float* scales = nullptr;
  const float* zeros = nullptr;  // GEMV only: the CUTLASS tactics leave them to the finish
  const float* bias = nullptr;   // GEMV only (likewise)
  void* d = nullptr;             // elem [rows, n]; fp32 for a CUTLASS tactic with fp32_out
  int64_t rows_bound = 0;        // > 0: at most this many rows (sizes the grid)
};

class IntTactic {
 public:
  virtual ~IntTactic() = default;
  // Allocates the tactic's own device memory and builds its launch state, once.
  virtual Status init(const IntGroupedShape& s, int device, int sm_count) = 0;
  // Enqueues the kernel(s). No allocation, no host sync (graph-capturable).
  virtual Status run(const IntProblem& p, cudaStream_t stream) = 0;
  virtual std::size_t workspace_bytes() const = 0;
};

struct IntTacticEntry {
  std::string name;
  bool gemv = false;      // writes D itself, bias and zero points included
  bool fp32_out = false;  // CUTLASS: stores fp32 D (IntGroupedGemm::Call::staging)
  std::unique_ptr<IntTactic> (*make)() = nullptr;
};

// One list per translation unit: the CUTLASS tactics of each (activation type, weight width),
// each with a D of the activation type and an fp32 one.
std::vector<IntTacticEntry> sm90_bf16_int4_group_tactics();
std::vector<IntTacticEntry> sm90_fp16_int4_group_tactics();
std::vector<IntTacticEntry> sm90_bf16_int8_group_tactics();
std::vector<IntTacticEntry> sm90_fp16_int8_group_tactics();
// The GEMV for `shape` (its element type, width and zero points): sm90_int_gemv.cu.
std::vector<IntTacticEntry> sm90_int_gemv_tactics(const IntGroupedShape& shape);
// The decoded-weight wgmma kernel (bf16 activations, k a multiple of 64; else none), any group
// size: sm90_int_wgmma.cu.
std::vector<IntTacticEntry> sm90_int_wgmma_tactics(const IntGroupedShape& shape);
// The streaming GEMV for groups of 32 (its element type, width and zero points):
// sm90_int_stream_gemv.cu.
std::vector<IntTacticEntry> sm90_int_stream_tactics(const IntGroupedShape& shape);

// The CUTLASS tactics' finish where staging is used: rows [0, row_offsets[groups]) of out (elem
// [rows, n]) = round(d32 + bias[g] + sum over groups gi of zeros[g, gi, :] * (sum of a's row
// over the columns of group gi)), each row's g from row_offsets; fp32, in that order. staging
// holds staging_floats(s): d32 [max_rows, n] (the GEMM's D), then with zero points the rows'
// group sums [max_rows, k / group] (a first kernel writes them). zeros and bias may each be
// null (not added). rows_bound > 0 bounds the rows (grid size); sm_count sizes the grid.
Status finish_int_gemm(const IntGroupedShape& s, const int32_t* row_offsets, float* staging,
                       const void* a, const float* zeros, const float* bias, void* out,
                       int64_t rows_bound, int sm_count, cudaStream_t stream);
// Floats of staging the finish needs for `s` (0 without zero points and bias).
std::size_t staging_floats(const IntGroupedShape& s);
// Loads the finish kernels for `s` (before any graph capture).
Status prepare_finish_int_gemm(const IntGroupedShape& s);

}  // namespace moekit::gemm::int_detail
