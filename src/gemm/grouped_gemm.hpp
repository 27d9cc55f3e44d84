// Grouped GEMM over experts on the device: D_g = A_g * B_g^T for each local expert g.
// Row counts live only in device memory (no host sync), so a forward can be graph-captured.
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "activation/activation_math.hpp"
#include "moekit/status.hpp"

namespace moekit::gemm {

enum class Elem : int { kBF16 = 1, kFP16 = 2 };

// Shape of one grouped GEMM, fixed when the layer is built.
//   A: [rows, k] row-major, the rows of group g are [row_offsets[g], row_offsets[g+1]).
//   B: [groups, n, k] row-major (expert weights, nn.Linear layout), group g at b + g*n*k.
//   D: [rows, n] row-major, rows as A.
struct GroupedShape {
  Elem elem = Elem::kBF16;
  int groups = 0;
  int64_t n = 0, k = 0;
  int64_t max_rows = 0;  // upper bound of row_offsets[groups]
};

// FC1's bias and gated activation applied in the GEMM's epilogue, on the fp32 accumulators,
// instead of storing FC1's output: D becomes [rows, n / 2]. B's rows (and the bias) must be in
// activation_math.hpp's blocked gate/up order; n a multiple of 16.
struct EpilogueActivation {
  activation::Params params;    // a gated kind
  const float* bias = nullptr;  // device [groups, n], or null
};

// A named tactic (schedule, tile, cluster), e.g. "sm90.coop.128x128x64.c1x1",
// "sm90.swapab.128x16x128.c1x1", "sm90.gemv.n8". Never numbered. The kernels that store D; each
// also exists as "<name>+act" on a GroupedGemm given an EpilogueActivation.
std::vector<std::string> tactic_names(Elem elem);

// The tokens' own rows in place of the gathered ones, for a decode step of 2 to kMaxTokenRows
// tokens: every expert multiplies all of them (the GEMV's 8 token columns cost the same however
// many of them an expert has) and stores a token's product at the row of each of its slots that
// routes there. The slots come from the kernel before (the permute), whose end the stores wait
// for; the rows are read from the start.
struct TokenRows {
  const void* rows = nullptr;            // [count, k] (the caller's hidden), 16-byte aligned
  int count = 0;                         // tokens, 2..kMaxTokenRows
  int top_k = 0;                         // slots per token
  const int32_t* slot_expert = nullptr;  // [count, top_k] group of each slot, -1: none
  const int32_t* slot_row = nullptr;     // [count, top_k] its row of `d`
};

// FC2 (the second GEMM of launch_chained) with each item's k split into `count` slices, so
// that the kernel's last items are shorter and its blocks end closer together: slice s sums
// k boxes [s K / count, (s + 1) K / count) of K and stores fp32 at partials [row][count][n]
// instead of writing `d`; finalize::run_slices adds the slices up in order. count 1: `d`.
struct KSlices {
  static constexpr int kBoxK = 64;  // k per box (sm90_gemv_tma.cu)
  // Boxes of kBoxK that cover k (what count may reach), and 64-row tiles that cover n rows.
  static constexpr int64_t boxes(int64_t k) { return (k + kBoxK - 1) / kBoxK; }
  float* partials = nullptr;
  int count = 1;
};

class GroupedGemm {
 public:
  // Allocates, once, every device array it needs (problem shapes, pointer and stride arrays,
  // CUTLASS workspaces for each tactic it may run). Throws Error: kInvalidArgument or
  // kUnsupported (shape; checked before any CUDA call), kUnsupported (not sm_90), kCuda.
  // Ends with a device synchronize (one-time copies done): build it outside any graph capture.
  // With `act`, every tactic is also built as a kernel that applies it, named "<tactic>+act"
  // (see applies_activation); pick_tactic then prefers those.
  GroupedGemm(const GroupedShape& shape, int device,
              const std::optional<EpilogueActivation>& act = std::nullopt);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // The tactic the heuristic picks for `tokens_hint` rows per group on average (host-known:
  // tokens * top_k / experts), and the one `run` will use when `tactic` is empty. `chained`:
  // the caller runs FC1 and FC2 in one kernel where both take the TMA GEMV (launch_chained),
  // which needs the same variant for both.
  std::string pick_tactic(double rows_per_group_hint, bool chained = false) const;

