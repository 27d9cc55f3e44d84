// GroupedGemm: owns the per-group device arrays and one instance of every tactic built for its
// element type; writes the arrays on the device each run and launches the chosen tactic.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "gemm/grouped_gemm.hpp"
#include "common/cuda_status.hpp"
#include "gemm/pair_units.hpp"
#include "gemm/tactic.hpp"
#include "pipeline/pdl.cuh"

namespace moekit::gemm {
namespace detail {

Status cuda_status(cudaError_t err, const char* what, const std::string& context) {
  return moekit::cuda_status(err, context + ": " + what);
}

std::vector<TacticEntry> all_tactics(Elem elem) {
  std::vector<TacticEntry> v = sm90_gemv_tactics(elem);
  for (auto& e : sm90_gemv_tma_tactics(elem)) v.push_back(std::move(e));
  for (auto& e : elem == Elem::kBF16 ? sm90_bf16_bf16_tactics() : sm90_fp16_fp16_tactics())
    v.push_back(std::move(e));
  return v;
}

}  // namespace detail

namespace {

using detail::DeviceArrays;
using detail::RunArgs;
using detail::Tactic;
using detail::TacticContext;
using detail::TacticEntry;
using detail::TacticKind;

constexpr int kElemBytes = 2;  // bf16 and fp16

struct ProblemParams {
  const int32_t* row_offsets;
  int groups;
  int n, k;
  bool swap_ab;
  int64_t d_ld;  // elements per output row: n, or n / 2 behind the fused activation
  const char* a;
  const int32_t* row_source;  // or null: A's rows by index (kCutlassGather)
  const char* b;
  char* d;
  DeviceArrays arrays;
};

// The GEMMs whose arrays one launch writes (FC1's and FC2's share row_offsets).
struct ProblemBatch {
  ProblemParams jobs[GroupedGemm::kMaxCallsPerWrite];
  int count;
};

// One thread per group and GEMM (blockIdx.y): the CUTLASS problem shape, operand and output
// pointers of group g.
__global__ void write_problems_kernel(ProblemBatch batch) {
  pipeline::pdl_wait();  // the offsets come from the kernel before
  const ProblemParams& p = batch.jobs[blockIdx.y];
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.groups) return;
  const int64_t row0 = p.row_offsets[g];
  const int m = max(p.row_offsets[g + 1] - p.row_offsets[g], 0);
  const char* act = p.a + row0 * p.k * kElemBytes;
  const char* w = p.b + int64_t(g) * p.n * p.k * kElemBytes;
  int32_t* s = p.arrays.shapes + 3 * g;
  if (p.swap_ab) {
    s[0] = p.n;
    s[1] = m;
    p.arrays.ptr_a[g] = w;
    p.arrays.ptr_b[g] = act;
  } else {
    s[0] = m;
    s[1] = p.n;
    p.arrays.ptr_a[g] = p.row_source != nullptr ? p.a : act;
    p.arrays.ptr_b[g] = w;
    if (p.row_source != nullptr) p.arrays.row_src[g] = p.row_source + row0;
  }
  s[2] = p.k;
  p.arrays.ptr_d[g] = p.d + row0 * p.d_ld * kElemBytes;
}

const char* elem_name(Elem e) { return e == Elem::kBF16 ? "bf16" : "fp16"; }

// The gathering main loop keeps each source row's offset in 16-byte units in 32 bits; a source
// row is below max_rows.
bool gathered_offsets_fit(const GroupedShape& s) {
  return s.max_rows * s.k * kElemBytes / 16 < int64_t(UINT32_MAX);
}

std::string shape_text(const GroupedShape& s) {
  return std::string(s.elem == Elem::kBF16   ? "bf16"
                     : s.elem == Elem::kFP16 ? "fp16"
                                             : "?") +
         " grouped GEMM (groups " + std::to_string(s.groups) + ", n " + std::to_string(s.n) +
         ", k " + std::to_string(s.k) + ", max_rows " + std::to_string(s.max_rows) + ")";
}

// Host-only checks, before any CUDA call, so they also hold on machines without a GPU.
Status validate(const GroupedShape& s) {
  if (s.elem != Elem::kBF16 && s.elem != Elem::kFP16)
    return Status(ErrorCode::kInvalidArgument, "grouped GEMM element " +
                                                   std::to_string(static_cast<int>(s.elem)) +
                                                   " is neither bf16 nor fp16");
  if (s.groups < 1)
    return Status(ErrorCode::kInvalidArgument,
                  "grouped GEMM groups " + std::to_string(s.groups) + " must be at least 1");
  if (s.n < 1 || s.n > INT_MAX)
    return Status(ErrorCode::kInvalidArgument,
                  "grouped GEMM n " + std::to_string(s.n) + " must be in [1, 2^31)");
  if (s.k < 1 || s.k > INT_MAX)
    return Status(ErrorCode::kInvalidArgument,
                  "grouped GEMM k " + std::to_string(s.k) + " must be in [1, 2^31)");
  if (s.max_rows < 0 || s.max_rows > INT_MAX)
    return Status(ErrorCode::kInvalidArgument,
                  "grouped GEMM max_rows " + std::to_string(s.max_rows) + " must be in [0, 2^31)");
  // TMA and the GEMV's 16-byte loads need every row to start on a 16-byte boundary.
  if (s.n % 8 != 0)
    return Status(ErrorCode::kUnsupported,
                  "grouped GEMM n " + std::to_string(s.n) + " is not a multiple of 8");
  if (s.k % 8 != 0)
    return Status(ErrorCode::kUnsupported,
                  "grouped GEMM k " + std::to_string(s.k) + " is not a multiple of 8");
  return {};
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A checked call's arguments for its tactic.
RunArgs run_args(const GroupedGemm::GemmCall& c, const int32_t* row_offsets, cudaStream_t stream) {
  return RunArgs{c.a,
                 c.b,
                 c.d,
                 row_offsets,
                 stream,
                 c.offsets_ready,
                 c.offsets_flag,
                 c.one_row,
                 c.item_counter,
                 c.rows_bound,
                 c.token_rows,
                 c.k_slices};
}

}  // namespace

struct GroupedGemm::Slot {
  std::string name;
  TacticKind kind;
  bool applies_activation;
  std::unique_ptr<Tactic> tactic;
};

struct GroupedGemm::State {
  GroupedShape shape;
  std::optional<EpilogueActivation> act;
  int device = 0;
  int sm_count = 0;
  void* arrays_mem = nullptr;
  std::size_t arrays_bytes = 0;
  DeviceArrays arrays;
  std::vector<Slot> slots;

