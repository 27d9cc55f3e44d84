// Checked size products (common/checked.hpp) and the weight-buffer sizing that uses them.
#include "common/checked.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "moekit/status.hpp"
#include "moekit/weights.hpp"

namespace moekit {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedProduct, ExactOrNothing) {
  EXPECT_EQ(checked_product({}), 1);
  EXPECT_EQ(checked_product({16384, 7168, 2}), int64_t{16384} * 7168 * 2);
  EXPECT_EQ(checked_product({kMax, 1}), kMax);
  EXPECT_EQ(checked_product({0, kMax, kMax}), 0) << "an empty extent makes an exact 0";
  EXPECT_EQ(checked_product({kMax, 0}), 0);
  EXPECT_EQ(checked_product({int64_t{1} << 32, int64_t{1} << 31}), std::nullopt);
  EXPECT_EQ(checked_product({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_EQ(checked_product({-1, 5}), std::nullopt);
}

TEST(CheckedProduct, ThrowNamesTheFactors) {
  try {
    product_or_throw({int64_t{1} << 40, int64_t{1} << 40}, "the hidden buffer");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("the hidden buffer (1099511627776 x 1099511627776)"),
              std::string::npos)
        << e.what();
  }
}

// Extents read from a file can be anything: the expected buffer sizes never wrap around.
TEST(CheckedProduct, WeightBufferSizesFromHugeExtents) {
  QuantizedTensor t;
  t.format = WeightFormat::kBF16;
  t.experts = int64_t{1} << 30;
  t.rows = int64_t{1} << 30;
  t.cols = int64_t{1} << 30;
  try {
    t.check_sizes("fc1");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1073741824"), std::string::npos) << e.what();
  }
  t.experts = 1;
  t.rows = 1;
  t.cols = kMax - 1;  // even, so the row byte count is the first product to overflow
  EXPECT_THROW(t.check_sizes("fc2"), Error);
  t.format = WeightFormat::kFP8Block128;
  t.group_size = 128;
  t.rows = kMax;
  t.cols = 128;
  EXPECT_THROW(t.check_sizes("fc2"), Error);
}

}  // namespace
}  // namespace moekit
