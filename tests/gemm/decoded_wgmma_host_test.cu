// What of the decoded-weight wgmma kernel (gemm/sm90_decoded_wgmma.cuh) runs on the host, no GPU
// needed. Its tile table (gemm/sm90_decoded_wgmma_tiles.cuh): every (expert, token tile, 256-row
// tile) of a random row distribution exactly once, walking tile_at over the table's inclusive ends.
// Its decoders (gemm/sm90_mx_wgmma_decoder.cuh, gemm/sm90_int_wgmma_decoder.cuh): for one 64-deep k
// stage of four weight rows (a consumer thread's rows g, g + 8 of two m64 tiles), every lane
// position c of a quad and both half stages, each bf16 of the wgmma A fragment must be the weight
// at the row and column the fragment layout puts there (registers: row g k 2c.., row g + 8 k 2c..,
// row g k 2c + 8.., row g + 8 k 2c + 8..; step j of half h covers k 32h + 16j ..), against the
// reference's decode (quant::dequantize_expert):
//  - MXFP4, NVFP4 (global scale 1: the kernel applies it to the sums), MXFP8: bit-equal (NaN
//    where the reference is NaN), random codes and scales, the e8m0 extremes 0 and 254 and NaN
//    0xff, NVFP4 e4m3 0x01 / 0x7e / NaN 0x7f. MXFP8 keeps its e8m0 scales >= 3, the one corner
//    (an e4m3 subnormal under 2^-125) where the bf16 product is not exact.
//  - int4 / int8, groups of 32 and 64, with and without zero points, in the engine's layout
//    (pipeline/sm90_int_layout.hpp): the reference's fp32 weight rounded once to bf16, within one
//    bf16 unit and the fp32 rounding of the kernel's q' * s + zero_term next to (q - z) * s.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "gemm/sm90_decoded_wgmma_tiles.cuh"
#include "gemm/sm90_int_wgmma_decoder.cuh"
#include "gemm/sm90_mx_wgmma_decoder.cuh"
#include "pipeline/sm90_int_layout.hpp"
#include "quant/quant.hpp"

