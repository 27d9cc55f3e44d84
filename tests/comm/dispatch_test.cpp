// Dispatch / combine index plans: a row goes once to each rank holding any of its experts, the
// combine sums what comes back per token, the masked layout fills and overflows as documented,
// and bad ids are named.
#include "comm/dispatch.hpp"

#include <gtest/gtest.h>

#include <random>

namespace moekit::comm {
namespace {

TEST(DispatchPlan, EachRowGoesOnceToEachRankHoldingOneOfItsExperts) {
  const ExpertPlacement p{8, 4};  // experts 2r, 2r+1 on rank r
  // Token 0: experts 0 and 1 (both rank 0) -> rank 0 once. Token 1: 7, 2 -> ranks 3, 1.
  // Token 2: 4, 5, 6 -> ranks 2, 3.
  const int32_t ids[] = {0, 1, 99, 7, 2, 99, 4, 5, 6};
  int32_t fixed[9];
  std::copy(ids, ids + 9, fixed);
  fixed[2] = 3;  // token 0's third slot: rank 1
  fixed[5] = 3;  // token 1's third slot: rank 1 again (already there)
  DispatchPlan plan;
  ASSERT_TRUE(plan_dispatch(p, 3, 3, fixed, &plan).ok());
  EXPECT_EQ(plan.rows_to[0], (std::vector<int64_t>{0}));
  EXPECT_EQ(plan.rows_to[1], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(plan.rows_to[2], (std::vector<int64_t>{2}));
  EXPECT_EQ(plan.rows_to[3], (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(plan.send_counts, (std::vector<int64_t>{1, 2, 1, 2}));
  EXPECT_EQ(plan.total_rows(), 6);
  // An id out of range names its token, slot and value; nothing planned.
  const Status st = plan_dispatch(p, 3, 3, ids, &plan);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("99"), std::string::npos);
  EXPECT_NE(st.message().find("token 0 slot 2"), std::string::npos) << st.message();
  EXPECT_EQ(plan_dispatch({8, 3}, 3, 3, fixed, &plan).code(), ErrorCode::kInvalidArgument);
}

TEST(DispatchPlan, PackAndCombineRoundTrip) {
  const ExpertPlacement p{8, 2};
  const int64_t T = 5, k = 2, H = 3;
  std::mt19937 rng(3);
  std::vector<int32_t> ids(T * k);
  for (int64_t t = 0; t < T; ++t) {
    ids[t * k] = static_cast<int32_t>(rng() % 8);
    ids[t * k + 1] = static_cast<int32_t>((ids[t * k] + 1 + rng() % 7) % 8);
  }
  std::vector<float> rows(T * H);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  DispatchPlan plan;
  ASSERT_TRUE(plan_dispatch(p, T, k, ids.data(), &plan).ok());
  std::vector<float> sent(plan.total_rows() * H);
  pack_rows(plan, rows.data(), H * 4, sent.data());
  // Every rank returns the row it got: the combine then gives the row times the ranks it went to.
  std::vector<float> out(T * H, -1.0f);
  combine_rows(plan, sent.data(), T, H, out.data());
  for (int64_t t = 0; t < T; ++t) {
    const int ranks = 1 + (p.rank_of(ids[t * k]) != p.rank_of(ids[t * k + 1]));
    for (int64_t h = 0; h < H; ++h) EXPECT_EQ(out[t * H + h], ranks * rows[t * H + h]) << t;
  }
}

TEST(MaskedLayout, FillsInRankThenTokenOrderAndCountsOverflow) {
  const ExpertPlacement p{4, 2};      // experts 0, 1 on rank 0
  const int32_t r0[] = {0, 2, 1, 0};  // rank 0: token 0 -> 0, 2; token 1 -> 1, 0
  const int32_t r1[] = {0, 3, 3, 1};  // rank 1: token 0 -> 0, 3; token 1 -> 3, 1
  MaskedLayout m;
  ASSERT_TRUE(plan_masked(p, 0, 8, 2, {{2, r0}, {2, r1}}, &m).ok());
  EXPECT_EQ(m.count, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(m.dropped, 0);
  auto slot = [&](int64_t e, int64_t j) { return m.slots[e * m.capacity + j]; };
  EXPECT_EQ(slot(0, 0).rank, 0);
  EXPECT_EQ(slot(0, 0).token, 0);
  EXPECT_EQ(slot(0, 1).token, 1);
  EXPECT_EQ(slot(0, 1).slot, 1);
  EXPECT_EQ(slot(0, 2).rank, 1);
  EXPECT_EQ(slot(1, 1).rank, 1);
  EXPECT_EQ(slot(1, 1).token, 1);
  // Capacity 2: expert 0's third pair is dropped and named; nothing written past the slots.
  ASSERT_TRUE(plan_masked(p, 0, 2, 2, {{2, r0}, {2, r1}}, &m).ok());
  EXPECT_EQ(m.count, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(m.dropped, 1);
  EXPECT_EQ(m.slots.size(), 4u);
  EXPECT_NE(m.first_drop.find("expert 0"), std::string::npos) << m.first_drop;
  EXPECT_EQ(plan_masked(p, 2, 2, 2, {{2, r0}, {2, r1}}, &m).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(plan_masked(p, 0, 2, 2, {{2, r0}}, &m).code(), ErrorCode::kInvalidArgument);
}

TEST(MaskedLayout, LosslessCapacityNeverDrops) {
  const int n = 4;
  const ExpertPlacement p{8, n};
  const int64_t T = 6, k = 2;
  std::vector<std::vector<int32_t>> ids(n, std::vector<int32_t>(T * k));
  for (auto& v : ids) {
    for (int64_t t = 0; t < T; ++t) v[t * k] = 0, v[t * k + 1] = 1;  // all on rank 0's experts
  }
  std::vector<RankRoutingView> src;
  for (auto& v : ids) src.push_back({T, v.data()});
  MaskedLayout m;
  ASSERT_TRUE(plan_masked(p, 0, lossless_capacity(T, n), k, src, &m).ok());
  EXPECT_EQ(m.dropped, 0);
  EXPECT_EQ(m.count, (std::vector<int64_t>{T * n, T * n}));
}

TEST(GatherPlan, PadsToTheLargestRank) {
  const GatherPlan g = plan_gather({3, 0, 7, 2});
  EXPECT_EQ(g.padded, 7);
  EXPECT_EQ(g.rows(), 28);
  EXPECT_EQ(plan_gather({0, 0}).rows(), 0);
}

}  // namespace
}  // namespace moekit::comm
