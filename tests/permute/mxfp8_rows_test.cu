// permute::round_rows_to_mxfp8, MXFP8's activations through e4m3 per 32 columns on rows in expert
// order: every filled row (r < offsets[L]) bit for bit as quant::prepare_activations (kMXFP8)
// rounds it for the reference, stored in the activation type; the rows past offsets[L] left as
// they were. Groups scaled by powers of two from 2^-40 to 2^40, all-zero groups, a NaN, bf16 and
// fp16; and what it refuses (without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moekit/weights.hpp"
#include "permute/permute.hpp"
#include "quant/quant.hpp"
#include "support/gpu.hpp"

namespace moekit::permute {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class Mxfp8RowsTest : public GpuTest {};

TEST_F(Mxfp8RowsTest, RowsAsTheReferenceRoundsThem) {
  std::mt19937_64 rng(base_seed() ^ 0xc02);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  const int L = 4;
  const int64_t cols = 352, max_rows = 37;                 // 11 groups of 32 per row
  const std::vector<int32_t> offsets = {0, 9, 9, 20, 30};  // expert 1 empty; rows 30.. unfilled
  QuantizedTensor t;  // what prepare_activations reads: the format and the columns
  t.format = WeightFormat::kMXFP8;
  t.experts = 1;
  t.cols = cols;
  for (const DType elem : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> x(static_cast<std::size_t>(max_rows * cols));
    for (int64_t g = 0; g < max_rows * cols / 32; ++g) {
      // fp16 holds 2^-14 .. 65504 (and subnormals to 2^-24): its groups stay within +-2^10.
      const int e = elem == DType::kFloat16 ? exponent(rng) / 4 : exponent(rng);
      for (int64_t c = 0; c < 32; ++c)
        x[static_cast<std::size_t>(g * 32 + c)] = g % 7 == 3 ? 0.0f : std::ldexp(normal(rng), e);
    }
    x[5 * cols + 40] = NAN;  // a NaN: NaN out, skipped by its group's amax
    std::vector<uint16_t> rows(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) rows[i] = to_bits(elem, x[i]);
    DeviceBuffer d_off = to_device(offsets), d_rows = to_device(rows);
    const Mxfp8Rows c{d_off.as<int32_t>(), L, cols, elem};
    ASSERT_TRUE(prepare_round_rows_to_mxfp8(c).ok());
    ASSERT_TRUE(round_rows_to_mxfp8(c, d_rows.ptr, max_rows, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> out = to_host<uint16_t>(d_rows.ptr, rows.size());
    std::vector<float> want(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) want[i] = from_bits(elem, rows[i]);
    quant::prepare_activations(t, 0, want.data(), offsets[L], elem);
    int64_t wrong = 0, nan = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const bool filled = static_cast<int64_t>(i) < offsets[L] * cols;
      const uint16_t w = filled ? to_bits(elem, want[i]) : rows[i];
      if (std::isnan(want[i])) {
        nan += std::isnan(from_bits(elem, out[i]));
        continue;
      }
      wrong += out[i] != w;
    }
    EXPECT_EQ(wrong, 0) << to_string(elem);
    EXPECT_EQ(nan, 1) << to_string(elem);
  }
}

TEST(Mxfp8RowsLimits, RefusesWhatItDoesNotRun) {
  const Mxfp8Rows fp32{nullptr, 1, 64, DType::kFloat32};
  Status st = prepare_round_rows_to_mxfp8(fp32);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("fp32"), std::string::npos) << st.message();
  const Mxfp8Rows partial{nullptr, 1, 48, DType::kBFloat16};
  st = round_rows_to_mxfp8(partial, nullptr, 4, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("48"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace moekit::permute
