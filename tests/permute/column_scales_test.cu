// permute::apply_column_scales, the AWQ pre-quant scale's products on rows in expert order:
// every filled row (r < offsets[L]) becomes round(float(row) * scales[row_expert[r], :]) bit for
// bit against the host's rounding (quant::round_to), the rows past offsets[L] left as they were;
// bf16 and fp16, empty experts; and what it refuses (without a GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "permute/permute.hpp"
#include "quant/quant.hpp"
#include "support/gpu.hpp"

namespace moekit::permute {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class ColumnScalesTest : public GpuTest {};

TEST_F(ColumnScalesTest, RowsTimesTheirExpertsScales) {
  std::mt19937_64 rng(base_seed() ^ 0xc01);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.5f, 2.0f);
  for (const DType elem : {DType::kBFloat16, DType::kFloat16}) {
    const int L = 5;
    const int64_t cols = 264, max_rows = 40;
    const std::vector<int32_t> offsets = {0, 3, 3, 20, 20, 31};  // experts 1 and 3 empty
    std::vector<int32_t> row_expert(static_cast<std::size_t>(max_rows), -1);
    for (int e = 0; e < L; ++e)
      for (int32_t r = offsets[e]; r < offsets[e + 1]; ++r) row_expert[r] = e;
    std::vector<float> scales(static_cast<std::size_t>(L * cols));
    for (float& s : scales) s = scale(rng);
    std::vector<uint16_t> rows(static_cast<std::size_t>(max_rows * cols));
    fill_bits(rows, elem, normal, rng);
    DeviceBuffer d_off = to_device(offsets), d_re = to_device(row_expert), d_s = to_device(scales),
                 d_rows = to_device(rows);
    ColumnScales c{d_off.as<int32_t>(), d_re.as<int32_t>(), d_s.as<float>(), L, cols, elem};
    ASSERT_TRUE(prepare_apply_column_scales(c).ok());
    ASSERT_TRUE(apply_column_scales(c, d_rows.ptr, max_rows, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> out = to_host<uint16_t>(d_rows.ptr, rows.size());
    int64_t wrong = 0;
    for (int64_t r = 0; r < max_rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const std::size_t i = static_cast<std::size_t>(r * cols + j);
        uint16_t want = rows[i];
        if (r < offsets[L]) {
          const float x =
              from_bits(elem, rows[i]) * scales[static_cast<std::size_t>(row_expert[r] * cols + j)];
          want = to_bits(elem, quant::round_to(elem, x));
        }
        wrong += out[i] != want;
      }
    EXPECT_EQ(wrong, 0) << to_string(elem);
  }
}

TEST(ColumnScalesLimits, RefusesWhatItDoesNotRun) {
  ColumnScales fp32{nullptr, nullptr, nullptr, 1, 64, DType::kFloat32};
  Status st = prepare_apply_column_scales(fp32);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("fp32"), std::string::npos) << st.message();
  ColumnScales odd{nullptr, nullptr, nullptr, 1, 60, DType::kBFloat16};
  st = apply_column_scales(odd, nullptr, 4, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("60"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace moekit::permute
