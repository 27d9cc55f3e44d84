// Our epilogues for the CUTLASS 4.2 ptr-array kernels, written from the accumulators in
// registers (one class, Sm90EpilogueOp; kGated picks which):
//  - FC1's fused epilogue (Sm90ActEpilogue): the FC1 bias and the gated activation of
//    activation_math.hpp applied to the fp32 accumulators, rounded once and stored as
//    [rows, n / 2]. It replaces the activation pass, which read FC1's whole output back and wrote
//    the activation's (mixtral at T=16384: 1.9 GB read, 0.9 GB written, ~0.7 ms); FC1's own store
//    also halves.
//  - The pair tiles' plain store (Sm90PairStoreEpilogue, FC2 at prefill): the accumulators
//    rounded and stored as [rows, n]. It replaced CUTLASS's TMA-store epilogue, whose subtiles
//    meet both warp groups at named barriers (below, why that matters).
//
// Pairing: FC1's rows are in activation_math.hpp's blocked order (8 gate rows, then their 8
// up rows). A wgmma accumulator fragment ((2, 2, V), MMA_M, MMA_N) gives a thread, per 8-column
// group v, columns 8v + 2 (lane % 4) + {0, 1} of rows r and r + 8. So:
//  - normal tactics (features along N): the gate at column c (c % 16 < 8, v even) and its up at
//    c + 8 are entries (i, j, v) and (i, j, v + 1); the two columns i = 0, 1 are two adjacent
//    outputs, stored as one 4-byte word (the plain store: entries (0, j, v) and (1, j, v));
//  - swap-AB tactics (features along M): the gate at row r (r % 16 < 8) and its up at r + 8 are
//    entries (i, 0, v) and (i, 1, v); i picks one of two tokens.
// Stores: cooperative tactics (both warp groups on one tile) stage the tile's outputs in 32 KB of
// shared memory, XOR-swizzled per 16 bytes so the fragment writes are bank-conflict free, and
// write them back as coalesced 16-byte rows: the direct 4-byte stores of the fragment layout
// (8 rows x 16 bytes per warp store) made FC1 at T=16384 slower than FC1 plus the separate
// activation pass (bench/results). 32 KB holds half of the plain store's 128 x 256 tile, so it
// stages in two passes. The 128x256 tile's main loop keeps its 4 stages. Ping-pong and swap-AB
// tactics (decode, small tiles) store from registers.
// Each warp group stages and writes back its own 64 rows and meets only its own threads: a warp
// group that finishes first (one whose rows lie past the expert's end issues no MMAs: the pair
// tiles' idle halves) goes on to the next tile instead of waiting for the other's epilogue.
// Forward A/Bs against both warp groups meeting (and CUTLASS's store for FC2), H200, 2026-12-02,
// three machines, T=4096 and 16384: -0.2 to -2.1% on every preset (qwen3 the most), but for one
// deepseek T=4096 at +0.4% (bench/NOTES.md). FC1's epilogue alone per warp group gave a third
// of that or less.
#pragma once
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/layout.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"

#include "activation/activation_math.hpp"

namespace moekit::gemm::detail {

// The gated kinds whose loops a fused epilogue compiles: all four, or one family. Why: the
// gathering 128x240 pair kernel with the clamped kind's loop alone (3944 SASS instructions
// against 8680 with all four) ran gpt-oss's forward at T=16384 0.35% and 0.41% faster on two
// machines (3 rounds each, H200, 2026-12-03; T=4096 even), while one with SwiGLU's alone changed
// nothing on the other presets. So the prefill pair tiles hold one family each
// (Sm90PairActTactic, sm90_grouped.cuh) and the other tactics all four.
enum class ActKinds { kAll, kClamped, kUnclamped };
MOEKIT_HD bool act_kinds_hold(ActKinds set, activation::Kind k) {
  const bool clamped = k == activation::Kind::kSwiGLUClamped;
  return activation::is_gated(k) &&
         (set == ActKinds::kAll || (set == ActKinds::kClamped) == clamped);
}

// kGated: FC1's bias and gated activation, [rows, n / 2] out, for the kinds of kKinds; otherwise
// the accumulators as they are, [rows, n], staged in two column halves.
template <class Element, bool kSwapAB, int kTileM, int kTileN, bool kStaged, bool kGated,
          ActKinds kKinds = ActKinds::kAll>
class Sm90EpilogueOp {
  static_assert(!kStaged || !kSwapAB, "only normal tactics stage their outputs");
  static_assert(kGated || kStaged, "the plain store is staged only");
  // Named barriers (after CUTLASS's reserved ones), one per warp group; the pair tiles' main
  // loop uses 1 and 2.
  static constexpr uint32_t kEpilogueBarrier = 3;
  static constexpr int kOutCols = kTileN / 2;   // outputs per tile row and staging pass
  static constexpr int kChunks = kOutCols / 8;  // 16-byte chunks of outputs per tile row
  // A staged row's pitch in chunks: the XOR swizzle spans 8 (the 192-wide tile's 12 pad to 16).
  static constexpr int kRowChunks = (kChunks + 7) / 8 * 8;

