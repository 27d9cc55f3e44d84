// 2x1 clusters that share an expert's weights by TMA multicast where two row tiles of the same
// expert and column tile run together ("pairs"), and load them alone where they do not
// ("singles"), so an expert keeps ceil(M / 128) row tiles. CUTLASS's group scheduler rounds
// them up to the cluster instead: the padding that already costs the prefill most (H200,
// 2026-12-01) grew, and its c2x1 tactic lost on every preset there.
//
// Why multicast: at T=16384 the forward runs at the GPU's 700 W power cap, and two tiles that
// share one weight load move a third fewer bytes from L2 per tile. Forward A/B against the
// dynamic 1x1 tile, both GEMMs on pairs (H200, 2026-12-01, 3 rounds, T=16384 / 4096): qwen3 -0.5 /
// -1.3%, deepseek -1.2 / -1.6%, gpt-oss -0.6 / -0.8%, mixtral -0.4 / -1.6%. The GEMMs alone
// (sweep: L2 flushed, one at a time) disagree for FC1: pairs there +6% (qwen3) to +16%
// (mixtral); FC2 qwen3 -5.7%, mixtral -4.3%, deepseek +5.7%. The forward decides the pick
// (grouped_gemm.cu); why the two disagree is open (bench/NOTES.md).
//
// Units, each run by one cluster: per expert g with mt = ceil(M_g / 128) row tiles, p = mt / 2
// pairs and s = mt % 2 singles, and nt column tiles, units go by column pairs (n, n + 1): the
// pairs of column n, the pairs of column n + 1, then one single unit holding the last row tile
// at columns n (block 0) and n + 1 (block 1; an empty tile past the problem when n + 1 is past
// the last column: no loads, no stores). Both blocks of a cluster always hold tiles of the same
// unit (Sm90PairGroupScheduler), of the same expert, and run the same number of k blocks.
//
// A pair's blocks load half of the weight tile each and multicast it to both (CUTLASS's c2x1
// main loop); a single's blocks each load the whole weight tile for themselves (both halves,
// multicast to their own block only). The pipeline's barriers do not change: every stage holds
// the same bytes either way, and both blocks' consumers release every stage to both blocks, so
// a block never writes into its partner's stage before the partner has freed it.
#pragma once
#include <cstdint>

#include <cuda/atomic>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/tensor.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "gemm/pair_units.hpp"
#include "gemm/sm90_dynamic_scheduler.cuh"
#include "gemm/sm90_ordered_shape.cuh"

namespace moekit::gemm::detail {

// Units (PairUnits) of each expert in expert order, in a dynamic order (the reason measured on
// 2026-12-01, sm90_dynamic_scheduler.cuh: blocks whose tiles run faster drift into later experts
// under a static one). Each cluster's first unit is its index; the cluster's leader block (rank 0)
// draws every later one from the counter and posts it in the cluster's mailbox in global memory,
// where its partner reads it, so both blocks always hold the same unit. Forward A/B against the
// static order u, u + clusters, ... (H200, 2026-12-01, two machines, 2 rounds each, T=16384):
// mixtral -2.2 / -2.6%, deepseek -1.7 / -2.0%, qwen3 -1.2 / -0.8%, gpt-oss even; at T=4096 -0.3 to
// -0.6%, but qwen3 +1.9 / +1.2% (its GEMMs are the shortest there; likely the mailbox round trip
// per unit).
//
// Mailbox: kSlots words (draw << 32 | unit) per cluster, draw d in slot d % kSlots. The partner
// clears a slot once read, so every slot is zero again when the kernel ends. The leader runs
// ahead of its partner by at most its main loop's stages in units (at one k block per unit) plus
// the one drawn tile, because both blocks' consumers release every stage of both: far fewer
// than kSlots. A slot holding a later draw than the one awaited would mean that bound broke;
// the partner then traps (a launch error) rather than wait forever.
template <class ProblemShape, int Stages, int TileM, int TileN>
class Sm90PairGroupScheduler
    : public Sm90DrawnOrder<
          cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<ProblemShape, Stages>,
          /*kMailboxSlots=*/16> {
  static constexpr int kSlots = 16;
  using Base = Sm90DrawnOrder<
      cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<ProblemShape, Stages>,
      kSlots>;

 public:
  using typename Base::Params;
  using typename Base::SchedulerResponse;
  using typename Base::WorkTileInfo;

  Sm90PairGroupScheduler() = default;
  CUTLASS_DEVICE Sm90PairGroupScheduler(Params const& p, SchedulerResponse* response)
      : Base(p, response), shapes_(p.problem_shapes_) {
    const dim3 id = cute::cluster_id_in_grid(), dims = cute::cluster_grid_dims();
    clusters_ = uint64_t(dims.x) * dims.y * dims.z;
    cluster_ = id.x + uint64_t(dims.x) * (id.y + uint64_t(dims.y) * id.z);
    unit_ = cluster_;
    rank_ = int(cute::block_rank_in_cluster());
  }

  // Every thread of the block calls it once.
  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return this->start(tile_for_unit(unit_));
  }

