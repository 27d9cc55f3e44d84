// Internal to src/gemm: the tactics of MxGroupedGemm (mx_grouped_gemm.hpp) behind a small
// virtual interface, so that the GEMV (sm90_mx_gemv.cu) and the tensor-core tactic
// (sm90_mx_wgmma.cu) stay independent of each other and of MxGroupedGemm. C++17.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gemm/mx_grouped_gemm.hpp"
#include "moekit/status.hpp"

namespace moekit::gemm::mx_detail {

// One run's operands, as every tactic takes them (MxGroupedGemm::Call after its checks).
struct MxProblem {
  const int32_t* row_offsets = nullptr;
  const void* a = nullptr;
  const uint8_t* w = nullptr;
  const uint8_t* scales = nullptr;
  const float* global_scales = nullptr;  // kNVFP4 only
  const float* bias = nullptr;           // or null
  void* d = nullptr;                     // elem [rows, n]
  int64_t rows_bound = 0;                // > 0: at most this many rows (sizes the grid)
};

class MxTactic {
 public:
  virtual ~MxTactic() = default;
  // Loads the kernel and builds its launch state, once.
  virtual Status init(const MxGroupedShape& s, int sm_count) = 0;
  // Enqueues the kernel. No allocation, no host sync (graph-capturable).
  virtual Status run(const MxProblem& p, cudaStream_t stream) = 0;
};

struct MxTacticEntry {
  std::string name;
  std::unique_ptr<MxTactic> (*make)() = nullptr;
};

// The GEMVs for `shape` (its element type and format): sm90_mx_gemv.cu.
std::vector<MxTacticEntry> sm90_mx_gemv_tactics(const MxGroupedShape& shape);
// The tensor-core tactics (bf16 activations, k a multiple of 64; else none): sm90_mx_wgmma.cu.
std::vector<MxTacticEntry> sm90_mx_wgmma_tactics(const MxGroupedShape& shape);

}  // namespace moekit::gemm::mx_detail