 public:
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementC = void;  // nothing is read back
  using ElementD = Element;
  using ElementOutput = Element;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  // Named by the kernel and GemmUniversalAdapter only (rank checks, layout tags); the output is
  // addressed as ptr_out[group] + row * out_ld.
  using StrideC = cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor*>;
  using InternalStrideC = cute::remove_pointer_t<StrideC>;
  using StrideD = StrideC;
  using InternalStrideD = InternalStrideC;
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<Element, 1, float, float>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;

  struct SharedStorage {
    alignas(128) uint4 staged[kStaged ? kTileM * kRowChunks : 1];
  };
  using TensorMapStorage = SharedStorage;

  struct Arguments {
    Element** ptr_out = nullptr;  // [groups]: the group's first output row
    const float* bias = nullptr;  // [groups, bias_ld] in the blocked row order, or null
    int64_t bias_ld = 0;
    int64_t out_ld = 0;      // output row stride in elements (n / 2)
    activation::Params act;  // a gated kind
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    // The staged write-back stores 16-byte rows.
    constexpr int kRowAlign = kStaged ? 16 / int(sizeof(Element)) : 1;
    return args.ptr_out != nullptr && args.out_ld > 0 && args.out_ld % kRowAlign == 0 &&
           (!kGated || act_kinds_hold(kKinds, args.act.kind));
  }

  CUTLASS_HOST_DEVICE explicit Sm90EpilogueOp(Params const& p) : params_(p) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char* smem) {
    using namespace cute;
    static_assert(is_static<FrgLayout>::value, "accumulator layout must be static");
    static_assert(decltype(size<0, 0>(FrgLayout{}))::value == 2 &&
                      decltype(size<0, 1>(FrgLayout{}))::value == 2 &&
                      decltype(size<0, 2>(FrgLayout{}))::value % 2 == 0,
                  "expected the wgmma accumulator layout ((2, 2, V), MMA_M, MMA_N)");
    Tile t;
    t.m_end = get<0>(problem_shape_mnkl);
    t.n_end = get<1>(problem_shape_mnkl);
    t.m0 = get<0>(blk_coord_mnkl) * int(size<0>(blk_shape_mnk));
    t.n0 = get<1>(blk_coord_mnkl) * int(size<1>(blk_shape_mnk));
    const int group = get<3>(blk_coord_mnkl);
    t.out = params_.ptr_out[group];
    t.bias = params_.bias != nullptr ? params_.bias + int64_t(group) * params_.bias_ld : nullptr;
    t.staged = reinterpret_cast<SharedStorage*>(smem)->staged;
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    // Tile-local (m, n) of every accumulator entry.
    Tensor crd = thr_mma.partition_C(make_identity_tensor(take<0, 2>(blk_shape_mnk)));
    if constexpr (kStaged) {
      static_assert(decltype(size(tiled_mma))::value == 256, "staging assumes two warp groups");
      // Each warp group its own 64 rows and barrier (top of the file). The barrier also orders
      // the previous pass's write-back, which read `staged`, before these writes.
      const int warp_group = thread_idx / cutlass::NumThreadsPerWarpGroup;
      cutlass::arch::NamedBarrier barrier(cutlass::NumThreadsPerWarpGroup,
                                          kEpilogueBarrier + warp_group);
      const int tid = thread_idx % cutlass::NumThreadsPerWarpGroup;
      if constexpr (kGated) {
        barrier.arrive_and_wait();
        store_kind(acc, crd, t);
        barrier.arrive_and_wait();
        write_back(t, t.n0 / 2, t.n_end / 2, warp_group, tid);
      } else {
        barrier.arrive_and_wait();
        store_plain<0>(acc, crd, t);
        barrier.arrive_and_wait();
        write_back(t, t.n0, t.n_end, warp_group, tid);
        barrier.arrive_and_wait();
        store_plain<1>(acc, crd, t);
        barrier.arrive_and_wait();
        write_back(t, t.n0 + kOutCols, t.n_end, warp_group, tid);
      }
    } else {
      store_kind(acc, crd, t);
    }
  }