  // The scheduler warp, for each tile after the first.
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(Pipeline& pipeline, PipelineState state, uint32_t = 1) {
    this->template wait_to_draw<Stages>(pipeline, state);
    const uint64_t draw = this->drawn_;
    unsigned long long u = 0;
    if (threadIdx.x % 32 == 0) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(
          this->mailbox_[cluster_ * kSlots + draw % kSlots]);
      if (rank_ == 0) {
        u = clusters_ + atomicAdd(&this->counters_[0], 1u);
        slot.store(draw << 32 | u, cuda::memory_order_release);
      } else {
        unsigned long long v;
        while (((v = slot.load(cuda::memory_order_acquire)) >> 32) != draw)
          if ((v >> 32) > draw) __trap();
        slot.store(0, cuda::memory_order_relaxed);
        u = v & 0xffffffffull;
      }
    }
    unit_ = __shfl_sync(0xffffffffu, u, 0);
    const WorkTileInfo work = tile_for_unit(unit_);
    this->publish(pipeline, state, work);
    return cute::make_tuple(work, true);
  }

 private:
  // Units drawn by one cluster only grow, so the walk over the groups only moves forward.
  CUTLASS_DEVICE WorkTileInfo tile_for_unit(uint64_t u) {
    const int groups = shapes_.groups();
    while (group_ < groups) {
      const auto shape = shapes_.get_problem_shape(group_);
      const PairUnits<TileM, TileN> pu(cute::get<0>(shape), cute::get<1>(shape));
      const int64_t units = pu.units();
      if (u < start_ + uint64_t(units)) {
        int m = 0, n = 0;
        pu.tile(int64_t(u - start_), rank_, m, n);
        return {m, n, group_, 1};
      }
      start_ += uint64_t(units);
      ++group_;
    }
    return WorkTileInfo::invalid_work_tile();
  }

  ProblemShape shapes_;
  uint64_t clusters_ = 1, cluster_ = 0, unit_ = 0, start_ = 0;
  int group_ = 0, rank_ = 0;
};