  ~State() {
    slots.clear();  // tactics free their memory first
    if (arrays_mem != nullptr) cudaFree(arrays_mem);
  }

  const Slot* find(const std::string& name) const {
    for (const auto& s : slots)
      if (s.name == name) return &s;
    return nullptr;
  }
};

std::vector<std::string> tactic_names(Elem elem) {
  std::vector<std::string> names;
  for (const auto& e : detail::all_tactics(elem))
    if (!e.applies_activation) names.push_back(e.name);
  return names;
}

GroupedGemm::GroupedGemm(const GroupedShape& shape, int device,
                         const std::optional<EpilogueActivation>& act)
    : state_(std::make_unique<State>()) {
  throw_if_error(validate(shape));
  const std::string what = shape_text(shape);
  if (act && !activation::is_gated(act->params.kind))
    throw Error(ErrorCode::kInvalidArgument,
                what + ": the epilogue activation (kind " +
                    std::to_string(static_cast<int>(act->params.kind)) + ") is not a gated one");
  if (act && shape.n % 16 != 0)
    throw Error(ErrorCode::kUnsupported, what + ": a fused gated activation needs n (" +
                                             std::to_string(shape.n) + ") to be a multiple of 16");
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) throw Error(detail::cuda_status(err, "cudaGetDeviceCount", what));
  if (device < 0 || device >= count)
    throw Error(ErrorCode::kInvalidArgument, what + ": device " + std::to_string(device) +
                                                 " is not one of the " + std::to_string(count) +
                                                 " visible devices");
  DeviceGuard guard(device);
  int major = 0, minor = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&state_->sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) throw Error(detail::cuda_status(err, "cudaDeviceGetAttribute", what));
  if (major != 9 || minor != 0)
    throw Error(ErrorCode::kUnsupported, what + ": device " + std::to_string(device) + " is sm_" +
                                             std::to_string(major) + std::to_string(minor) +
                                             ", these kernels are built for sm_90a only");

  State& st = *state_;
  st.shape = shape;
  st.act = act;
  st.device = device;
  const std::size_t g = static_cast<std::size_t>(shape.groups);
  const std::size_t shapes_bytes = (3 * sizeof(int32_t) * g + 15) / 16 * 16;
  st.arrays_bytes = shapes_bytes + 4 * sizeof(void*) * g;
  err = cudaMalloc(&st.arrays_mem, st.arrays_bytes);
  if (err != cudaSuccess) throw Error(detail::cuda_status(err, "cudaMalloc", what));
  char* base = static_cast<char*>(st.arrays_mem);
  st.arrays.shapes = reinterpret_cast<int32_t*>(base);
  st.arrays.ptr_a = reinterpret_cast<const void**>(base + shapes_bytes);
  st.arrays.ptr_b = st.arrays.ptr_a + g;
  st.arrays.ptr_d = reinterpret_cast<void**>(base + shapes_bytes + 2 * sizeof(void*) * g);
  st.arrays.row_src =
      reinterpret_cast<const int32_t**>(base + shapes_bytes + 3 * sizeof(void*) * g);
  // Zeroed so a tactic never sees garbage shapes, even before its first problem write.
  err = cudaMemset(st.arrays_mem, 0, st.arrays_bytes);
  if (err != cudaSuccess) throw Error(detail::cuda_status(err, "cudaMemset", what));

  // Load the problem kernel now, not lazily inside a graph capture.
  cudaFuncAttributes attr{};
  err = cudaFuncGetAttributes(&attr, write_problems_kernel);
  if (err != cudaSuccess) throw Error(detail::cuda_status(err, "cudaFuncGetAttributes", what));

  TacticContext ctx{shape, st.act ? &*st.act : nullptr, st.arrays, device, st.sm_count};
  for (auto& e : detail::all_tactics(shape.elem)) {
    if (e.applies_activation && !st.act) continue;  // "+act" kernels need the activation
    std::unique_ptr<Tactic> t = e.make();
    throw_if_error(t->init(ctx));
    st.slots.push_back({e.name, e.kind, e.applies_activation, std::move(t)});
  }
  err = cudaDeviceSynchronize();  // the init copies are done before the first run
  if (err != cudaSuccess) throw Error(detail::cuda_status(err, "cudaDeviceSynchronize", what));
}