 private:
  struct Tile {
    int m_end, n_end;  // the group's problem M and N
    int m0, n0;        // the tile's origin
    Element* out;
    const float* bias;
    uint4* staged;  // kStaged: [kTileM][kRowChunks], chunk c of row m at c ^ (m % 8)
  };

  template <class Acc, class Crd>
  CUTLASS_DEVICE void store_kind(Acc const& acc, Crd const& crd, Tile const& t) const {
    using activation::Kind;
    // One loop per kind, so the activation's switch folds away inside it.
    if constexpr (kKinds == ActKinds::kClamped) {
      store<Kind::kSwiGLUClamped>(acc, crd, t);
    } else {
      switch (params_.act.kind) {
        case Kind::kSwiGLU:
          store<Kind::kSwiGLU>(acc, crd, t);
          break;
        case Kind::kSwiGLUClamped:
          if constexpr (kKinds == ActKinds::kAll) store<Kind::kSwiGLUClamped>(acc, crd, t);
          break;
        case Kind::kGeGLUTanh:
          store<Kind::kGeGLUTanh>(acc, crd, t);
          break;
        default:
          store<Kind::kGeGLUErf>(acc, crd, t);
          break;
      }
    }
  }

  // A warp group's staged rows -> global: each thread 16 bytes per step, a warp two whole
  // 256-byte rows.
  CUTLASS_DEVICE void write_back(Tile const& t, int out0, int out_end, int warp_group,
                                 int thread_idx) const {
    constexpr int kRows = kTileM / 2;  // a warp group's rows of the tile
    CUTLASS_PRAGMA_UNROLL
    for (int i = thread_idx; i < kRows * kChunks; i += cutlass::NumThreadsPerWarpGroup) {
      const int m = warp_group * kRows + i / kChunks, c = i % kChunks;
      const int row = t.m0 + m, col = out0 + c * 8;
      if (row < t.m_end && col < out_end)
        *reinterpret_cast<uint4*>(t.out + row * params_.out_ld + col) =
            t.staged[m * kRowChunks + (c ^ (m & 7))];
    }
  }

  CUTLASS_DEVICE static uint32_t bits(float y) { return Element(y).raw(); }

