// A dynamic tile order for CUTLASS 4.2's Hopper ptr-array grouped kernels: each block's first
// tile is its own index, as in CUTLASS's group scheduler; every later tile is the next one from a
// counter in global memory, drawn by the scheduler warp once the block has started the tile
// before (so a block holds at most one drawn tile ahead).
//
// Why: CUTLASS's group scheduler hands block b the tiles b, b + grid, b + 2 grid, ... Blocks
// whose tiles run faster than others' drift ahead into later experts, the tiles in flight spread
// over more experts' weights, and the L2 stops serving them: with a tail skip (an expert's
// empty half tile skipping its MMAs; patch in H200, 2026-12-01) deepseek's FC1 at
// T=16384 fell from 67% L2 hits to 25% and became DRAM-bound. Drawn from one counter, the tiles
// in flight stay a window of about one tile per block, whatever each tile costs. Without the
// skip it gains FC1 0.2-1.0% at T=16384 (deepseek's uneven experts the most; H200, 2026-12-01).
//
// The counter (and a count of blocks done) lives in the kernel's workspace, zero when the
// kernel starts: the last block to finish clears both, so graph replays need nothing else.
// Every block counts itself done exactly once: its scheduler warp after drawing past the last
// tile, or, where even its first tile is past the last (the kernel then returns at once),
// thread 0 when it learns that first tile.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "gemm/sm90_ordered_shape.cuh"

namespace moekit::gemm::detail {

// What the dynamic orders share (Base: CUTLASS's group scheduler): the workspace, zero when a
// launch starts ([0] draws past the first wave, [1] blocks done, then kMailboxSlots 64-bit words
// per SM for a cluster order, sm90_cluster_pairs.cuh), the wait before each draw, and the last
// block's clearing of the counters.
template <class Base, int kMailboxSlots = 0>
class Sm90DrawnOrder : public Base {
 public:
  using typename Base::Arguments;
  using typename Base::SchedulerResponse;
  using typename Base::WorkTileInfo;
  struct Params : Base::Params {
    uint32_t* counters = nullptr;
    unsigned long long* mailbox = nullptr;
  };

  Sm90DrawnOrder() = default;
  CUTLASS_DEVICE Sm90DrawnOrder(Params const& p, SchedulerResponse* response)
      : Base(p, response), counters_(p.counters), mailbox_(p.mailbox) {}

  template <class ProblemShape, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShape shapes, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw,
                                        Arguments const& args, void* workspace = nullptr,
                                        uint32_t = 1, uint32_t = 1) {
    Params p;
    static_cast<typename Base::Params&>(p) =
        Base::to_underlying_arguments(shapes, tile, cluster, hw, args, workspace);
    p.counters = static_cast<uint32_t*>(workspace);
    p.mailbox = reinterpret_cast<unsigned long long*>(static_cast<char*>(workspace) + 16);
    return p;
  }

  // Clusters are at most one per SM.
  static size_t workspace_bytes(cutlass::KernelHardwareInfo const& hw) {
    return 16 + size_t(hw.sm_count) * kMailboxSlots * sizeof(unsigned long long);
  }
  template <class Shape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, Shape, cutlass::KernelHardwareInfo const& hw,
                                   uint32_t, uint32_t = 1, uint32_t = 1) {
    return workspace_bytes(hw);
  }
  template <class Shape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void* workspace,
                                              cudaStream_t stream, Shape,
                                              cutlass::KernelHardwareInfo const& hw, uint32_t,
                                              uint32_t = 1, uint32_t = 1,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cudaMemsetAsync(workspace, 0, workspace_bytes(hw), stream) == cudaSuccess
               ? cutlass::Status::kSuccess
               : cutlass::Status::kErrorInternal;
  }

 protected:
  // The scheduler warp before each draw after its first: waits until the block has taken the
  // tile drawn last (so a block holds at most one drawn tile ahead), then counts the draw.
  template <int Stages, class Pipeline, class PipelineState>
  CUTLASS_DEVICE void wait_to_draw(Pipeline& pipeline, PipelineState state) {
    if (drawn_ > 0) {
      PipelineState previous = state;
      previous.advance(Stages - 1);
      pipeline.producer_acquire(previous);
    }
    ++drawn_;
  }

  // Publishes the next tile to the block (lane 0 of the scheduler warp); a block whose tile is
  // past the last counts itself done.
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE void publish(Pipeline& pipeline, PipelineState state, WorkTileInfo const& work) {
    pipeline.producer_acquire(state);
    if (threadIdx.x % 32 == 0) {
      this->response_ptr_[state.index()] = work;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(state);
      if (!work.is_valid()) block_done();
    }
    __syncwarp();
  }

  // Every thread of the block, with the block's first tile: a block with none is done.
  CUTLASS_DEVICE WorkTileInfo start(WorkTileInfo const& first) const {
    if (!first.is_valid() && threadIdx.x == 0) block_done();
    return first;
  }

  // Every block calls it exactly once. The last one clears the counters for the next launch.
  CUTLASS_DEVICE void block_done() const {
    __threadfence();
    const uint32_t blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(&counters_[1], 1u) == blocks - 1) {
      __threadfence();
      atomicExch(&counters_[0], 0u);
      atomicExch(&counters_[1], 0u);
    }
  }

  uint32_t* counters_ = nullptr;
  unsigned long long* mailbox_ = nullptr;
  uint32_t drawn_ = 0;
};

template <class ProblemShape, int Stages>
class Sm90DynamicGroupScheduler
    : public Sm90DrawnOrder<
          cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<ProblemShape, Stages>> {
  using Base = Sm90DrawnOrder<
      cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<ProblemShape, Stages>>;

 public:
  using Base::Base;
  using typename Base::Params;
  using typename Base::SchedulerResponse;
  using typename Base::WorkTileInfo;

  // Every thread of the block calls it once.
  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape cluster) {
    return this->start(Base::initial_work_tile_info(cluster));
  }

  // The scheduler warp, for each tile after the first.
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(Pipeline& pipeline, PipelineState state, uint32_t = 1) {
    this->template wait_to_draw<Stages>(pipeline, state);
    uint32_t next = 0;
    if (threadIdx.x % 32 == 0) next = atomicAdd(&this->counters_[0], 1u);
    next = __shfl_sync(0xffffffffu, next, 0);
    const uint64_t grid = uint64_t(gridDim.x) * gridDim.y * gridDim.z;
    const WorkTileInfo work = this->get_current_work_for_linear_idx(grid + next);
    this->publish(pipeline, state, work);
    return cute::make_tuple(work, true);
  }
};

// The problem shape that selects the dynamic scheduler.
struct DynamicOrder {
  template <class Shape, class TileShape, int Stages>
  using Scheduler = Sm90DynamicGroupScheduler<Shape, Stages>;
};
using DynamicGroupProblemShape = OrderedGroupProblemShape<DynamicOrder>;

}  // namespace moekit::gemm::detail