GroupedGemm::~GroupedGemm() = default;

std::vector<std::string> GroupedGemm::tactics() const {
  std::vector<std::string> names;
  for (const auto& s : state_->slots) names.push_back(s.name);
  return names;
}

bool GroupedGemm::applies_activation(const std::string& tactic) const {
  const Slot* slot = state_->find(tactic);
  return slot != nullptr && slot->applies_activation;
}

std::string GroupedGemm::gathering_tactic(const std::string& tactic) const {
  // "<tile>+act" -> "<tile>.gather+act"; none past the row offsets check_call() refuses, so that
  // the caller keeps the gathered rows there instead of failing.
  const std::string act = "+act";
  const GroupedShape& sh = state_->shape;
  if (sh.n > kMaxGatheringWidth || !gathered_offsets_fit(sh) || tactic.size() <= act.size() ||
      tactic.compare(tactic.size() - act.size(), act.size(), act))
    return {};
  const std::string name = tactic.substr(0, tactic.size() - act.size()) + ".gather" + act;
  const Slot* slot = state_->find(name);
  return slot != nullptr && slot->kind == TacticKind::kCutlassGather ? name : std::string();
}

bool GroupedGemm::reads_row_offsets(const std::string& tactic) const {
  const Slot* slot = state_->find(tactic);
  return slot != nullptr && slot->kind == TacticKind::kGemv;
}

const GroupedShape& GroupedGemm::shape() const { return state_->shape; }

// An expert's weight matrix up to this size counts as small for pick_tactic().
constexpr double kSmallExpertBytes = 8e6;

namespace {
// The TMA GEMV's items (live expert, 64-row tile) per SM for `live` experts; tma64 runs 3
// blocks per SM, .s12 2.
double gemv_items_per_sm(const GroupedShape& sh, double live, int sm_count) {
  return live * std::ceil(sh.n / 64.0) / std::max(sm_count, 1);
}
}  // namespace

bool GroupedGemm::chains_one_token(int64_t experts) const {
  // Forward A/B, chained (FC1 reading the caller's row from the permute's flag) against two
  // launches (H200, 2026-12-01, one H200, 2 rounds): deepseek (FC1 3.9 items per SM) 178.5 against
  // 183.0 us; gpt-oss (2.7) 72.5 against 63.0, qwen3 (1.5) 40.5 against 34.0.
  return gemv_items_per_sm(state_->shape, static_cast<double>(experts), state_->sm_count) > 3.0;
}

