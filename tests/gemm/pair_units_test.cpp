// The 2x1 pair tiles' units (gemm/pair_units.hpp): every tile of an expert computed exactly
// once, pairs on the same column, singles on the last row tile, empty tiles only past the
// problem, and the pair/single choice both blocks of a unit agree on.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "gemm/pair_units.hpp"

namespace {

using moekit::gemm::PairUnits;

TEST(PairUnits, EveryTileOnceInUnitsBothBlocksAgreeOn) {
  for (int m : {1, 64, 128, 129, 256, 300, 512, 640, 1000, 4096})
    for (int n : {64, 200, 256, 257, 1536, 2048, 2880, 5760, 7168}) {
      SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n));
      const PairUnits<128, 256> pu(m, n);
      std::map<std::pair<int, int>, int> seen;
      int empty = 0;
      for (int64_t v = 0; v < pu.units(); ++v) {
        int m0, n0, m1, n1;
        pu.tile(v, 0, m0, n0);
        pu.tile(v, 1, m1, n1);
        // Both blocks load alone, or both share one weight tile (same column, rows 2j, 2j + 1).
        ASSERT_EQ(pu.single(m0), pu.single(m1)) << "unit " << v;
        if (!pu.single(m0)) {
          EXPECT_EQ(n0, n1);
          EXPECT_EQ(m0 % 2, 0);
          EXPECT_EQ(m1, m0 + 1);
        } else {
          EXPECT_EQ(m0, pu.mt - 1);
          EXPECT_TRUE(m1 == pu.mt - 1 || (m1 == pu.mt && n1 == pu.nt)) << "unit " << v;
        }
        for (auto [mm, nn] : {std::pair{m0, n0}, std::pair{m1, n1}}) {
          if (mm == pu.mt && nn == pu.nt) {
            ++empty;
            continue;
          }
          ASSERT_LT(mm, pu.mt);
          ASSERT_LT(nn, pu.nt);
          ++seen[{mm, nn}];
        }
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), int64_t(pu.mt) * pu.nt);
      for (const auto& [tile, count] : seen) EXPECT_EQ(count, 1);
      EXPECT_EQ(empty, pu.s * (pu.nt % 2));  // one per expert with a single and odd columns
    }
}

TEST(PairUnits, NoRowsNoUnits) { EXPECT_EQ((PairUnits<128, 256>(0, 2048).units()), 0); }

}  // namespace
