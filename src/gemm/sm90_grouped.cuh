// CUTLASS 4.2 Hopper warp-specialized ptr-array grouped GEMM tactics, shared by the per-element
// translation units (sm90_bf16_bf16.cu, sm90_fp16_fp16.cu), which each instantiate the list once.
//
// Normal tactics compute D_g[M_g, n] = A_g[M_g, k] * W_g[n, k]^T with A row-major (K-major) and
// W read as a column-major [k, n] operand (also K-major), D row-major.
// Swap-AB tactics compute D_g^T[n, M_g] = W_g[n, k] * A_g^T: the weights fill the 128-row M tile
// and the few tokens of an expert a small N tile (16 or 32), which is what decode needs; D^T
// column-major is D row-major, so the caller sees the same output.
//
// Graph safety (checked in CUTLASS 4.2's source): problem shapes are passed only as a device
// array (host shapes nullptr), so can_implement / get_workspace_size / to_underlying_arguments
// never read them; the TMA descriptors built on the host are placeholders replaced on the device
// per group. GemmUniversalAdapter::initialize sets the smem attribute and fills Params once;
// run(stream) then only computes the (sm_count-sized persistent) grid from Params and launches.
// The arrays the Params point at keep their addresses; only their contents change per run.
#pragma once
// cute's wgmma shapes whose N is not a multiple of 32 (the 128x240 pair tile's m64n240k16); this
// must precede every cute include of the translation unit.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "gemm/cutlass_setup.cuh"
#include "gemm/sm90_cluster_pairs.cuh"
#include "gemm/sm90_dynamic_scheduler.cuh"
#include "gemm/sm90_epilogues.cuh"
#include "gemm/tactic.hpp"

namespace moekit::gemm::detail {

enum class Sched { kCoop, kPingpong };

// A tactic's configuration: schedule, tile, cluster; one kernel instantiation per (Element,
// TacticCfg). The name, built from the parameters, is the stable identity:
// "sm90.<coop|pingpong|swapab>.<M>x<N>x<K>.c<CM>x<CN>[.dyn|.pairs]". The grouped scheduler runs
// with CUTLASS's defaults (raster along M; its swizzle is always 1 for grouped problems, because
// it linearises every group's tiles first). Rasterising along N was measured: faster on one shape
// only (bench/results/2026-11-30-h200-8641c10.md). ".dyn" tactics draw their tiles after the
// first from a counter instead (sm90_dynamic_scheduler.cuh); ".pairs" ones run 2x1 clusters that
// multicast an expert's weights to two of its row tiles without rounding its row tiles up to the
// cluster (sm90_cluster_pairs.cuh); ".gather" pairs read A's rows by index from the caller's
// matrix (Sm90PairGatherMainloop).
// EpiN: the width of the store epilogue's subtiles (0: CUTLASS's choice, 32 for these tiles).
// Each subtile costs both warp groups two named barriers and a TMA store while the tensor cores
// idle; 64 halves their count per tile (4 of 128x64, 32 KB of shared memory, the 128x256 tile
// keeps its 4 main-loop stages). Forward A/B with FC2 on the dynamic 128x256 tile (H200,
// 2026-12-01, 3 rounds): T=16384 qwen3 -0.4%, deepseek -0.7%, gpt-oss -0.2%, mixtral -0.1%; T=4096
// qwen3 -1.4%, gpt-oss -0.6%, deepseek +0.5%, mixtral even. 128 (3 stages) gained less. A subtile
// is not part of the name: the activation epilogue ignores it, and it does not change the result.
// The pairs store through their own epilogue (Sm90PairStoreEpilogue) and take none.
template <int M, int N, int K, Sched S, bool SwapAB = false, int CM = 1, int CN = 1,
          bool Dynamic = false, int EpiN = 0, bool Pairs = false, bool Gather = false>
struct TacticCfg {
  static constexpr bool kDynamic = Dynamic;
  static constexpr bool kPairs = Pairs;
  static constexpr bool kGather = Gather;
  static_assert(!Gather || Pairs, "A's rows are gathered by the pairs' main loop only");
  static_assert(!Pairs || (CM == 2 && CN == 1 && Dynamic && !SwapAB && S == Sched::kCoop),
                "pairs are cooperative 2x1 clusters in their own dynamic tile order");
  static_assert(N % (EpiN > 0 ? EpiN : 1) == 0, "store subtiles split the tile's columns evenly");
  static_assert(!Pairs || EpiN == 0, "the pairs' store epilogue has no subtiles");
  // "swapab" names the cooperative schedule; a swap-AB ping-pong would need its own word.
  static_assert(!SwapAB || S == Sched::kCoop, "no name for a swap-AB ping-pong tactic");
  static constexpr bool kSwapAB = SwapAB;
  static constexpr int kTileM = M, kTileN = N;
  static constexpr Sched kSched = S;
  using Tile = cute::Shape<cute::Int<M>, cute::Int<N>, cute::Int<K>>;
  using Cluster = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  using EpilogueTile =
      std::conditional_t<EpiN == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                         cute::Shape<cute::Int<M>, cute::Int<EpiN>>>;
  using Mainloop = std::conditional_t<S == Sched::kCoop,
                                      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  using Epilogue = std::conditional_t<S == Sched::kCoop,
                                      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                                      cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