bool GroupedGemm::token_rows_pay(const std::string& tactic) const {
  // Forward A/B at 2, 4 and 8 tokens against the gathered rows (H200, 2026-12-01, one H200 per
  // call, 2 rounds, chained kernel after the permute's end): qwen3 (FC1 6.3 MB per expert)
  // T=2 -1.0 to -1.55 us, T=4 -1.35 to -2.4, T=8 0 to -0.75. Larger experts (the .s12 chained
  // kernel) lose at 8 tokens: deepseek +6.5 to +8, gpt-oss +2.4 to +7 (with one PDL wait per
  // warp, and with or without the start at the flag); mixtral's T=4 gained 1.2 to 9 us, too
  // unsteady for a rule yet.
  const GroupedShape& sh = state_->shape;
  const Slot* slot = state_->find(tactic);
  return slot != nullptr && slot->tactic->reads_token_rows() &&
         static_cast<double>(sh.n) * sh.k * kElemBytes <= kSmallExpertBytes;
}

int GroupedGemm::chained_k_slices(const std::string& fc1_tactic, const GroupedGemm& fc2,
                                  int64_t rows_bound, bool token_rows) const {
  // Forward A/B at 2, 4 and 8 tokens, FC2 in 1, 2 and 3 slices (H200, 2026-12-02, one H200, 2
  // rounds): gpt-oss (45 k boxes, 45 row tiles per expert, 264 slots) T=2 112.6 -> 106.7 (2) ->
  // 104.8 us (3), T=4 188.0 -> 182.2 (2) / 183.5 (3), T=8 +1.2 / +1.9; deepseek (32 k boxes,
  // 112 tiles) T=2 even, T=4 +2.7, T=8 +7.7; qwen3 (12 k boxes) within 0.5 us. So: FC2's items
  // of 24 boxes or more, about 3 x slots over FC2's items (bound by rows_bound's experts).
  const Slot* slot = state_->find(fc1_tactic);
  const GroupedShape& s2 = fc2.state_->shape;
  const int64_t k_boxes = KSlices::boxes(s2.k);
  const int64_t slots = slot != nullptr ? slot->tactic->chained_slots(token_rows) : 0;
  const int64_t live = std::min<int64_t>(s2.groups, rows_bound > 0 ? rows_bound : s2.max_rows);
  const int64_t items = live * KSlices::boxes(s2.n);
  if (k_boxes < 24 || slots <= 0 || items <= 0) return 1;
  const int64_t want = (3 * slots + items - 1) / items;
  return static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxKSlices, k_boxes)));
}