// CUTLASS 4.2's c2x1 ptr-array TMA main loop (Base: weights multicast to both blocks) that
// loads a single's weights alone. Its load() is Base's with the second half and the mask.
//
// Idle halves: in a tile whose rows end at or before row 64 (an expert's tail), the second warp
// group (rows 64-127) issues no MMAs; it only waits for and releases the stages (in the empty
// tile both do). About half the experts end in such a tail at T=16384; forward A/B against
// MMAs on the padding (H200, 2026-12-02, 2 rounds): T=4096 / 16384 deepseek -3.9 / -1.1%, gpt-oss
// -1.8 / -3.0%, qwen3 -1.6 / -1.6%, mixtral -1.8% / even. The consumers learn a tile's rows
// from the load warp's leader through a ring in shared memory: it writes slot (tile % kSlots)
// before its arrival on the tile's first stage, and the consumers read it after that stage's
// full barrier. The leader runs at most Stages k blocks (so tiles) ahead of the consumers'
// releases, fewer than kSlots. The idle group's accumulators are never stored: both epilogues
// stop at the group's rows.
//
// Every MMA is full width: a last column tile with few of the group's columns runs its MMAs on
// the weights' zero-filled rows past n, and the epilogues store no column past n. Narrow MMA
// paths for such tiles (m64n64 / m64n128, H200, 2026-12-02) never ran on a preset once gpt-oss took
// the 240-wide tile (every preset's widths are multiples of 256 or 240), and the code cost the
// kernels that never ran it: without them, T=16384 -0.2 to -0.4% on deepseek and mixtral in
// two calls, qwen3 -0.4 / -0.6% in two and +0.6 to +0.9% in one (H200, 2026-12-03 to 2026-12-04);
// gpt-oss's 240-wide tile -0.39% (H200, 2026-12-03).
template <class Base>
struct Sm90PairMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TiledMma;
  static constexpr int kTileM = cute::size<0>(typename Base::TileShape{});
  static constexpr int kTileN = cute::size<1>(typename Base::TileShape{});
  static_assert(cute::size<0>(typename Base::DispatchPolicy::ClusterShape{}) == 2 &&
                    cute::size<1>(typename Base::DispatchPolicy::ClusterShape{}) == 1,
                "pairs are 2x1 clusters");
  static constexpr int kSlots = 16;
  static constexpr int kWarpGroups = cute::size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
  static_assert(Base::DispatchPolicy::Stages < kSlots, "the load warp may not lap the ring");
  static_assert(kWarpGroups == 2 && kTileM == 128, "two warp groups of 64 rows each");
  // Named barriers (after CUTLASS's reserved ones) of the idle warp groups; the epilogues' are 3
  // and 4 (sm90_epilogues.cuh).
  static constexpr uint32_t kIdleBarrier = 1;

  using typename Base::TensorStorage;
  // The ring sits after the pipeline's barriers: the tensor storage has no room left (its
  // epilogue part is 1024-byte aligned, so 64 bytes more there cost 1 KB, past 227 KB).
  struct PipelineStorage : Base::PipelineStorage {
    // The group's rows from the tile's first on, clamped to the tile
    int32_t rows[kSlots];
  };

  // The ring, found from the pipeline: its storage begins with the first stage's full barrier.
  CUTLASS_DEVICE static int32_t* row_ring(MainloopPipeline& pipeline) {
    return reinterpret_cast<PipelineStorage*>(pipeline.producer_get_barrier(PipelineState{}))->rows;
  }

  // The load warp's leader, before its arrival on the tile's first stage.
  CUTLASS_DEVICE void post_rows(MainloopPipeline& pipeline, int rows, int m_coord) {
    row_ring(pipeline)[tiles_loaded_++ % kSlots] =
        cute::min(cute::max(rows - m_coord * kTileM, 0), int(kTileM));
  }

  // Base::mma line for line (K_PIPE_MMAS = 1: one k block's MMAs in flight, the stage before it
  // released; Base::mma_tail releases the last), where an idle half issues no MMAs. The test
  // sits around each k block's batch: a branch around the whole loop (Base::mma or a loop of
  // waits) made ptxas serialize the wgmmas (C7515). Its SASS is Base's but for that test and the
  // idle warps' barrier (a first form as a single loop unrolled by 2 measured +1-2% on deepseek,
  // H200, 2026-12-02).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum,
                          int k_tiles, int thread_idx, TensorStorage& smem, Params const&) {
    using namespace cute;
    static_assert(Base::K_PIPE_MMAS == 1, "Base::mma_tail releases one stage at the end");
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), SmemLayoutB{});
    Layout warp_groups = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group =
        __shfl_sync(0xffffffffu, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_groups(warp_group));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,M,K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,N,K,PIPE)
    static_assert(decltype(size(accum))::value == kTileM / kWarpGroups * kTileN / 128,
                  "one thread's accumulators: a 64 x kTileN wgmma's");
    const int slot = tiles_computed_++ % kSlots;
    // The first k block, as Base's prologue; the tile's rows are in the ring once it is in.
    warpgroup_fence_operand(accum);
    pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
    const bool idle = row_ring(pipeline)[slot] <= warp_group * (kTileM / kWarpGroups);
    // One k block's MMAs as one batch.
    auto block = [&](int stage, bool first) {
      if (first) {  // Base's prologue
        tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
        warpgroup_arrive();
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {
          cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
      } else {
        warpgroup_arrive();
        cute::gemm(tiled_mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), accum);
        warpgroup_commit_batch();
      }
    };
    if (!idle) block(read.index(), true);
    PipelineState release = read;  // Base's main loop: the stage before released after its MMAs
    ++read;
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int t = 1; t < k_tiles; ++t) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      if (!idle) {
        warpgroup_fence_operand(accum);
        block(read.index(), false);
        warpgroup_wait<1>();
        warpgroup_fence_operand(accum);
      } else {
        idle_step(warp_group);
      }
      pipeline.consumer_release(release);
      ++read;
      ++release;
    }
    if (idle) idle_step(warp_group);  // before Base::mma_tail releases the last stage
    warpgroup_fence_operand(accum);
  }

  // An idle warp group's four warps meet before it releases a stage. A busy one's MMAs keep
  // them in step; without them a warp that holds no release (only a few threads of a warp
  // group signal the empty barrier) fell a whole ring behind, waited on a phase that came
  // round again later, and hung the forward's last tiles (H200, 2026-12-02: cuda-gdb found one
  // warp in a tile's first wait while its warp group stood at the epilogue's barrier).
  CUTLASS_DEVICE static void idle_step(int warp_group) {
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, kIdleBarrier + warp_group);
  }

  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& p) const {
    auto ab = Base::load_init(shape, p);
    return cute::make_tuple(cute::get<0>(ab), cute::get<1>(ab), int(cute::get<0>(shape)),
                            int(cute::get<1>(shape)));
  }

  // The load warp learns the group's shape where Base learns its tensors.
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& in, Params const&,
                                                     ProblemShape_MNKL shape, int32_t) {
    InputTensors out = in;
    cute::get<2>(out) = static_cast<int>(cute::get<0>(shape));
    cute::get<3>(out) = static_cast<int>(cute::get<1>(shape));
    return out;
  }

  // Issues the weight tile's loads of one k block into a stage: this block's half (multicast to
  // both blocks in a pair) and, in a single, the other half too. gB: (BLK_N, BLK_K, k).
  template <class TensorB, class TensorMapB>
  CUTLASS_DEVICE static auto weight_loads(Params const& p, TensorB const& gB, TensorMapB const& map,
                                          bool single, uint32_t rank, TensorStorage& smem) {
    using namespace cute;
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), SmemLayoutB{});
    auto tma_b_own = p.tma_load_b.get_slice(rank);
    auto tma_b_other = p.tma_load_b.get_slice(rank ^ 1u);
    Tensor tBgB = tma_b_own.partition_S(gB);
    Tensor tBsB = tma_b_own.partition_D(sB);
    Tensor tBgB2 = tma_b_other.partition_S(gB);
    Tensor tBsB2 = tma_b_other.partition_D(sB);
    const uint16_t mask = single ? uint16_t(1u << rank) : uint16_t(3);
    return [=, &p](uint64_t* bar, auto k, int stage) {
      copy(p.tma_load_b.with(map, *bar, mask), tBgB(_, _, _, k), tBsB(_, _, _, stage));
      if (single)
        copy(p.tma_load_b.with(map, *bar, mask), tBgB2(_, _, _, k), tBsB2(_, _, _, stage));
    };
  }

  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator,
            class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB, int, int> const& in,
                           cute::tuple<TensorMapA, TensorMapB> const& maps, BlockCoord const& blk,
                           KTileIterator k_tile, int k_tiles, int, uint32_t rank,
                           TensorStorage& smem) {
    using namespace cute;
    // The warp's lanes all read the tile's tensormap before this (the copy to global memory on a
    // group change), and the next change writes it: without this sync racecheck reported that
    // read against the next write once a block changes groups at every tile (H200, 2026-12-01).
    __syncwarp();
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), SmemLayoutA{});
    auto [m_coord, n_coord, k_coord, l_coord] = blk;
    post_rows(pipeline, get<2>(in), int(m_coord));
    Tensor gA = get<0>(in)(_, _, m_coord, _, l_coord);
    const PairUnits<kTileM, kTileN> pu(get<2>(in), get<3>(in));
    auto tma_a = p.tma_load_a.get_slice(0);
    Tensor tAgA = tma_a.partition_S(gA);
    Tensor tAsA = tma_a.partition_D(sA);
    auto load_weights = weight_loads(p, get<1>(in)(_, _, n_coord, _, l_coord), get<1>(maps),
                                     pu.single(int(m_coord)), rank, smem);
    for (; k_tiles > 0; --k_tiles) {
      pipeline.producer_acquire(write);
      auto* bar = pipeline.producer_get_barrier(write);
      const int stage = write.index();
      copy(p.tma_load_a.with(get<0>(maps), *bar, uint16_t(0)), tAgA(_, _, _, *k_tile),
           tAsA(_, _, _, stage));
      load_weights(bar, *k_tile, stage);
      ++k_tile;
      ++write;
    }
  }

 private:
  uint32_t tiles_loaded_ = 0;    // by the load warp's leader
  uint32_t tiles_computed_ = 0;  // by each consumer thread
};