  static std::string name() {
    const char* sched = SwapAB ? "swapab" : (S == Sched::kCoop ? "coop" : "pingpong");
    return std::string("sm90.") + sched + "." + std::to_string(M) + "x" + std::to_string(N) + "x" +
           std::to_string(K) + ".c" + std::to_string(CM) + "x" + std::to_string(CN) +
           (Dynamic ? ".dyn" : "") + (Pairs ? ".pairs" : "") + (Gather ? ".gather" : "");
  }
};

// kAct: FC1's epilogue applies bias and gated activation (sm90_epilogues.cuh; the kinds of
// kKinds) and stores [rows, n / 2]; otherwise D = accumulators, through the pair tiles' own store
// epilogue (sm90_epilogues.cuh) or CUTLASS's TMA-store epilogue.
template <class Element, class Cfg, bool kAct, ActKinds kKinds = ActKinds::kAll>
struct Sm90GroupedKernel {
  using ProblemShape = std::conditional_t<
      Cfg::kPairs, PairGroupProblemShape,
      std::conditional_t<Cfg::kDynamic, DynamicGroupProblemShape,
                         cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>>>;
  // Both operands are K-major in both modes; only who is A and the layout of D change.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD =
      std::conditional_t<Cfg::kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA rows

  // C is void: D = 1 * acc, nothing is read back.
  using StoreEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile,
      typename Cfg::Cluster, typename Cfg::EpilogueTile, float, float, void, LayoutD*, kAlign,
      Element, LayoutD*, kAlign, typename Cfg::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<Element, float>>::CollectiveOp;
  using ActEpilogue = Sm90ActEpilogue<Element, Cfg::kSwapAB, Cfg::kTileM, Cfg::kTileN,
                                      Cfg::kSched == Sched::kCoop && !Cfg::kSwapAB, kKinds>;
  using CollectiveEpilogue = std::conditional_t<
      kAct, ActEpilogue,
      std::conditional_t<Cfg::kPairs, Sm90PairStoreEpilogue<Element, Cfg::kTileM, Cfg::kTileN>,
                         StoreEpilogue>>;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element,
      LayoutB*, kAlign, float, typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::Mainloop>::CollectiveOp;
  using CollectiveMainloop = std::conditional_t<
      Cfg::kGather, Sm90PairGatherMainloop<BuiltMainloop>,
      std::conditional_t<Cfg::kPairs, Sm90PairMainloop<BuiltMainloop>, BuiltMainloop>>;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  // sm_90's opt-in shared memory per block; initialize() would fail at run time above it.
  static_assert(sizeof(typename Kernel::SharedStorage) <= 232448, "shared memory over 227 KB");

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  // The problem kernel writes shapes as 3 packed int32 per group.
  static_assert(sizeof(typename ProblemShape::UnderlyingProblemShape) == 3 * sizeof(int32_t));
};

template <class Element, class Cfg, bool kAct, ActKinds kKinds = ActKinds::kAll>
class Sm90GroupedTactic final : public Tactic {
  using K = Sm90GroupedKernel<Element, Cfg, kAct, kKinds>;