std::string GroupedGemm::pick_tactic(double rows_per_group_hint, bool chained) const {
  const double h = std::isfinite(rows_per_group_hint) ? std::max(rows_per_group_hint, 0.0) : 0.0;
  const GroupedShape& sh = state_->shape;
  // Measured on an H200 (bench/gemm_sweep.cu over the FC1/FC2 shapes of qwen3-30b-a3b,
  // mixtral-8x7b, deepseek-v3 and gpt-oss-120b, random top-k routing; bench/results/). Each
  // choice lists fallbacks for builds that keep one tactic per family.
  //  - Up to ~1 row per expert (most experts empty, the rest one token) the weights of the
  //    hit experts are streamed once. The TMA GEMV (gemv.tma64) beats the register GEMV
  //    (gemv.n8) at every decode shape of the four presets (probe, H200, 2026-11-30: qwen3 FC1 at
  //    T=1 20.0 vs 21.1 us, deepseek FC2 68.8 vs 73.0, gpt-oss FC1 at T=8 271 vs 296). Against the
  //    swap-AB pipeline on streams over 256 MB (forward A/B, H200, 2026-11-30), it wins where the
  //    stream spreads over 4+ experts and stays under ~1 GB: qwen3 at T=8 (FC1 ~320 MB) 147.3
  //    -> 140.1 us, deepseek at T=1 (FC1 ~465 MB) 192.8 -> 189.0 on one machine, equal on
  //    another; not on mixtral's two experts at T=1 (+16 us, every block on the same two token
  //    rows), nor on deepseek's 1.7-3.3 GB at T=8 (+16 us), where swap-AB reads at the
  //    read-only stream rate (FC1 4.4 TB/s).
  //    Which TMA GEMV variant: see the .s12 rule below.
  //  - Up to 4 rows per expert where an expert's matrix is small (<= 8 MB: qwen3's FC1 6.3 MB
  //    and FC2 3.1 MB), the TMA GEMV again, with a chunk of 8 token rows per pass: the engine
  //    chains FC1 and FC2 in one kernel there (up to 64 tokens), and the swap-AB tiles' fixed
  //    cost per expert outweighs their single pass over the weights. Measured (H200, 2026-11-30,
  //    one H200, forward A/B): qwen3 T=32 268.3 -> 257.9 us, T=64 311.0 -> 299.9. Larger matrices
  //    lost: gpt-oss (33 / 17 MB) T=32 +11 us, T=64 +14; deepseek (29 / 15 MB) T=16 +8.5,
  //    T=64 +330 (a tile streams once per 8 rows of its expert); mixtral T=8 +16.
  //  - Up to ~2 rows per expert the 16-token swap-AB tile wastes least (mixtral at T=8, 2 rows:
  //    FC1+act 379.7 vs 386.3 us, FC2 227.0 vs 229.7 against the 32-token tile; qwen3 at T=8
  //    -1 us; deepseek and gpt-oss at T=64 within 0.3%).
  //  - Up to ~24 rows the swap-AB tile (weights as M, 32 tokens as N) reads each weight once;
  //    around 32 the 64-row ping-pong tile wastes least; past that the 128x256 tile wins.
  const double live = sh.groups * (1.0 - std::exp(-h));  // expected non-empty experts
  const double expert_bytes = static_cast<double>(sh.n) * sh.k * kElemBytes;
  const double stream_bytes = live * expert_bytes;
  const double items_per_sm = gemv_items_per_sm(sh, live, state_->sm_count);
  // tma64.s12 (12 stages, 2 blocks per SM) or tma64 (8 stages, 3 per SM). Forward A/Bs with
  // either forced everywhere (H200, 2026-12-01, L2 promotion 128 B, one H200, 2 rounds):
  //  - blocks taking several items (over 3 per SM: deepseek at T=1, FC1 3.8, FC2 6.7): .s12.
  //    Both on .s12 182.7 us, FC1 only 184.7, neither 192.5.
  //  - long items (64 rows of k > 2400) where .s12's grid takes them in no more waves: .s12.
  //    gpt-oss's FC2 at T=1 (1.3 per SM, 368 KB items): 63.6 against 65.0 on tma64.
  //    Short items stay on tma64: qwen3 at T=1 (FC1 1.4 per SM of 256 KB, FC2 1.9 of 96 KB)
  //    33.5 on tma64 against 34.9 on .s12. Under one item per SM tma64 (H200, 2026-11-30: mixtral's
  //    FC2 at T=1, 0.86 per SM, +0.9 on .s12).
  //  - chained: .s12 for large experts (gpt-oss T=8 358.0 against 361.5), tma64 for small ones
  //    (qwen3 T=8 even, T=64 +1.3 on .s12). One kernel variant serves FC1 and FC2, so both
  //    decide on the pair's bytes: an expert's FC1 + FC2 (FC1 gated: with `act` this is FC1,
  //    [2I, H]; else FC2, [H, I]), over 24 MB (qwen3 9.4 MB, gpt-oss 50, deepseek 88).
  const double pair_bytes = expert_bytes * (state_->act ? 1.5 : 3.0);
  const bool long_items = sh.k > 2400;
  const bool s12_fills_better =
      chained ? pair_bytes > 3 * kSmallExpertBytes
              : items_per_sm > 3.0 || (long_items && items_per_sm > 1.0 &&
                                       std::ceil(items_per_sm / 2) <= std::ceil(items_per_sm / 3));
  // Chained, the GEMV streams over 1 GB as well: deepseek at T=8 (FC1 ~1.7 GB) 953.5 against
  // 985.5 us on swap-AB (H200, 2026-12-01, forward A/B, 2 rounds).
  const bool decode_gemv =
      h <= 1.0 && (stream_bytes <= 256e6 || (live >= 4.0 && (chained || stream_bytes <= 1e9)));
  std::vector<const char*> names;
  if (decode_gemv && s12_fills_better)
    names = {"sm90.gemv.tma64.s12", "sm90.gemv.tma64", "sm90.gemv.n8"};
  else if (decode_gemv)
    names = {"sm90.gemv.tma64", "sm90.gemv.n8", "sm90.swapab.128x16x128.c1x1"};
  else if (h <= 1.0)
    names = {"sm90.swapab.128x16x128.c1x1", "sm90.gemv.tma64"};
  else if (h <= 4.0 && expert_bytes <= kSmallExpertBytes)
    names = {"sm90.gemv.tma64", "sm90.swapab.128x16x128.c1x1"};
  else if (h <= 2.5)
    names = {"sm90.swapab.128x16x128.c1x1", "sm90.swapab.128x32x128.c1x1"};
  else if (h <= 24)
    names = {"sm90.swapab.128x32x128.c1x1", "sm90.swapab.128x16x128.c1x1"};
  else if (h <= 48)
    names = {"sm90.pingpong.64x128x64.c1x1", "sm90.swapab.128x32x128.c1x1",
             "sm90.coop.128x128x64.c1x1"};
  else {
    // 2x1 cluster pairs (weights multicast to two row tiles of an expert) in a dynamic order,
    // FC1 (with its activation) and FC2 alike. Forward A/B against the dynamic 1x1 tile
    // (H200, 2026-12-01, static pairs, 3 rounds, T=16384 / 4096): qwen3 -0.5 / -1.3%, deepseek -1.2
    // / -1.6%, gpt-oss -0.6 / -0.8%, mixtral -0.4 / -1.6%. The dynamic order then took another
    // 0.8-2.6% off T=16384 on qwen3, mixtral and deepseek; gpt-oss was even (H200, 2026-12-01;
    // sm90_cluster_pairs.cuh). gpt-oss's FC2 (n 2880) had its own 128x192 dynamic-order tile
    // (H200, 2026-12-01: -0.9% against 256); pairs beat it by 0.9% at T=16384 and 1.4% at 4096 (3
    // rounds), 256 or 192 wide alike, so it takes these too.
    // The 240-wide pair tile where it pads fewer columns than 256 (gpt-oss's 5760 and 2880):
    // the 256-wide tile's narrow last column still fills a whole stage and runs whole MMAs.
    // gpt-oss at T=16384 (H200, 2026-12-03, three machines, 3 rounds each against main's binary):
    // -0.27 / -0.32 / -0.39% (5785 -> 5770, 5708 -> 5690, 5833 -> 5810 us); T=4096 even. The
    // gain is FC2's: with 240 for FC2 only -0.28%, for FC1 only +0.25% on the third machine.
    names = {"sm90.coop.128x256x64.c2x1.dyn.pairs", "sm90.coop.128x256x64.c1x1.dyn",
             "sm90.coop.128x256x64.c1x1", "sm90.coop.128x128x64.c1x1"};
    if (pair_tile_pads_less(sh.n, 240, 256))
      names.insert(names.begin(), "sm90.coop.128x240x64.c2x1.dyn.pairs");
  }
  // With an epilogue activation, FC1 takes the "+act" kernel of the same tile where one is built:
  // it saves the activation pass over FC1's output (bench/results).
  for (const char* n : names) {
    if (state_->act && state_->find(std::string(n) + "+act") != nullptr)
      return std::string(n) + "+act";
    if (state_->find(n) != nullptr) return n;
  }
  // Built in every configuration.
  return state_->act ? "sm90.coop.128x128x64.c1x1+act" : "sm90.coop.128x128x64.c1x1";
}