// The pairs' main loop with A's rows gathered from the caller's matrix by index, instead of read
// from a matrix the permute gathered first (its scatter pass wrote and FC1 read back T x k rows:
// qwen3 ~170 us, deepseek ~600 of their T=16384 forwards, H200, 2026-12-01). Row r of group g's A
// is row row_src[g][r] of the matrix at ptr_A[g] (both written per run by the problem kernel). Two
// warps of the producer warp group copy A's 128 rows of each k block with cp.async (16 bytes a
// lane) into the 128-byte swizzled layout TMA would have written: the load warp rows 0-63, the
// kernel's auxiliary load warp (HasAuxiliaryLoad) rows 64-127. Each lane's copies arrive on the
// stage's barrier as they land (cp.async.mbarrier.arrive.noinc: one of the stage's expected
// arrivals each), beside the load warp leader's arrival for the weights, which stay on TMA and
// multicast. One-row TMA boxes were measured too slow for this (H200, 2026-12-01: ~60 cycles a box,
// 4.3 GB/s per SM). The copying warps' issue rate decides whether FC1 keeps its pace: one warp,
// a shuffle per copy, doubled FC1's time (H200, 2026-12-02); two warps with an address per 16-byte
// copy left FC1's consumers waiting for A at ~47% of their samples, two per address (RowCopier)
// at ~6%, as with TMA (ncu, H200, 2026-12-02).
template <class Policy>
struct GatherPolicy : Policy {};