  // Whether FC1 (this GEMM) and FC2 pay to run chained (launch_chained) at one token that hits
  // `experts` of the groups: where FC1's decode GEMV blocks would take several items each
  // anyway. Below that, chaining splits each GEMM's one wave of items into dependent waves.
  bool chains_one_token(int64_t experts) const;

  // Every tactic this object built: tactic_names() plus the "+act" kernels.
  std::vector<std::string> tactics() const;

  // Whether `tactic` applies the EpilogueActivation given at construction: then `d` of run() is
  // [rows, n / 2] and holds the activation; otherwise it is [rows, n], FC1's raw output.
  bool applies_activation(const std::string& tactic) const;

  // The variant of `tactic` (a "+act" one) that reads A's rows by index (GemmCall::row_source)
  // instead of from a gathered matrix, where one is built and gathering pays (n at most
  // kMaxGatheringWidth); else empty.
  std::string gathering_tactic(const std::string& tactic) const;
  // Gathering copies A's rows once per column tile, where the gathered matrix costs one scatter
  // per row, so it pays on narrow GEMMs only. Forward A/B at T=4096 / 16384 (H200, 2026-12-02, one
  // H200 per call, 2-3 rounds): FC1 n 1536 (qwen3) -4.6 / -3.5%, 4096 (deepseek) -1.4 / -0.6%,
  // 5760 (gpt-oss) -0.3% / even, 28672 (mixtral) +1.3 / +1.0%.
  static constexpr int64_t kMaxGatheringWidth = 8192;

  // Whether `tactic`'s kernel reads row_offsets itself (the GEMV tactics): only those use
  // GemmCall::offsets_ready and offsets_flag; the CUTLASS ones read the per-group arrays that
  // write_problems() enqueues, after their PDL wait.
  bool reads_row_offsets(const std::string& tactic) const;
  // Whether `tactic`, chained, reads GemmCall::token_rows (FC1's TMA GEMV with its activation)
  // and that is measured faster than the gathered rows for this shape.
  bool token_rows_pay(const std::string& tactic) const;
  // FC2's k slices (KSlices) for launch_chained on FC1's `fc1_tactic` (this GEMM) and `fc2`, at
  // most rows_bound rows (GemmCall::rows_bound), with token rows or not: where FC2's items are
  // long and few per block, so that the kernel's last ones would leave blocks idle; else 1.
  int chained_k_slices(const std::string& fc1_tactic, const GroupedGemm& fc2, int64_t rows_bound,
                       bool token_rows) const;
  static constexpr int kMaxKSlices = 4;
  static constexpr int kMaxTokenRows = 8;  // the TMA GEMV's token columns

  // Enqueues on `stream`: a tiny kernel that writes per-group shapes and pointers from
  // row_offsets (int32 [groups + 1], device), then the GEMM. Correct for any row distribution
  // (all rows in one group, empty groups). No allocation, no host sync.
  // Contract: row_offsets is non-decreasing with row_offsets[groups] <= max_rows; `a` holds
  // max_rows rows (those past row_offsets[groups] may be read, never used); a, b, d are
  // 16-byte aligned; `device` is current. One run in flight per object (its per-group device
  // arrays are rewritten by each run): use one object per GEMM of the forward.
  // Errors: kNotFound (tactic not built), kInvalidArgument (null/misaligned pointer), kCuda.
  Status run(const void* a, const void* b, void* d, const int32_t* row_offsets,
             double rows_per_group_hint, cudaStream_t stream, const std::string& tactic = {});