Status GroupedGemm::check_call(const GemmCall& c, const int32_t* row_offsets, const Slot** slot_out,
                               bool* skip) const {
  const State& st = *state_;
  const Slot* slot = st.find(c.tactic);
  if (slot == nullptr) {
    std::string known;
    for (const auto& s : st.slots) known += (known.empty() ? "" : ", ") + s.name;
    return Status(ErrorCode::kNotFound, "grouped GEMM tactic '" + c.tactic + "' is not built for " +
                                            elem_name(st.shape.elem) + " (built: " + known + ")");
  }
  *slot_out = slot;
  *skip = false;
  if (c.b == nullptr || row_offsets == nullptr)
    return Status(ErrorCode::kInvalidArgument,
                  shape_text(st.shape) + ": weights and row_offsets must not be null");
  if (st.shape.max_rows == 0) {  // every group is empty by contract
    *skip = true;
    return {};
  }
  if (c.a == nullptr || c.d == nullptr)
    return Status(ErrorCode::kInvalidArgument,
                  shape_text(st.shape) + ": activations and output must not be null");
  if (!aligned16(c.a) || !aligned16(c.b) || !aligned16(c.d))
    return Status(
        ErrorCode::kInvalidArgument,
        shape_text(st.shape) + ": activations, weights and output must be 16-byte aligned");
  if (!aligned16(c.one_row))
    return Status(ErrorCode::kInvalidArgument,
                  shape_text(st.shape) + ": the one activation row must be 16-byte aligned");
  const TokenRows& tr = c.token_rows;
  if (tr.rows != nullptr &&
      (!aligned16(tr.rows) || tr.count < 2 || tr.count > kMaxTokenRows || tr.top_k < 1 ||
       tr.slot_expert == nullptr || tr.slot_row == nullptr || c.one_row != nullptr))
    return Status(ErrorCode::kInvalidArgument,
                  shape_text(st.shape) + ": token rows (" + std::to_string(tr.count) +
                      " tokens, top_k " + std::to_string(tr.top_k) +
                      ") need 16-byte aligned rows, 2.." + std::to_string(kMaxTokenRows) +
                      " tokens, top_k >= 1, both slot arrays and no one_row");
  const KSlices& ks = c.k_slices;
  const int64_t k_boxes = KSlices::boxes(st.shape.k);
  if (ks.count < 1 || ks.count > k_boxes || (ks.count > 1 && !aligned16(ks.partials)) ||
      (ks.count > 1) != (ks.partials != nullptr))
    return Status(ErrorCode::kInvalidArgument,
                  shape_text(st.shape) + ": k slices " + std::to_string(ks.count) + " need 1.." +
                      std::to_string(k_boxes) +
                      " (k in boxes of 64), and 16-byte aligned partials exactly when above 1");
  if (c.rows_bound < 0)
    return Status(ErrorCode::kInvalidArgument, shape_text(st.shape) + ": rows_bound " +
                                                   std::to_string(c.rows_bound) + " is negative");
  const bool gathers = slot->kind == TacticKind::kCutlassGather;
  if (gathers && !gathered_offsets_fit(st.shape))
    return Status(ErrorCode::kUnsupported,
                  shape_text(st.shape) + ": tactic " + c.tactic +
                      " addresses its rows in 16-byte units below 2^32; max_rows x k is larger");
  if (gathers != (c.row_source != nullptr))
    return Status(ErrorCode::kInvalidArgument,
                  shape_text(st.shape) + ": tactic " + c.tactic +
                      (gathers ? " reads A's rows by index and needs row_source"
                               : " reads A's rows in order and takes no row_source"));
  return {};
}

