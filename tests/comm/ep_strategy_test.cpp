// EP strategy selection as data: every strategy once, reasons from the closed list, "auto"
// with a report, a forced strategy that cannot run reported with its reason.
#include <gtest/gtest.h>

#include <set>

#include "moekit/ep.hpp"

namespace moekit {
namespace {

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
  // The all-to-all forms have device kernels in CUDA builds only; the fallback has none.
#ifdef MOEKIT_WITH_CUDA
  const bool built = true;
#else
  const bool built = false;
#endif
  for (const EpStrategyCapability& c : ep_strategies()) {
    const bool device = built && c.strategy != EpStrategy::kAllGatherReduceScatter;
    EXPECT_EQ(c.device, device) << to_string(c.strategy);
    if (!device)
      EXPECT_EQ(ep_reject(c, gpu)->reason, EpRejectReason::kBuild) << to_string(c.strategy);
  }
  EpStrategyCapability ll = ep_strategies()[0];
  ll.device = true;  // as a CUDA build has it
  EXPECT_FALSE(ep_reject(ll, gpu).has_value());
  gpu.max_tokens = 4096;
  EXPECT_EQ(ep_reject(ll, gpu)->reason, EpRejectReason::kTokens);
  EXPECT_NE(ep_reject(ll, gpu)->sentence.find("4096"), std::string::npos);
}

}  // namespace
}  // namespace moekit