namespace moekit::gemm::detail {
namespace {

constexpr int kRows = 4, kCols = 64;

template <class T>
struct Tag {
  using type = T;
};

// Calls check(row, col, decoded) for every bf16 of the fragments decode() fills for `stage`
// (scales) over rows' bytes at `values` (kCols * bits / 8 per row), every c and half stage.
template <class Dec, class Check>
void for_each_fragment_value(const uint8_t* values, int row_bytes, const typename Dec::Stage& stage,
                             Check&& check) {
  const uint8_t* wrow[4];
  for (int r = 0; r < kRows; ++r) wrow[r] = values + r * row_bytes;
  for (uint32_t c = 0; c < 4; ++c)
    for (int h = 0; h < 2; ++h) {
      uint32_t a[2][2][4];
      Dec::decode(wrow, h, c, stage, a);
      for (int r = 0; r < kRows; ++r) {
        const int i = r >> 1, half = r & 1;
        for (int j = 0; j < 2; ++j)
          for (int reg : {half, 2 + half}) {
            const int col = 32 * h + 16 * j + (reg >= 2 ? 8 : 0) + 2 * static_cast<int>(c);
            for (int e = 0; e < 2; ++e)
              check(r, col + e,
                    bf16_bits_to_float(static_cast<uint16_t>(a[i][j][reg] >> (16 * e))));
          }
      }
    }
}

// The table the kernel builds (ceil(rows / N) x row tiles per group, inclusive prefix) walked
// with tile_at for every tile index: each (group, token tile, row tile) once, none past a
// group's rows or n.
template <int N>
void check_tile_table(const std::vector<int>& rows, int n) {
  const int groups = static_cast<int>(rows.size());
  const int row_tiles = (n + decoded_wgmma::kTileRows - 1) / decoded_wgmma::kTileRows;
  std::vector<int> tile_end(rows.size());
  int total = 0;
  for (int g = 0; g < groups; ++g) tile_end[g] = total += (rows[g] + N - 1) / N * row_tiles;
  std::set<std::tuple<int, int, int>> seen;
  for (int i = 0; i < total; ++i) {
    const decoded_wgmma::Tile t = decoded_wgmma::tile_at<N>(i, tile_end.data(), groups, row_tiles);
    ASSERT_TRUE(t.g >= 0 && t.g < groups) << "tile " << i;
    EXPECT_LT(t.t0, rows[t.g]) << "tile " << i;
    EXPECT_LT(t.n0, n) << "tile " << i;
    EXPECT_EQ(t.t0 % N, 0);
    EXPECT_EQ(t.n0 % decoded_wgmma::kTileRows, 0);
    EXPECT_TRUE(seen.insert({t.g, t.t0, t.n0}).second) << "tile " << i << " twice";
  }
  int64_t want = 0;
  for (int g = 0; g < groups; ++g) want += int64_t((rows[g] + N - 1) / N) * row_tiles;
  EXPECT_EQ(int64_t(seen.size()), want);
}

TEST(DecodedWgmma, TileTableCoversEveryTileOnce) {
  std::mt19937_64 rng(0x7ab1e);
  std::uniform_int_distribution<int> count(0, 300);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int> rows(static_cast<std::size_t>(1 + trial * 13 % 257));
    for (int& r : rows) r = trial % 3 == 0 && rng() % 2 ? 0 : count(rng);
    for (const int n : {40, 256, 2880, 5760}) {
      check_tile_table<128>(rows, n);
      check_tile_table<64>(rows, n);
    }
  }
  check_tile_table<128>({0, 0, 0}, 256);  // no rows: no tiles
  check_tile_table<64>({5}, 8);
}

QuantizedTensor mx_tensor(WeightFormat f, std::mt19937_64& rng) {
  QuantizedTensor t;
  t.format = f;
  t.experts = 1;
  t.rows = kRows;
  t.cols = kCols;
  t.group_size = f == WeightFormat::kNVFP4 ? 16 : 32;
  const int bits = f == WeightFormat::kMXFP8 ? 8 : 4;
  t.values.resize(static_cast<std::size_t>(kRows * kCols * bits / 8));
  for (uint8_t& v : t.values) v = static_cast<uint8_t>(rng());
  const int blocks = kCols / t.group_size;
  t.scale_bytes.resize(static_cast<std::size_t>(kRows * blocks));
  std::uniform_int_distribution<int> e8m0(f == WeightFormat::kMXFP8 ? 3 : 0, 254);
  std::uniform_int_distribution<int> e4m3(0x01, 0x7e);
  for (uint8_t& s : t.scale_bytes)
    s = static_cast<uint8_t>(f == WeightFormat::kNVFP4 ? e4m3(rng) : e8m0(rng));
  // Row 0: the extremes; row 1: a NaN scale in its last block.
  if (f == WeightFormat::kNVFP4) {
    t.scale_bytes[0] = 0x01;
    t.scale_bytes[1] = 0x7e;
    t.scale_bytes[2 * blocks - 1] = 0x7f;
    t.global_scale = {1.0f};
  } else {
    t.scale_bytes[0] = f == WeightFormat::kMXFP8 ? 3 : 0;
    t.scale_bytes[1] = 254;
    t.scale_bytes[2 * blocks - 1] = 0xff;
  }
  return t;
}

TEST(DecodedWgmma, MicroscalingFragmentsAreTheReferenceWeights) {
  std::mt19937_64 rng(0x5eed0d);
  for (const WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kNVFP4, WeightFormat::kMXFP8})
    for (int trial = 0; trial < 8; ++trial) {
      SCOPED_TRACE(std::string(to_string(f)) + " trial " + std::to_string(trial));
      const QuantizedTensor t = mx_tensor(f, rng);
      std::vector<float> ref(static_cast<std::size_t>(kRows * kCols));
      quant::dequantize_expert(t, 0, ref.data());
      const int blocks = kCols / t.group_size;
      // The stage's scale bytes per row, as the kernel loads them (little-endian).
      auto check_all = [&](auto decoder_tag) {
        using Dec = typename decltype(decoder_tag)::type;
        typename Dec::Stage st{};
        for (int r = 0; r < kRows; ++r) {
          uint32_t b = 0;
          memcpy(&b, t.scale_bytes.data() + r * blocks, static_cast<std::size_t>(blocks));
          st.bytes[r] = b;
        }
        int64_t checked = 0, wrong = 0;
        for_each_fragment_value<Dec>(
            t.values.data(), static_cast<int>(t.values.size() / kRows), st,
            [&](int r, int col, float got) {
              const float want = ref[static_cast<std::size_t>(r * kCols + col)];
              ++checked;
              const bool same = std::isnan(want) ? std::isnan(got) : got == want;
              if (!same && wrong++ < 5)
                ADD_FAILURE() << "row " << r << " column " << col << ": " << got << ", reference "
                              << want;
            });
        EXPECT_EQ(checked, int64_t(4 * 2 * kRows * 2 * 2 * 2));  // every (c, h, r, j, reg, e)
        EXPECT_EQ(wrong, 0);
      };
      if (f == WeightFormat::kMXFP4) check_all(Tag<MxDecoder<WeightFormat::kMXFP4>>{});
      if (f == WeightFormat::kNVFP4) check_all(Tag<MxDecoder<WeightFormat::kNVFP4>>{});
      if (f == WeightFormat::kMXFP8) check_all(Tag<MxDecoder<WeightFormat::kMXFP8>>{});
    }
}