Status GroupedGemm::write_problems(const GemmCall* calls, int count, const int32_t* row_offsets,
                                   cudaStream_t stream) {
  if (count < 0 || count > kMaxCallsPerWrite)
    return Status(ErrorCode::kInvalidArgument, "write_problems takes 0 to " +
                                                   std::to_string(kMaxCallsPerWrite) +
                                                   " calls, not " + std::to_string(count));
  ProblemBatch batch{};
  int groups = 0;
  for (int i = 0; i < count; ++i) {
    const GemmCall& c = calls[i];
    if (c.gemm == nullptr)
      return Status(ErrorCode::kInvalidArgument,
                    "write_problems: call " + std::to_string(i) + " names no GEMM");
    const Slot* slot = nullptr;
    bool skip = false;
    Status s = c.gemm->check_call(c, row_offsets, &slot, &skip);
    if (!s.ok()) return s;
    if (skip || slot->kind == TacticKind::kGemv) continue;  // the GEMV reads row_offsets itself
    const State& st = *c.gemm->state_;
    ProblemParams& p = batch.jobs[batch.count++];
    p.row_offsets = row_offsets;
    p.groups = st.shape.groups;
    p.n = static_cast<int>(st.shape.n);
    p.k = static_cast<int>(st.shape.k);
    p.swap_ab = slot->kind == TacticKind::kCutlassSwapAB;
    p.d_ld = slot->applies_activation ? st.shape.n / 2 : st.shape.n;
    p.a = static_cast<const char*>(c.a);
    p.row_source = c.row_source;
    p.b = static_cast<const char*>(c.b);
    p.d = static_cast<char*>(c.d);
    p.arrays = st.arrays;
    groups = std::max(groups, st.shape.groups);
  }
  if (batch.count == 0) return {};
  constexpr int kBlock = 128;
  const dim3 grid((groups + kBlock - 1) / kBlock, batch.count);
  const cudaError_t err =
      pipeline::launch_pdl(write_problems_kernel, grid, kBlock, 0, stream, batch);
  if (err != cudaSuccess)
    return detail::cuda_status(err, "write_problems_kernel launch",
                               shape_text(calls[0].gemm->state_->shape));
  return {};
}

Status GroupedGemm::launch(const GemmCall& call, const int32_t* row_offsets, cudaStream_t stream) {
  const Slot* slot = nullptr;
  bool skip = false;
  Status s = check_call(call, row_offsets, &slot, &skip);
  if (!s.ok() || skip) return s;
  if (call.token_rows.rows != nullptr)
    return Status(ErrorCode::kUnsupported,
                  "tactic " + call.tactic + ": token rows are read only chained (launch_chained)");
  if (call.k_slices.count != 1)
    return Status(ErrorCode::kUnsupported,
                  "tactic " + call.tactic + ": k slices are taken only chained, as FC2");
  return slot->tactic->run(run_args(call, row_offsets, stream));
}