  // The plain store's staging pass kHalf: the accumulators of tile columns kHalf * kOutCols
  // on, two adjacent columns (entries i = 0, 1) a 4-byte word.
  template <int kHalf, class Acc, class Crd>
  CUTLASS_DEVICE void store_plain(Acc const& acc, Crd const& crd, Tile const& t) const {
    using namespace cute;
    static_assert(decltype(size<2>(acc))::value == 1, "one wgmma along N: 8-column groups v");
    constexpr int kV = decltype(size<0, 2>(acc))::value;
    static_assert(kV * 8 == kTileN, "the groups cover the tile's columns");
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < size<1>(acc); ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int m = get<0>(crd(make_coord(0, j, 0), mm, 0));
        if (t.m0 + m >= t.m_end) continue;
        CUTLASS_PRAGMA_UNROLL
        for (int v = kHalf * kV / 2; v < (kHalf + 1) * kV / 2; ++v) {
          const int oc = get<1>(crd(make_coord(0, j, v), mm, 0)) - kHalf * kOutCols;
          const uint32_t pair =
              bits(acc(make_coord(0, j, v), mm, 0)) | bits(acc(make_coord(1, j, v), mm, 0)) << 16;
          const int chunk = (oc >> 3) ^ (m & 7);
          const uint32_t addr =
              cute::cast_smem_ptr_to_uint(t.staged + m * kRowChunks + chunk) + (oc & 7) * 2;
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(pair));
        }
      }
    }
  }

  template <activation::Kind K, class Acc, class Crd>
  CUTLASS_DEVICE void store(Acc const& acc, Crd const& crd, Tile const& t) const {
    using namespace cute;
    activation::Params p = params_.act;
    p.kind = K;
    const int64_t ld = params_.out_ld;
    // The bias is loaded ahead of the stores that use it, kBiasGroups gate groups at a time: a
    // load after a store would wait for it (the compiler cannot tell they do not alias), which
    // cost gpt-oss's FC1 at T=16384 0.8 ms. Four groups, not eight: with no test per pair the
    // compiler interleaves more pairs, and eight spilled 56 bytes in the 128x256 tile.
    // This epilogue runs while both warp groups' tensor cores idle (ncu, H200, 2026-12-01: +5%
    // cycles over the plain store for qwen3's FC1, +13% for gpt-oss's), so its instructions count.
    // The SwiGLU kinds take x * sigmoid(a x) through one MUFU operation (tanh.approx,
    // activation::x_sigmoid_fast; within 2^-14 |x|) instead of two (ex2, rcp): by count, the
    // 16 MUFU lanes per SM bounded the pair loop (2 x 64 MUFU and ~12 x 64 other instructions
    // per thread in the 128x256 tile). Forward A/B at T=16384 (H200, 2026-12-03, two machines, 3
    // and 2 rounds): mixtral -0.8 / -1.1%, gpt-oss -0.7 / -0.3%, deepseek -0.4 / -0.3%, qwen3 even
    // / -0.6%; T=4096 mixtral -1.1 / -0.4%.
    if constexpr (!kSwapAB) {
      constexpr int kGroups = decltype(size<0, 2>(acc))::value / 2;  // gate groups of 8 columns
      // The largest of 4, 3, 2, 1 that divides them (the 240-wide tile has 15).
      constexpr int kBiasGroups = kGroups % 4 == 0   ? 4
                                  : kGroups % 3 == 0 ? 3
                                  : kGroups % 2 == 0 ? 2
                                                     : 1;
      static_assert(kGroups % kBiasGroups == 0);
      CUTLASS_PRAGMA_UNROLL
      for (int nn = 0; nn < size<2>(acc); ++nn) {
        CUTLASS_PRAGMA_UNROLL
        for (int g0 = 0; g0 < kGroups; g0 += kBiasGroups) {
          float4 bias[kBiasGroups];  // gate pair, up pair
          CUTLASS_PRAGMA_UNROLL
          for (int gi = 0; gi < kBiasGroups; ++gi) {
            const int col = t.n0 + get<1>(crd(make_coord(0, 0, 2 * (g0 + gi)), 0, nn));
            bias[gi] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t.bias != nullptr && col < t.n_end) {
              const float2 bg = *reinterpret_cast<const float2*>(t.bias + col);
              const float2 bu = *reinterpret_cast<const float2*>(t.bias + col + 8);
              bias[gi] = make_float4(bg.x, bg.y, bu.x, bu.y);
            }
          }
          CUTLASS_PRAGMA_UNROLL
          for (int mm = 0; mm < size<1>(acc); ++mm) {
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < 2; ++j) {
              // A thread's row is the same along the columns: padded rows of a group's last
              // tile are skipped here, once per row (whole warps at a time), not per pair.
              const int row = t.m0 + get<0>(crd(make_coord(0, j, 0), mm, nn));
              if (row >= t.m_end) continue;
              CUTLASS_PRAGMA_UNROLL
              for (int gi = 0; gi < kBiasGroups; ++gi) {
                const int v = 2 * (g0 + gi);
                const auto c = crd(make_coord(0, j, v), mm, nn);  // tile-local (row, gate col)
                const int col = t.n0 + get<1>(c);
                // Staged outputs land in the tile's own shared memory and write_back drops the
                // columns past n, so no test per pair there (a branch and two compares of the
                // ~30 instructions of a pair). n % 16 == 0: a gate's up is in when it is.
                if (!kStaged && col >= t.n_end) continue;
                const float g0v = acc(make_coord(0, j, v), mm, nn) + bias[gi].x;
                const float g1v = acc(make_coord(1, j, v), mm, nn) + bias[gi].y;
                const float u0v = acc(make_coord(0, j, v + 1), mm, nn) + bias[gi].z;
                const float u1v = acc(make_coord(1, j, v + 1), mm, nn) + bias[gi].w;
                const uint32_t pair = bits(activation::apply_gated_t<true>(p, g0v, u0v)) |
                                      bits(activation::apply_gated_t<true>(p, g1v, u1v)) << 16;
                if constexpr (kStaged) {  // shared memory: conflict-free, see write_back
                  const int m = get<0>(c), oc = (get<1>(c) >> 4) * 8 + (get<1>(c) & 7);
                  const int chunk = (oc >> 3) ^ (m & 7);
                  const uint32_t addr =
                      cute::cast_smem_ptr_to_uint(t.staged + m * kRowChunks + chunk) + (oc & 7) * 2;
                  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(pair));
                } else {
                  const int64_t out_col = (col >> 4) * 8 + (col & 7);
                  *reinterpret_cast<uint32_t*>(t.out + row * ld + out_col) = pair;
                }
              }
            }
          }
        }
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < size<1>(acc); ++mm) {
        // A thread's feature rows do not change along the token groups: one gate row per mm.
        const int feat = t.m0 + get<0>(crd(make_coord(0, 0, 0), mm, 0));
        float bias_gate = 0.f, bias_up = 0.f;
        if (t.bias != nullptr && feat < t.m_end) {
          bias_gate = t.bias[feat];
          bias_up = t.bias[feat + 8];
        }
        CUTLASS_PRAGMA_UNROLL
        for (int nn = 0; nn < size<2>(acc); ++nn) {
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < 2; ++i) {
            CUTLASS_PRAGMA_UNROLL
            for (int v = 0; v < size<0, 2>(acc); ++v) {
              const int tok = t.n0 + get<1>(crd(make_coord(i, 0, v), mm, nn));
              if (feat >= t.m_end || tok >= t.n_end) continue;
              const float g = acc(make_coord(i, 0, v), mm, nn) + bias_gate;
              const float u = acc(make_coord(i, 1, v), mm, nn) + bias_up;
              const int64_t out_col = (feat >> 4) * 8 + (feat & 7);
              t.out[tok * ld + out_col] = Element(activation::apply_gated_t<true>(p, g, u));
            }
          }
        }
      }
    }
  }

  Params params_;
};

