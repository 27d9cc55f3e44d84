// The 2x1 pair tiles' units (gemm/pair_units.hpp): every tile of an expert computed exactly
// once, pairs on the same column, singles on the last row tile, empty tiles only past the
// problem, and the pair/single choice both blocks of a unit agree on.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "gemm/pair_units.hpp"

namespace {

using moekit::gemm::PairUnits;

// The tiles built: 128 x 256 and 128 x 240 (sm90_grouped.cuh).
template <int TileN>
void expect_every_tile_once() {
  for (int m : {1, 64, 128, 129, 256, 300, 512, 640, 1000, 4096})
    for (int n : {64, 200, 240, 256, 257, 1536, 2048, 2880, 5760, 7168}) {
      SCOPED_TRACE("tile n " + std::to_string(TileN) + " m " + std::to_string(m) + " n " +
                   std::to_string(n));
      const PairUnits<128, TileN> pu(m, n);
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

TEST(PairUnits, EveryTileOnceInUnitsBothBlocksAgreeOn) {
  expect_every_tile_once<256>();
  expect_every_tile_once<240>();
}

// The pick's rule between the two widths: 240 only where it pads fewer columns.
TEST(PairUnits, TileWidthPaddingLeast) {
  using moekit::gemm::pair_tile_pads_less;
  EXPECT_TRUE(pair_tile_pads_less(2880, 240, 256));   // gpt-oss FC2: 0 against 192
  EXPECT_TRUE(pair_tile_pads_less(5760, 240, 256));   // gpt-oss FC1: 0 against 128
  EXPECT_FALSE(pair_tile_pads_less(1536, 240, 256));  // qwen3 FC1: 256 divides it
  EXPECT_FALSE(pair_tile_pads_less(7168, 240, 256));  // deepseek FC2
  EXPECT_FALSE(pair_tile_pads_less(3000, 240, 256));  // 120 against 72
  EXPECT_FALSE(pair_tile_pads_less(3840, 240, 256));  // both divide it: a tie keeps 256
}

TEST(PairUnits, NoRowsNoUnits) { EXPECT_EQ((PairUnits<128, 256>(0, 2048).units()), 0); }

}  // namespace