Status GroupedGemm::launch_chained(const GemmCall& first, const GemmCall& second,
                                   const int32_t* row_offsets, int* done, cudaStream_t stream) {
  if (first.gemm == nullptr || second.gemm == nullptr)
    return Status(ErrorCode::kInvalidArgument, "launch_chained: a call names no GEMM");
  const GroupedShape& s1 = first.gemm->state_->shape;
  const GroupedShape& s2 = second.gemm->state_->shape;
  if (s1.groups != s2.groups || s1.max_rows != s2.max_rows)
    return Status(ErrorCode::kInvalidArgument, "launch_chained: " + shape_text(s1) + " and " +
                                                   shape_text(s2) + " differ in groups or rows");
  if (done == nullptr)
    return Status(ErrorCode::kInvalidArgument, "launch_chained: no done counters");
  const Slot* slot1 = nullptr;
  const Slot* slot2 = nullptr;
  bool skip1 = false, skip2 = false;
  Status s = first.gemm->check_call(first, row_offsets, &slot1, &skip1);
  if (s.ok()) s = second.gemm->check_call(second, row_offsets, &slot2, &skip2);
  if (!s.ok() || skip1 || skip2) return s;
  if (second.token_rows.rows != nullptr)
    return Status(ErrorCode::kInvalidArgument,
                  "launch_chained: token rows are read by the first GEMM only");
  if (first.k_slices.count != 1)
    return Status(ErrorCode::kInvalidArgument,
                  "launch_chained: k slices are taken by the second GEMM only");
  RunArgs a2 = run_args(second, row_offsets, stream);
  a2.offsets_ready = true;  // FC2's offsets are FC1's, read inside the one kernel
  a2.offsets_flag = nullptr;
  return slot1->tactic->run_chained(run_args(first, row_offsets, stream), *slot2->tactic, a2, done);
}

bool GroupedGemm::runs_sliced(const std::string& tactic) const {
  const Slot* slot = state_->find(tactic);
  return slot != nullptr && state_->act && slot->applies_activation && slot->tactic->runs_sliced();
}

std::string GroupedGemm::sliced_tactic() const {
  // Forward A/B at one token, slices of 64 on tma64 against what pick_tactic() runs there
  // (H200, 2026-12-01, one H200 per call, 2-3 rounds): qwen3 (tma64, FC1 6.3 MB per expert) 32.8 ->
  // 30.0 us, gpt-oss (tma64, 33 MB) 61.6 -> 59.0, mixtral (swap-AB, 235 MB) 183.2 -> 175.4,
  // deepseek (.s12, 59 MB) 177.8 -> 177.8. Sliced on .s12 instead: gpt-oss 62.2, mixtral 180.5,
  // deepseek 178.6.
  const std::string tactic = "sm90.gemv.tma64+act";
  return runs_sliced(tactic) ? tactic : std::string();
}

Status GroupedGemm::launch_sliced(const GemmCall& fc1, const void* w2, float* partials,
                                  int* next_item, const int32_t* row_offsets, cudaStream_t stream) {
  if (fc1.gemm == nullptr)
    return Status(ErrorCode::kInvalidArgument, "launch_sliced: the call names no GEMM");
  const Slot* slot = nullptr;
  bool skip = false;
  Status s = fc1.gemm->check_call(fc1, row_offsets, &slot, &skip);
  if (!s.ok() || skip) return s;
  if (w2 == nullptr || reinterpret_cast<std::uintptr_t>(w2) % 16 != 0)
    return Status(ErrorCode::kInvalidArgument,
                  "launch_sliced: FC2's weights are null or not 16-byte aligned");
  if (!fc1.gemm->runs_sliced(fc1.tactic))
    return Status(ErrorCode::kUnsupported, "tactic " + fc1.tactic + " does not run sliced");
  return slot->tactic->run_sliced(run_args(fc1, row_offsets, stream), w2, partials, next_item);
}

Status GroupedGemm::run(const void* a, const void* b, void* d, const int32_t* row_offsets,
                        double rows_per_group_hint, cudaStream_t stream,
                        const std::string& tactic) {
  const GemmCall call{this, a, b, d, tactic.empty() ? pick_tactic(rows_per_group_hint) : tactic};
  Status s = write_problems(&call, 1, row_offsets, stream);
  return s.ok() ? launch(call, row_offsets, stream) : s;
}

std::size_t GroupedGemm::workspace_bytes() const {
  std::size_t total = state_->arrays_bytes;
  for (const auto& s : state_->slots) total += s.tactic->workspace_bytes();
  return total;
}

}  // namespace moekit::gemm