 public:
  Status init(const TacticContext& ctx) override {
    c_.name = "tactic " + Cfg::name() + (kAct ? " with activation" : "") + " (groups " +
              std::to_string(ctx.shape.groups) + ", n " + std::to_string(ctx.shape.n) + ", k " +
              std::to_string(ctx.shape.k) + ")";
    const std::string& what = c_.name;
    const int groups = ctx.shape.groups;
    const int n = static_cast<int>(ctx.shape.n), k = static_cast<int>(ctx.shape.k);
    // Strides do not depend on M_g (packed, K-major operands; D's leading dimension is n), so
    // they are written once here rather than per run.
    typename K::StrideA sa;
    typename K::StrideB sb;
    typename K::StrideD sd;
    if constexpr (Cfg::kSwapAB) {
      sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, k, 1});  // weights [n, k]
      sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, {1, k, 1});  // tokens, ld k
      sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, 1, 1});  // D^T, ld n
    } else {
      sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, {1, k, 1});
      sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, {n, k, 1});
      sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, {1, n, 1});
    }
    const std::size_t o_sa = c_.arena.take(sizeof(sa) * groups);
    const std::size_t o_sb = c_.arena.take(sizeof(sb) * groups);
    const std::size_t o_sd = c_.arena.take(sizeof(sd) * groups);
    Status status = c_.arena.allocate(what);
    if (status.ok()) status = c_.arena.fill(o_sa, sa, groups, what);
    if (status.ok()) status = c_.arena.fill(o_sb, sb, groups, what);
    if (status.ok()) status = c_.arena.fill(o_sd, sd, groups, what);
    if (!status.ok()) return status;
    auto* d_sa = reinterpret_cast<typename K::StrideA*>(c_.arena.at(o_sa));
    auto* d_sb = reinterpret_cast<typename K::StrideB*>(c_.arena.at(o_sb));
    auto* d_sd = reinterpret_cast<typename K::StrideD*>(c_.arena.at(o_sd));

    using ElementPtr = const typename K::Gemm::ElementA**;
    using UnderShape = typename K::ProblemShape::UnderlyingProblemShape;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = ctx.device;
    hw.sm_count = ctx.sm_count;

    typename K::Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape.num_groups = groups;
    args.problem_shape.problem_shapes = reinterpret_cast<UnderShape*>(ctx.arrays.shapes);
    args.problem_shape.host_problem_shapes = nullptr;
    args.mainloop.ptr_A = reinterpret_cast<ElementPtr>(ctx.arrays.ptr_a);
    args.mainloop.dA = d_sa;
    args.mainloop.ptr_B = reinterpret_cast<const typename K::Gemm::ElementB**>(ctx.arrays.ptr_b);
    args.mainloop.dB = d_sb;
    if constexpr (Cfg::kGather) args.mainloop.row_src = ctx.arrays.row_src;
    if constexpr (kAct) {
      if (ctx.act == nullptr)
        return Status(ErrorCode::kInternal, what + ": built without an activation to apply");
      args.epilogue.ptr_out = reinterpret_cast<typename K::Gemm::ElementD**>(ctx.arrays.ptr_d);
      args.epilogue.bias = ctx.act->bias;
      args.epilogue.bias_ld = n;
      args.epilogue.out_ld = n / 2;
      args.epilogue.act = ctx.act->params;
    } else if constexpr (Cfg::kPairs) {
      args.epilogue.ptr_out = reinterpret_cast<typename K::Gemm::ElementD**>(ctx.arrays.ptr_d);
      args.epilogue.out_ld = n;
    } else {
      args.epilogue.thread.alpha = 1.0f;
      args.epilogue.thread.beta = 0.0f;
      args.epilogue.ptr_C = nullptr;
      args.epilogue.dC = nullptr;
      args.epilogue.ptr_D = reinterpret_cast<typename K::Gemm::ElementD**>(ctx.arrays.ptr_d);
      args.epilogue.dD = d_sd;
    }
    args.hw_info = hw;
    if (status = c_.initialize(args); !status.ok()) return status;
    // The dynamic scheduler's counters are cleared on the legacy stream (initialize_workspace).
    if constexpr (Cfg::kDynamic) {
      const cudaError_t err = cudaStreamSynchronize(nullptr);
      if (err != cudaSuccess) return cuda_status(err, "cudaStreamSynchronize(workspace)", what);
    }
    return {};
  }

  // The per-group arrays were written by GroupedGemm's problem kernel.
  Status run(const RunArgs& a) override { return c_.run_gemm(a.stream); }

  std::size_t workspace_bytes() const override { return c_.workspace_bytes(); }

 private:
  CutlassGrouped<typename K::Gemm> c_;
};

// A pair tile's "+act" kernel: two kernels, one per family of kinds (ActKinds), of which init()
// builds the one holding the layer's kind.
template <class Element, class Cfg>
class Sm90PairActTactic final : public Tactic {
  static_assert(Cfg::kPairs);