// CUTLASS's adapter for register epilogues, with its tensor-map storage emptied: it reuses the
// op's SharedStorage for that, which would allocate the staging buffer twice (the 128x256 tile
// then exceeds the 227 KB of shared memory). The four members that take that storage are
// redeclared for the empty type; like the adapter's, they do nothing.
template <class Op>
class Sm90EpilogueAdapter
    : public cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Op> {
  using Base = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Op>;

 public:
  struct TensorMapStorage {};
  using Base::Base;

  CUTLASS_DEVICE auto load_init(typename Op::Params const&, TensorMapStorage&, int32_t, int32_t) {
    return cute::make_tuple(nullptr);
  }
  CUTLASS_DEVICE auto store_init(typename Op::Params const&, TensorMapStorage&, int32_t, int32_t,
                                 int32_t) {
    return cute::make_tuple(nullptr);
  }
  template <bool IsLoad, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage&, typename Op::Params const&,
                                                cute::TmaDescriptor const*, ProblemShapeMNKL,
                                                int32_t, int32_t) {}
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage&, cute::TmaDescriptor const*,
                                                  int32_t) {}
};

// What the kernel takes as its collective epilogue: FC1's activation, or the pairs' plain store.
template <class Element, bool kSwapAB, int kTileM, int kTileN, bool kStaged,
          ActKinds kKinds = ActKinds::kAll>
using Sm90ActEpilogue =
    Sm90EpilogueAdapter<Sm90EpilogueOp<Element, kSwapAB, kTileM, kTileN, kStaged, true, kKinds>>;
template <class Element, int kTileM, int kTileN>
using Sm90PairStoreEpilogue =
    Sm90EpilogueAdapter<Sm90EpilogueOp<Element, false, kTileM, kTileN, true, false>>;

}  // namespace moekit::gemm::detail