template <class Base>
struct Sm90PairGatherMainloop : Sm90PairMainloop<Base> {
  using Pair = Sm90PairMainloop<Base>;
  using typename Pair::MainloopPipeline;
  using typename Pair::PipelineState;
  using typename Pair::TensorStorage;
  using DispatchPolicy = GatherPolicy<typename Base::DispatchPolicy>;
  using Element = typename Base::ElementA;
  static constexpr int kTileM = Pair::kTileM;
  static constexpr int kTileK = cute::size<2>(typename Base::TileShape{});
  static constexpr int kCopyWarps = 2;
  static constexpr int kRowsPerWarp = kTileM / kCopyWarps;
  static_assert(kTileK * sizeof(Element) == 128 && kRowsPerWarp % 16 == 0,
                "one 128-byte swizzle row per tile row and k block");
  static_assert(cute::is_same_v<typename Base::SmemLayoutAtomA,
                                cute::GMMA::Layout_K_SW128_Atom<typename Base::TiledMma::ValTypeA>>,
                "A's stages in the K-major 128-byte swizzle that RowCopier writes");
  static constexpr uint32_t kStageBytesA = kTileM * kTileK * sizeof(Element);
  static constexpr uint32_t kGroupBytes = 8 * 128;  // a copy instruction's 8 rows in a stage
  // A stage completes with the load warp leader's arrival (expecting the weights' bytes) and
  // one asynchronous arrival per copying lane.
  static constexpr int NumProducerThreadEvents = 1 + 32 * kCopyWarps;