  // run() in two steps, so that GEMMs reading the same row_offsets (a layer's FC1 and FC2) get
  // their per-group arrays from one small kernel: write_problems() for up to kMaxCallsPerWrite
  // calls, then launch() for each, in stream order. A call's tactic must be resolved
  // (pick_tactic). Same contract and errors as run(); `calls` may be on different objects.
  struct GemmCall {
    GroupedGemm* gemm = nullptr;
    const void* a = nullptr;
    const void* b = nullptr;
    void* d = nullptr;
    std::string tactic;
    // row_offsets are final before this kernel can start: written before the previous kernel
    // on the stream started (FC2 right after FC1), or by an earlier kernel that the previous
    // one waits for before it lets this one start (FC1 after the permute's gather kernel). The
    // GEMV then reads them, and starts on its first weight rows, before it waits for the
    // previous kernel (pipeline/pdl.cuh).
    bool offsets_ready = false;
    // Or null: row_offsets become final once *offsets_flag reads non-zero, set by a kernel that
    // runs while this one starts (the permute, permute::OffsetsFinal::kAtFlag). The GEMV waits
    // for it instead of the previous kernel before it reads them; other tactics ignore it.
    const uint32_t* offsets_flag = nullptr;
    // Or null: every row of `a` is this one row (device, [k], 16-byte aligned): one token sent
    // to each of its experts. The TMA GEMV then reads it instead of `a`, and as the kernel
    // before must neither write it nor read `d`, it waits for that kernel only for the offsets
    // (offsets_flag) and before it lets the next kernel start. Other tactics read `a`.
    const void* one_row = nullptr;
    // Or null: a counter, zero before the kernel starts (written by a kernel it waits for, or
    // before the flag), from which the TMA GEMV's blocks take their items one by one instead of
    // a fixed share each: blocks that start late or stream slowly take fewer. Other tactics
    // ignore it.
    int32_t* item_counter = nullptr;
    // Or 0: this run's rows are at most this many (the engine knows its token count, and the
    // shape's max_rows is its largest batch's). The decode GEMVs then launch a grid for at most
    // min(groups, rows_bound) live groups instead of max_rows'; others ignore it.
    int64_t rows_bound = 0;
    // Or null rows: `a` is not gathered; FC1's chained TMA GEMV (launch_chained only) reads the
    // tokens' own rows instead (see TokenRows).
    TokenRows token_rows;
    // FC2's k slices (launch_chained's second call only; see KSlices).
    KSlices k_slices;
    // Or null: `a` is the tokens' own rows, not gathered, and row r of A is row row_source[r]
    // of `a` (device, [max_rows]; entries of rows past row_offsets[groups] are not read).
    // Required by the gathering tactics (gathering_tactic), refused by the others.
    const int32_t* row_source = nullptr;
  };
  static constexpr int kMaxCallsPerWrite = 2;
  static Status write_problems(const GemmCall* calls, int count, const int32_t* row_offsets,
                               cudaStream_t stream);
  Status launch(const GemmCall& call, const int32_t* row_offsets, cudaStream_t stream);
  // `first` then `second` (which reads first's output: FC1 then FC2) as one kernel where their
  // tactics chain (Tactic::run_chained), else kUnsupported with nothing enqueued. `done`:
  // [groups + 1] int32, zero before the launch (the permute clears it). Same contract as
  // launch().
  static Status launch_chained(const GemmCall& first, const GemmCall& second,
                               const int32_t* row_offsets, int* done, cudaStream_t stream);

  // One token's FC1 (`fc1`, this GEMM's shape [2I, H] with its activation; one_row and
  // offsets_flag set) and FC2 (weights `w2`, [groups, H, I]) as one kernel, in slices of 64
  // activations, where the tactic can (runs_sliced); else kUnsupported with nothing enqueued.
  // Each slice's FC2 product goes to partials [rows][slices()][H] as fp32 (row: the expert's
  // row in row_offsets), which finalize::run_slices adds up. `next_item`: a counter, zero before
  // the launch. No write_problems() call is needed.
  static Status launch_sliced(const GemmCall& fc1, const void* w2, float* partials, int* next_item,
                              const int32_t* row_offsets, cudaStream_t stream);
  bool runs_sliced(const std::string& tactic) const;
  // The tactic one token's forward slices FC1 on (launch_sliced), measured faster than its
  // other paths; empty where none runs sliced (no activation, or a build without it).
  std::string sliced_tactic() const;
  // Activations per slice (the sliced kernel's width: sm90_gemv_tma.cu), and slices per
  // expert, ceil(I / kSliceActivations), which sizes the partials.
  static constexpr int kSliceActivations = 64;
  int64_t slices() const { return (shape().n / 2 + kSliceActivations - 1) / kSliceActivations; }

  // Device bytes this object allocated (per-group arrays, CUTLASS workspaces, strides).
  std::size_t workspace_bytes() const;

  const GroupedShape& shape() const;

 private:
  struct Slot;
  struct State;
  // Resolves the call's tactic and checks its operands; *skip: nothing to run (max_rows 0).
  Status check_call(const GemmCall& c, const int32_t* row_offsets, const Slot** slot,
                    bool* skip) const;
  std::unique_ptr<State> state_;
};

}  // namespace moekit::gemm
