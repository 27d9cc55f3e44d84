// EP strategy selection as data: every strategy once, reasons from the closed list, "auto"
// with a report, a forced strategy that cannot run reported with its reason.
#include <gtest/gtest.h>

#include <set>

#include "moekit/ep.hpp"

namespace moekit {
namespace {

#ifdef MOEKIT_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

EpContext host_ctx(int world) {
  EpContext c;
  c.world_size = world;
  c.max_tokens = 64;
  return c;
}

TEST(EpStrategy, EachStrategyOnceInTheTableAndNamesRoundTrip) {
  std::set<EpStrategy> seen;
  for (const EpStrategyCapability& c : ep_strategies()) {
    EXPECT_TRUE(seen.insert(c.strategy).second) << to_string(c.strategy);
    EXPECT_EQ(ep_strategy_from_string(to_string(c.strategy)), c.strategy);
  }
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_FALSE(ep_strategy_from_string("ring").has_value());
}

TEST(EpStrategy, AutoOnTheHostTakesAllToAll) {
  for (int n : {1, 2, 4, 8}) {
    const EpSelection s = select_ep_strategy(host_ctx(n), "auto");
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s.chosen, EpStrategy::kAllToAll);
    ASSERT_EQ(s.candidates.size(), 3u);
    EXPECT_EQ(s.candidates[0].rejection->reason, EpRejectReason::kTransport);  // low latency
    EXPECT_NE(s.table().find("CHOSEN"), std::string::npos);
  }
}

TEST(EpStrategy, FallsBackToAllGatherWithReasons) {
  EpContext tp = host_ctx(4);
  tp.tp_size = 2;
  EpSelection s = select_ep_strategy(tp, "auto");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s.chosen, EpStrategy::kAllGatherReduceScatter);
  EXPECT_EQ(s.candidates[1].rejection->reason, EpRejectReason::kTensorParallel);

  s = select_ep_strategy(host_ctx(128), "auto");
  EXPECT_EQ(*s.chosen, EpStrategy::kAllGatherReduceScatter);
  EXPECT_EQ(s.candidates[1].rejection->reason, EpRejectReason::kWorldSize);
  EXPECT_NE(s.candidates[1].rejection->sentence.find("128"), std::string::npos);
}

TEST(EpStrategy, ForcedIneligibleIsNotOkWithItsReason) {
  const EpSelection s = select_ep_strategy(host_ctx(2), "all_to_all_low_latency");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.candidates[0].rejection->reason, EpRejectReason::kTransport);
  const EpSelection forced = select_ep_strategy(host_ctx(2), "all_gather_reduce_scatter");
  EXPECT_EQ(*forced.chosen, EpStrategy::kAllGatherReduceScatter);
  try {
    select_ep_strategy(host_ctx(2), "ring");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("ring"), std::string::npos);
  }
}

TEST(EpStrategy, EveryReasonFromTheClosedList) {
  EpContext gpu = host_ctx(8);
  gpu.device = Device::kCuda;
  gpu.transport_graph_capturable = true;
  // Every strategy has device kernels in CUDA builds, none without.
  for (const EpStrategyCapability& c : ep_strategies()) {
    EXPECT_EQ(c.device, kCudaBuild) << to_string(c.strategy);
    if (!kCudaBuild)
      EXPECT_EQ(ep_reject(c, gpu)->reason, EpRejectReason::kBuild) << to_string(c.strategy);
  }
  EpStrategyCapability ll = ep_strategies()[0];
  ll.device = true;  // as a CUDA build has it
  EXPECT_FALSE(ep_reject(ll, gpu).has_value());
  gpu.max_tokens = 4096;
  EXPECT_EQ(ep_reject(ll, gpu)->reason, EpRejectReason::kTokens);
  EXPECT_NE(ep_reject(ll, gpu)->sentence.find("4096"), std::string::npos);
}

// On GPUs: the low-latency form where it fits, all-to-all past its token bound, the all-gather
// with TP inside EP groups or past all-to-all's world size; without CUDA nothing, for kBuild.
TEST(EpStrategy, AutoOnGpusFollowsTheBoundsAndFallsBackToAllGather) {
  EpContext gpu = host_ctx(8);
  gpu.device = Device::kCuda;
  gpu.transport_graph_capturable = true;
  EpContext prefill = gpu, tp = gpu, wide = gpu;
  prefill.max_tokens = 4096;
  tp.tp_size = 2;
  wide.world_size = 4096;  // past the dispatch kernels' ranks
  const std::pair<EpContext, EpStrategy> cases[] = {{gpu, EpStrategy::kAllToAllLowLatency},
                                                    {prefill, EpStrategy::kAllToAll},
                                                    {tp, EpStrategy::kAllGatherReduceScatter},
                                                    {wide, EpStrategy::kAllGatherReduceScatter}};
  for (const auto& [ctx, want] : cases) {
    const EpSelection s = select_ep_strategy(ctx, "auto");
    if (!kCudaBuild) {
      EXPECT_FALSE(s.ok());
      for (const EpCandidate& c : s.candidates)
        EXPECT_EQ(c.rejection->reason, EpRejectReason::kBuild) << to_string(c.strategy);
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.table();
    EXPECT_EQ(*s.chosen, want) << s.table();
  }
  if (!kCudaBuild) return;
  const EpSelection s = select_ep_strategy(tp, "auto");
  EXPECT_EQ(s.candidates[0].rejection->reason, EpRejectReason::kTensorParallel);
  EXPECT_EQ(s.candidates[1].rejection->reason, EpRejectReason::kTensorParallel);
  const EpSelection past = select_ep_strategy(wide, "auto");
  EXPECT_EQ(past.candidates[0].rejection->reason, EpRejectReason::kWorldSize);
  EXPECT_EQ(past.candidates[1].rejection->reason, EpRejectReason::kWorldSize);
  EXPECT_NE(past.candidates[0].rejection->sentence.find("4096"), std::string::npos);
  const EpSelection forced = select_ep_strategy(gpu, "all_gather_reduce_scatter");
  EXPECT_EQ(*forced.chosen, EpStrategy::kAllGatherReduceScatter);
}

}  // namespace
}  // namespace moekit