  struct Arguments : Pair::Arguments {
    const int32_t* const* row_src = nullptr;  // [groups] device: each group's source rows
  };
  struct Params : Pair::Params {
    const int32_t* const* row_src = nullptr;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* ws) {
    Params p;
    static_cast<typename Pair::Params&>(p) = Pair::to_underlying_arguments(shapes, args, ws);
    p.tma_transaction_bytes = Base::TmaTransactionBytes - kStageBytesA;  // the weights only
    p.row_src = args.row_src;
    return p;
  }

  // (A, B, M, N, K, the group's source rows, its matrix)
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& p) const {
    auto ab = Base::load_init(shape, p);
    return cute::make_tuple(cute::get<0>(ab), cute::get<1>(ab), int(cute::get<0>(shape)),
                            int(cute::get<1>(shape)), int(cute::get<2>(shape)),
                            static_cast<const int32_t*>(nullptr),
                            static_cast<const char*>(nullptr));
  }

  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& in, Params const& p,
                                                     ProblemShape_MNKL shape, int32_t group) {
    InputTensors out = in;
    cute::get<2>(out) = static_cast<int>(cute::get<0>(shape));
    cute::get<3>(out) = static_cast<int>(cute::get<1>(shape));
    cute::get<4>(out) = static_cast<int>(cute::get<2>(shape));
    cute::get<5>(out) = p.row_src[group];
    cute::get<6>(out) = reinterpret_cast<const char*>(p.ptr_A[group]);
    return out;
  }

  // One warp's rows of a tile's A (kRowsPerWarp from `first`), stage by stage. Lane l copies
  // 16-byte chunks q and q + 4 (q = l % 4) of row first + 8 i + l / 4 for each of the warp's
  // 8-row groups i: a copy instruction covers 8 rows x 64 bytes, and a row's two copies share
  // one address (the second at +64 bytes). Each lane's source rows are found once per tile. So a
  // stage is kGroups address multiply-adds for 2 x kGroups copies: with an address chain per copy
  // (16 a stage) the two copying warps were busy all the time and FC1's consumers waited for A
  // (ncu, H200, 2026-12-02).
  struct RowCopier {
    static constexpr int kGroups = kRowsPerWarp / 8;  // 8-row groups per warp and stage
    uint32_t rows16[kGroups];  // source row x row bytes / 16 (0 past the group's rows)
    uint32_t live_rows;        // bit i: group i's row is in the group (else zeros)
    const char* x;
    uint32_t dst_lo, dst_hi;  // this lane's byte offsets in a stage for chunks q and q + 4
    int k, q;
    uint32_t smem_a;
    bool dead;  // all the warp's rows lie past the group: their warp group skips its MMAs

    template <class InputTensors>
    CUTLASS_DEVICE RowCopier(InputTensors const& in, int m_coord, int warp, TensorStorage& smem) {
      const int lane = int(threadIdx.x % 32);
      const int first = warp * kRowsPerWarp;
      const int live = cute::get<2>(in) - m_coord * kTileM - first;
      // The whole warp or none: a busy warp group keeps zeros in its rows past the group. A skip
      // per lane (stale rows in its MMAs where fewer than 8 rows were live) cost deepseek 0.8%.
      dead = live <= 0;
      const int32_t* rows = cute::get<5>(in) + int64_t(m_coord) * kTileM + first;
      k = cute::get<4>(in);
      const uint32_t row16 = uint32_t(k) * uint32_t(sizeof(Element)) / 16u;
      q = lane % 4;
      const int r8 = lane / 4;  // the row in each group of 8, and its row % 8 (first % 8 == 0)
      live_rows = 0;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kGroups; ++i) {
        const int row = 8 * i + r8;
        const int32_t s = row < live ? rows[row] : -1;
        rows16[i] = s >= 0 ? uint32_t(s) * row16 : 0u;
        live_rows |= uint32_t(s >= 0) << i;
      }
      x = cute::get<6>(in);
      // The 128-byte swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8).
      const uint32_t row0 = uint32_t(first + r8) * 128u;
      dst_lo = row0 + uint32_t((q ^ r8) << 4);
      dst_hi = row0 + uint32_t(((q + 4) ^ r8) << 4);
      smem_a = cute::cast_smem_ptr_to_uint(smem.smem_A.data());
    }

    // Copies k block `kt` of the rows into `stage`; each lane then arrives on `bar` once its
    // copies land.
    CUTLASS_DEVICE void stage(int kt, int stage, uint64_t* bar) const {
      // An idle half or the empty tile: its consumers issue no MMAs, so the rows keep anything.
      if (dead) {
        cutlass::arch::cpasync_barrier_arrive_noinc(bar);
        return;
      }
      const uint32_t dst = smem_a + uint32_t(stage) * kStageBytesA;
      const int col = kt * kTileK + q * 8;
      constexpr int kHi = 4 * 16 / int(sizeof(Element));  // chunk q + 4's column offset
      if ((kt + 1) * kTileK <= k) {  // a whole k block: both chunks read, from one address
        const char* col_ptr = x + int64_t(col) * int64_t(sizeof(Element));
        const uint32_t lo = dst + dst_lo, hi = dst + dst_hi;
        cute::for_each(cute::make_int_sequence<kGroups / 2>{}, [&](auto i) {
          constexpr int g = 2 * decltype(i)::value;
          copy_row_pairs<g>(lo, hi, rows16[g], rows16[g + 1], col_ptr, live_rows);
        });
      } else {  // a ragged k's last block: each chunk in or out (k % 8 == 0), none read past k
        const bool lo = col < k, hi = col + kHi < k;
        const char* lo_ptr = x + int64_t(lo ? col : 0) * int64_t(sizeof(Element));
        const char* hi_ptr = x + int64_t(hi ? col + kHi : 0) * int64_t(sizeof(Element));
        cute::for_each(cute::make_int_sequence<kGroups>{}, [&](auto i) {
          constexpr int g = decltype(i)::value;
          copy_row<g>(dst + dst_lo + g * kGroupBytes, rows16[g], lo_ptr, lo ? live_rows : 0u);
          copy_row<g>(dst + dst_hi + g * kGroupBytes, rows16[g], hi_ptr, hi ? live_rows : 0u);
        });
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(bar);
    }
  };

  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator,
            class BlockCoord>
  CUTLASS_DEVICE void load(
      Params const& p, MainloopPipeline pipeline, PipelineState write,
      cute::tuple<TensorA, TensorB, int, int, int, const int32_t*, const char*> const& in,
      cute::tuple<TensorMapA, TensorMapB> const& maps, BlockCoord const& blk, KTileIterator k_tile,
      int k_tiles, int, uint32_t rank, TensorStorage& smem) {
    using namespace cute;
    __syncwarp();  // as Pair::load: the tensormap's reads before the next group's update
    auto [m_coord, n_coord, k_coord, l_coord] = blk;
    const PairUnits<kTileM, Pair::kTileN> pu(get<2>(in), get<3>(in));
    auto load_weights = Pair::weight_loads(p, get<1>(in)(_, _, n_coord, _, l_coord), get<1>(maps),
                                           pu.single(int(m_coord)), rank, smem);
    const RowCopier rows(in, int(m_coord), 0, smem);
    const bool leader = elect_one_sync();
    if (leader) this->post_rows(pipeline, get<2>(in), int(m_coord));
    for (; k_tiles > 0; --k_tiles) {
      pipeline.producer_acquire(write);  // every lane waits; the leader expects the weights
      auto* bar = pipeline.producer_get_barrier(write);
      rows.stage(int(*k_tile), write.index(), bar);
      if (leader) load_weights(bar, *k_tile, write.index());
      ++k_tile;
      ++write;
    }
  }

  // The auxiliary load warp: the tile's other rows, in the same stages.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load_auxiliary(
      Params const&, MainloopPipeline pipeline, PipelineState write,
      cute::tuple<TensorA, TensorB, int, int, int, const int32_t*, const char*> const& in,
      BlockCoord const& blk, KTileIterator k_tile, int k_tiles, int, uint32_t,
      TensorStorage& smem) {
    const RowCopier rows(in, int(cute::get<0>(blk)), 1, smem);
    for (; k_tiles > 0; --k_tiles) {
      pipeline.producer_acquire(write);  // waits only: this warp holds no leader
      rows.stage(int(*k_tile), write.index(), pipeline.producer_get_barrier(write));
      ++k_tile;
      ++write;
    }
  }

 private:
  // 16-byte copies from global to shared memory through the L2 only; the L2 fetches 256 bytes
  // around them (a row's next k block comes with this one). The source is col_ptr + 16 x row16,
  // and the copy writes zeros where its row's bit of `live` is 0: both formed inside the asm, as
  // in C++ the compiler hoists the 64-bit offsets and the sizes out of the stage loop, past the
  // producer's 40 registers into local memory. copy_row_pairs also copy the 16 bytes 64 bytes
  // on, to dst_hi.
  template <int kGroup>
  CUTLASS_DEVICE static void copy_row_pairs(uint32_t dst_lo, uint32_t dst_hi, uint32_t row16_a,
                                            uint32_t row16_b, const char* col_ptr, uint32_t live) {
    // Groups kGroup and kGroup + 1 (kGroupBytes apart in the stage), each address its own
    // register, so that the second's multiply-add need not wait for the first's copies.
    asm volatile(
        "{\n .reg .u64 a, b;\n .reg .b32 t;\n .reg .pred za, zb;\n"
        " mad.wide.u32 a, %2, 16, %4;\n mad.wide.u32 b, %3, 16, %4;\n"
        " and.b32 t, %5, %6;\n setp.eq.u32 za, t, 0;\n"
        " and.b32 t, %5, %7;\n setp.eq.u32 zb, t, 0;\n"
        " cp.async.cg.shared.global.L2::256B [%0+%8], [a], 16, za;\n"
        " cp.async.cg.shared.global.L2::256B [%1+%8], [a+64], 16, za;\n"
        " cp.async.cg.shared.global.L2::256B [%0+%9], [b], 16, zb;\n"
        " cp.async.cg.shared.global.L2::256B [%1+%9], [b+64], 16, zb;\n}\n" ::"r"(dst_lo),
        "r"(dst_hi), "r"(row16_a), "r"(row16_b), "l"(col_ptr), "r"(live), "n"(1u << kGroup),
        "n"(2u << kGroup), "n"(kGroup * kGroupBytes), "n"((kGroup + 1) * kGroupBytes)
        : "memory");
  }
  template <int kBit>
  CUTLASS_DEVICE static void copy_row(uint32_t dst, uint32_t row16, const char* col_ptr,
                                      uint32_t live) {
    asm volatile(
        "{\n .reg .u64 src;\n .reg .b32 bit;\n .reg .pred off;\n"
        " mad.wide.u32 src, %1, 16, %2;\n and.b32 bit, %3, %4;\n setp.eq.u32 off, bit, 0;\n"
        " cp.async.cg.shared.global.L2::256B [%0], [src], 16, off;\n}\n" ::"r"(dst),
        "r"(row16), "l"(col_ptr), "r"(live), "n"(1u << kBit)
        : "memory");
  }
};

// The problem shape that selects the pair scheduler.
struct PairOrder {
  template <class Shape, class TileShape, int Stages>
  using Scheduler =
      Sm90PairGroupScheduler<Shape, Stages, cute::size<0>(TileShape{}), cute::size<1>(TileShape{})>;
};
using PairGroupProblemShape = OrderedGroupProblemShape<PairOrder>;

}  // namespace moekit::gemm::detail

// The gathering pairs run the kernel's auxiliary load warp (Sm90PairGatherMainloop).
namespace cutlass::gemm::kernel::detail {
template <class Policy>
struct HasAuxiliaryLoad<moekit::gemm::detail::GatherPolicy<Policy>> : cute::true_type {};
}  // namespace cutlass::gemm::kernel::detail
