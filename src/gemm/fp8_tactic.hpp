// Internal to src/gemm: the tactics of Fp8GroupedGemm (fp8_grouped_gemm.hpp), one compiled
// kernel configuration each, behind a small virtual interface, so that the CUTLASS translation
// unit (sm90_fp8_fp8_block128.cu) and any kernel of our own stay independent of each other.
// C++17.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gemm/fp8_grouped_gemm.hpp"
#include "moekit/status.hpp"

namespace moekit::gemm::fp8_detail {

// One run's operands, as every tactic takes them (Fp8GroupedGemm::Call after its checks).
struct Fp8Problem {
  const int32_t* row_offsets;
  int groups;
  int n, k;
  const uint8_t* a;       // e4m3 [max_rows, k]
  const float* a_scales;  // [max_rows, k / 128]
  const uint8_t* w;       // e4m3 [groups, n, k]
  const float* w_scales;  // [groups, n / 128, k / 128]
  char* d;                // bf16 or fp32 [max_rows, n]
};

class Fp8Tactic {
 public:
  virtual ~Fp8Tactic() = default;
  // Allocates the tactic's own device memory and builds its launch state, once.
  virtual Status init(const Fp8GroupedShape& s, int device, int sm_count) = 0;
  // Enqueues the kernel(s). No allocation, no host sync (graph-capturable).
  virtual Status run(const Fp8Problem& p, cudaStream_t stream) = 0;
  virtual std::size_t workspace_bytes() const = 0;
};

struct Fp8TacticEntry {
  std::string name;
  bool fp32_out = false;
  std::unique_ptr<Fp8Tactic> (*make)() = nullptr;
};

// The decode GEMV's tactics (sm90_fp8_gemv_tma.cu): a bf16 D and an fp32 one.
std::vector<Fp8TacticEntry> sm90_fp8_gemv_tactics();

}  // namespace moekit::gemm::fp8_detail