TEST(DecodedWgmma, IntFragmentsAreTheReferenceWeightsRoundedOnce) {
  std::mt19937_64 rng(0x1d7e);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const WeightFormat f : {WeightFormat::kInt4Group, WeightFormat::kInt8Group})
    for (const int group : {32, 64})
      for (const bool zero : {false, true}) {
        SCOPED_TRACE(std::string(to_string(f)) + " group " + std::to_string(group) +
                     (zero ? " zero points" : ""));
        WeightQuant q;
        q.format = f;
        q.group_size = group;
        q.zero_points = zero;
        std::vector<float> w(static_cast<std::size_t>(kRows * kCols));
        for (float& x : w) x = normal(rng);
        const QuantizedTensor t = quant::quantize(q, 1, kRows, kCols, w.data(), 4.0f, rng());
        std::vector<float> ref(w.size());
        quant::dequantize_expert(t, 0, ref.data());
        std::vector<uint8_t> values(static_cast<std::size_t>(pipeline::int_expert_value_bytes(t)));
        const int64_t entries = pipeline::int_expert_group_entries(t);
        std::vector<float> scales(static_cast<std::size_t>(entries)),
            zeros(static_cast<std::size_t>(entries));
        pipeline::int_expert_layout(t, 0, nullptr, values.data(), scales.data(),
                                    zero ? zeros.data() : nullptr);
        // The stage's scales and zero terms as the kernel loads them: [k / group, n], n = kRows.
        auto check_all = [&](auto decoder_tag) {
          using Dec = typename decltype(decoder_tag)::type;
          typename Dec::Stage st{};
          for (int h = 0; h < 2; ++h)
            for (int r = 0; r < kRows; ++r) {
              const std::size_t at = static_cast<std::size_t>((32 * h / group) * kRows + r);
              st.s[h][r] = scales[at];
              st.z[h][r] = zero ? zeros[at] : 0.0f;
            }
          int64_t wrong = 0;
          for_each_fragment_value<Dec>(
              values.data(), static_cast<int>(values.size() / kRows), st,
              [&](int r, int col, float got) {
                const float want = ref[static_cast<std::size_t>(r * kCols + col)];
                const float rounded = bf16_bits_to_float(float_to_bf16_bits(want));
                // The kernel's fp32 q' * s + zero_term may miss the reference's (q - z) * s
                // by the fp32 rounding of its two products (sm90_int_layout.hpp).
                const float slack = 0x1p-20f * 256.0f * st.s[col / 32][r];
                if (!(std::fabs(got - rounded) <= 0x1p-8f * std::fabs(want) + slack) && wrong++ < 5)
                  ADD_FAILURE() << "row " << r << " column " << col << ": " << got << ", reference "
                                << want;
              });
          EXPECT_EQ(wrong, 0);
        };
        if (f == WeightFormat::kInt4Group) {
          if (zero)
            check_all(Tag<IntDecoder<4, true>>{});
          else
            check_all(Tag<IntDecoder<4, false>>{});
        } else {
          if (zero)
            check_all(Tag<IntDecoder<8, true>>{});
          else
            check_all(Tag<IntDecoder<8, false>>{});
        }
      }
}

}  // namespace
}  // namespace moekit::gemm::detail
