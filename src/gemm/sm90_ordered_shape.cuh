// CUTLASS 4.2's kernels pick their tile scheduler by the problem shape's type. A tactic that
// runs its tiles in an order of ours passes OrderedGroupProblemShape<Order> (the layout of
// CUTLASS's group problem shape), and Order::Scheduler is the scheduler it gets.
#pragma once
#include <cstdint>

#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace moekit::gemm::detail {

template <class Order>
struct OrderedGroupProblemShape : cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>> {};

}  // namespace moekit::gemm::detail

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t Stages, class Order>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, Stages,
                             moekit::gemm::detail::OrderedGroupProblemShape<Order>> {
  using Scheduler =
      typename Order::template Scheduler<moekit::gemm::detail::OrderedGroupProblemShape<Order>,
                                         TileShape, int(Stages)>;
};

}  // namespace cutlass::gemm::kernel::detail
