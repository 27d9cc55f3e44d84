// The checkpoint -> blocked FC1 row order (gate_up_order.hpp): a permutation that puts each
// output's gate and up rows where the engine's blocked order wants them, and the row gather.
#include "activation/gate_up_order.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "activation/activation_math.hpp"
#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::activation {
namespace {

// Checkpoint row of gate j / up j, written out per layout (types.hpp), not via the code under test.
int64_t checkpoint_gate(GateUpLayout l, int64_t I, int64_t j) {
  (void)I;
  return l == GateUpLayout::kHalves ? j : 2 * j;
}
int64_t checkpoint_up(GateUpLayout l, int64_t I, int64_t j) {
  return l == GateUpLayout::kHalves ? I + j : 2 * j + 1;
}

uint64_t fresh_seed() {
  static const uint64_t seed = std::random_device{}();
  return seed;
}

TEST(GateUpOrder, BothLayoutsGiveTheBlockedPermutation) {
  for (GateUpLayout layout : {GateUpLayout::kHalves, GateUpLayout::kInterleaved})
    for (int64_t I : {8, 16, 24, 136, 2048}) {
      SCOPED_TRACE(std::string(to_string(layout)) + " intermediate " + std::to_string(I));
      const std::vector<int64_t> src = blocked_fc1_source_rows(layout, I);
      ASSERT_EQ(static_cast<int64_t>(src.size()), 2 * I);
      std::vector<int64_t> sorted = src;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> iota(sorted.size());
      std::iota(iota.begin(), iota.end(), int64_t{0});
      EXPECT_EQ(sorted, iota) << "not a permutation of [0, 2I)";
      // Engine row 16b + i (i < 8) is gate 8b + i, row 16b + 8 + i is its up.
      for (int64_t r = 0; r < 2 * I; ++r) {
        const int64_t b = r / 16, i = r % 16;
        const int64_t want =
            i < 8 ? checkpoint_gate(layout, I, 8 * b + i) : checkpoint_up(layout, I, 8 * b + i - 8);
        ASSERT_EQ(src[r], want) << "engine row " << r;
      }
      // And the same through the definitions the kernels use.
      for (int64_t j = 0; j < I; ++j) {
        EXPECT_EQ(src[blocked_gate_row(j)], checkpoint_gate(layout, I, j)) << "gate " << j;
        EXPECT_EQ(src[blocked_up_row(j)], checkpoint_up(layout, I, j)) << "up " << j;
      }
    }
}

TEST(GateUpOrder, GatherMovesWeightAndBiasRows) {
  std::mt19937_64 rng(fresh_seed());
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t I = 40, H = 24;
  for (GateUpLayout layout : {GateUpLayout::kHalves, GateUpLayout::kInterleaved}) {
    SCOPED_TRACE(to_string(layout));
    const std::vector<int64_t> src = blocked_fc1_source_rows(layout, I);
    // Weights: 2I rows of H 16-bit elements, random bits.
    std::vector<uint16_t> w(static_cast<std::size_t>(2 * I * H)), w_out(w.size(), 0xdead);
    for (auto& x : w) x = static_cast<uint16_t>(rng());
    gather_rows(src, w.data(), w_out.data(), H * 2);
    // Bias: 2I fp32 values.
    std::vector<float> b(static_cast<std::size_t>(2 * I)), b_out(b.size(), -1.0f);
    for (auto& x : b) x = normal(rng);
    gather_rows(src, b.data(), b_out.data(), 4);
    for (int64_t j = 0; j < I; ++j) {
      const int64_t g = checkpoint_gate(layout, I, j), u = checkpoint_up(layout, I, j);
      EXPECT_EQ(0, std::memcmp(&w_out[blocked_gate_row(j) * H], &w[g * H], H * 2)) << "gate " << j;
      EXPECT_EQ(0, std::memcmp(&w_out[blocked_up_row(j) * H], &w[u * H], H * 2)) << "up " << j;
      EXPECT_EQ(b_out[blocked_gate_row(j)], b[g]) << "gate bias " << j;
      EXPECT_EQ(b_out[blocked_up_row(j)], b[u]) << "up bias " << j;
    }
  }
}

TEST(GateUpOrder, GatherOfNoRowsWritesNothing) {
  const uint8_t src[4] = {1, 2, 3, 4};
  uint8_t dst[4] = {9, 9, 9, 9};
  gather_rows({}, src, dst, 4);
  EXPECT_EQ(dst[0], 9);
  EXPECT_EQ(dst[3], 9);
}

TEST(GateUpOrder, RefusesBadArguments) {
  for (int64_t I : {0, 12, -8}) {
    try {
      blocked_fc1_source_rows(GateUpLayout::kHalves, I);
      ADD_FAILURE() << "intermediate " << I << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << I;
      EXPECT_NE(std::string(e.what()).find(std::to_string(I)), std::string::npos) << e.what();
    }
  }
  try {
    blocked_fc1_source_rows(static_cast<GateUpLayout>(7), 16);
    ADD_FAILURE() << "layout 7 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find('7'), std::string::npos) << e.what();
  }
  const uint8_t src[4] = {};
  uint8_t dst[4] = {};
  try {
    gather_rows({0}, src, dst, -4);
    ADD_FAILURE() << "row_bytes -4 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace moekit::activation
