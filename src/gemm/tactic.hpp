// Internal to src/gemm: one tactic = one compiled kernel configuration, behind a small virtual
// interface so the CUTLASS translation units (one per arch and element pair) and the GEMV kernel
// stay independent of each other and of GroupedGemm. C++17.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gemm/grouped_gemm.hpp"
#include "moekit/status.hpp"

namespace moekit::gemm::detail {

// How a tactic wants its per-group arrays written before it runs.
enum class TacticKind : int {
  kCutlass = 0,        // problem (M_g, n, k), A = activations, B = weights, D row-major
  kCutlassSwapAB = 1,  // problem (n, M_g, k), A = weights, B = activations, D column-major
  kGemv = 2,           // needs no per-group arrays: reads row_offsets itself
  kCutlassGather = 3,  // as kCutlass, but A's rows by index: A = the caller's matrix for every
                       // group, row_src = each group's rows of GemmCall::row_source
};

// Device arrays owned by GroupedGemm, sized for `groups`; written on the device each run by the
// problem kernel, read by the CUTLASS kernels. Their addresses never change, so CUTLASS arguments
// are built once.
struct DeviceArrays {
  int32_t* shapes = nullptr;          // [groups][3]: (M, N, K) of CUTLASS's GroupProblemShape
  const void** ptr_a = nullptr;       // [groups]
  const void** ptr_b = nullptr;       // [groups]
  void** ptr_d = nullptr;             // [groups]
  const int32_t** row_src = nullptr;  // [groups]: kCutlassGather's source rows of each group
};

struct TacticContext {
  GroupedShape shape;
  const EpilogueActivation* act = nullptr;  // set for the activation variants
  DeviceArrays arrays;
  int device = 0;
  int sm_count = 0;
};

// What one run needs beyond what init() saw.
struct RunArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const int32_t* row_offsets = nullptr;
  cudaStream_t stream = nullptr;
  // row_offsets are final before this kernel can start, or once *offsets_flag reads non-zero
  // (see GemmCall).
  bool offsets_ready = false;
  const uint32_t* offsets_flag = nullptr;
  const void* one_row = nullptr;    // or null (see GemmCall)
  int32_t* item_counter = nullptr;  // or null (see GemmCall)
  int64_t rows_bound = 0;           // or 0 (see GemmCall)
  TokenRows token_rows;             // or null rows (see GemmCall)
  KSlices k_slices;                 // count 1: none (see GemmCall)
};

class Tactic {
 public:
  virtual ~Tactic() = default;
  // Allocates the tactic's own device memory and builds its launch state, once.
  virtual Status init(const TacticContext& ctx) = 0;
  // Enqueues the kernel. No allocation, no host sync (graph-capturable).
  virtual Status run(const RunArgs& args) = 0;
  // Enqueues this GEMM and `next` (which reads this one's output, on the same groups and
  // row_offsets) as one kernel, where the two tactics can: FC1's TMA GEMV with its activation,
  // then FC2's. `done` holds groups + 1 counters, zero before the kernel. Otherwise
  // kUnsupported, and nothing is enqueued.
  virtual Status run_chained(const RunArgs& args, Tactic& next, const RunArgs& next_args,
                             int* done) {
    (void)args, (void)next, (void)next_args, (void)done;
    return Status(ErrorCode::kUnsupported, "the tactic runs alone");
  }
  // One token's FC1 (this tactic, with its activation, reading RunArgs::one_row from the
  // permute's flag on) and FC2 (weights `w2`, [groups, k, n / 2]) as one kernel in slices of the
  // intermediate, each slice's FC2 product stored as fp32 partials[row][slice][k] (slices:
  // GroupedGemm::slices(), the one place the slice width lives) for finalize::run_slices.
  // `next_item`: a counter, zero before the kernel. Otherwise kUnsupported, and nothing is
  // enqueued.
  virtual Status run_sliced(const RunArgs& args, const void* w2, float* partials, int* next_item) {
    (void)args, (void)w2, (void)partials, (void)next_item;
    return Status(ErrorCode::kUnsupported, "the tactic does not run sliced");
  }
  virtual bool runs_sliced() const { return false; }
  virtual std::size_t workspace_bytes() const = 0;
  // Whether run_chained reads RunArgs::token_rows (GemmCall::token_rows).
  virtual bool reads_token_rows() const { return false; }
  // The chained kernel's blocks that fit on the device at once (its grid's bound), with token
  // rows or not; 0 where the tactic does not chain.
  virtual int64_t chained_slots(bool token_rows) const {
    (void)token_rows;
    return 0;
  }
};

struct TacticEntry {
  std::string name;
  TacticKind kind = TacticKind::kCutlass;
  bool applies_activation = false;  // FC1's fused bias + activation, output [rows, n / 2]
  std::unique_ptr<Tactic> (*make)() = nullptr;
};

// Adds a tactic's two entries: the kernel that stores D under `name`, and FC1's fused-activation
// kernel under "<name>+act" (GroupedGemm builds it only when given an EpilogueActivation).
inline void add_store_and_act(std::vector<TacticEntry>& v, const std::string& name, TacticKind kind,
                              std::unique_ptr<Tactic> (*make_store)(),
                              std::unique_ptr<Tactic> (*make_act)()) {
  v.push_back(TacticEntry{name, kind, false, make_store});
  v.push_back(TacticEntry{name + "+act", kind, true, make_act});
}

// One list per translation unit.
std::vector<TacticEntry> sm90_bf16_bf16_tactics();
std::vector<TacticEntry> sm90_fp16_fp16_tactics();
std::vector<TacticEntry> sm90_gemv_tactics(Elem elem);
std::vector<TacticEntry> sm90_gemv_tma_tactics(Elem elem);
// All of the above for `elem`, GEMV tactics first.
std::vector<TacticEntry> all_tactics(Elem elem);

// "cuda call failed" sentence with the call's name and the CUDA error string.
Status cuda_status(cudaError_t err, const char* what, const std::string& context);

}  // namespace moekit::gemm::detail