 public:
  Status init(const TacticContext& ctx) override {
    if (ctx.act != nullptr && act_kinds_hold(ActKinds::kClamped, ctx.act->params.kind))
      kernel_ = std::make_unique<Sm90GroupedTactic<Element, Cfg, true, ActKinds::kClamped>>();
    else
      kernel_ = std::make_unique<Sm90GroupedTactic<Element, Cfg, true, ActKinds::kUnclamped>>();
    return kernel_->init(ctx);
  }
  Status run(const RunArgs& a) override { return kernel_->run(a); }
  std::size_t workspace_bytes() const override { return kernel_->workspace_bytes(); }

 private:
  std::unique_ptr<Tactic> kernel_;
};

// The "+act" kernel of tactic Cfg: the pair tiles' by kind family, the others' with every kind.
template <class Element, class Cfg>
std::unique_ptr<Tactic> make_act_tactic() {
  if constexpr (Cfg::kPairs)
    return std::make_unique<Sm90PairActTactic<Element, Cfg>>();
  else
    return std::make_unique<Sm90GroupedTactic<Element, Cfg, true>>();
}

// A gathering tactic serves FC1 only, with its activation: its "+act" kernel alone.
template <class Element, class Cfg>
void add_gather_tactic(std::vector<TacticEntry>& v) {
  static_assert(Cfg::kGather);
  v.push_back(TacticEntry{Cfg::name() + "+act", TacticKind::kCutlassGather, true,
                          make_act_tactic<Element, Cfg>});
}

template <class Element, class Cfg>
void add_tactic(std::vector<TacticEntry>& v) {
  add_store_and_act(
      v, Cfg::name(), Cfg::kSwapAB ? TacticKind::kCutlassSwapAB : TacticKind::kCutlass,
      []() -> std::unique_ptr<Tactic> {
        return std::make_unique<Sm90GroupedTactic<Element, Cfg, false>>();
      },
      make_act_tactic<Element, Cfg>);
}

// The tactic list, shared by every element pair. MOEKIT_ONE_TACTIC keeps the prefill pick (the
// pair tile, and its gathering FC1), the 128x128 tile every pick falls back to and one swap-AB
// tile, so CI compiles fast.
template <class Element>
std::vector<TacticEntry> sm90_grouped_tactics() {
  using S = Sched;
  std::vector<TacticEntry> v;
  add_tactic<Element, TacticCfg<128, 128, 64, S::kCoop>>(v);
  add_tactic<Element, TacticCfg<128, 16, 128, S::kCoop, true>>(v);
  add_tactic<Element, TacticCfg<128, 256, 64, S::kCoop, false, 2, 1, true, 0, true>>(v);
  add_gather_tactic<Element, TacticCfg<128, 256, 64, S::kCoop, false, 2, 1, true, 0, true, true>>(
      v);
#if !defined(MOEKIT_ONE_TACTIC)
  // The pair tile 240 wide, for widths it divides and 256 does not (gpt-oss: FC1 5760 = 24 x 240,
  // FC2 2880 = 12 x 240), where the 256-wide tile's last column tile holds 128 or 64 of its 256
  // columns but still moves a whole weight tile into shared memory (pick_tactic).
  add_tactic<Element, TacticCfg<128, 240, 64, S::kCoop, false, 2, 1, true, 0, true>>(v);
  add_gather_tactic<Element, TacticCfg<128, 240, 64, S::kCoop, false, 2, 1, true, 0, true, true>>(
      v);
  add_tactic<Element, TacticCfg<128, 256, 64, S::kCoop, false, 1, 1, true, 64>>(v);
  add_tactic<Element, TacticCfg<128, 256, 64, S::kCoop>>(v);
  add_tactic<Element, TacticCfg<64, 128, 64, S::kPingpong>>(v);
  add_tactic<Element, TacticCfg<128, 32, 128, S::kCoop, true>>(v);
  // Ping-pong 128x128 and 64x256 (one warp group's epilogue overlapping the other's main loop)
  // were measured for FC1 with the fused activation: slower than coop 128x256 at T=16384 on
  // every preset, mixed at T=4096 (bench/results/2026-11-30-h200-73da6b5.md); not built.
  // A 128x192 tile (it divides gpt-oss's 5760) won gpt-oss FC1 in isolation but lost 1-2% of
  // the full forward in an A/B in one process (bench/results/2026-11-30-h200-8641c10.md). Its
  // dynamic-order form served gpt-oss's FC2 (n 2880) from 2026-12-01 until the pair tiles beat
  // it by ~1% in the forward (H200, 2026-12-01); no longer built.
#endif
  return v;
}

}  // namespace moekit::gemm::detail
