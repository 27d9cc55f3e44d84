// The sm90 int engine's device layout of int group weights (pipeline/sm90_int_layout.hpp),
// decoded back on the host the way its kernels read it: signed codes, transposed fp32 scales and
// zero terms, FC1's rows in the blocked gate/up order. Without zero points q' * s is the
// reference's dequantized weight exactly; with them q' * s + zero_term is it up to the fp32
// rounding of the two products. Bad arguments are refused with the value named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "activation/gate_up_order.hpp"
#include "moekit/status.hpp"
#include "pipeline/sm90_int_layout.hpp"
#include "quant/quant.hpp"

namespace moekit::pipeline {
namespace {

// The signed code of element c of a device-layout row.
int code_at(const uint8_t* row, int64_t c, int bits) {
  if (bits == 8) return static_cast<int8_t>(row[c]);
  const int nibble = (row[c / 2] >> (4 * (c % 2))) & 0xf;
  return (nibble ^ 8) - 8;
}

QuantizedTensor random_tensor(WeightFormat f, int group, bool zero, bool pre, int64_t experts,
                              int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(experts * rows * cols));
  for (float& x : w) x = normal(rng) + (zero ? 0.7f : 0.0f);  // asymmetric where zero points
  WeightQuant q;
  q.format = f;
  q.group_size = group;
  q.zero_points = zero;
  q.pre_quant_scale = pre;
  return quant::quantize(q, experts, rows, cols, w.data(), 4.0f, seed);
}

TEST(Sm90IntLayout, DecodesToTheReferenceWeights) {
  const int64_t E = 3, R = 32, C = 256;
  for (const WeightFormat f : {WeightFormat::kInt4Group, WeightFormat::kInt8Group})
    for (const int group : {32, 64, 128})
      for (const bool zero : {false, true})
        for (const bool reorder : {false, true}) {
          SCOPED_TRACE(std::string(to_string(f)) + " group " + std::to_string(group) +
                       (zero ? " zero points" : "") + (reorder ? " blocked rows" : ""));
          const QuantizedTensor t = random_tensor(f, group, zero, false, E, R, C, 7 + group);
          const int bits = int_group_bits(f);
          ASSERT_EQ(int_expert_value_bytes(t), R * C * bits / 8);
          ASSERT_EQ(int_expert_group_entries(t), R * (C / group));
          const std::vector<int64_t> order =
              activation::blocked_fc1_source_rows(GateUpLayout::kHalves, R / 2);
          std::vector<uint8_t> values(static_cast<std::size_t>(int_expert_value_bytes(t)));
          std::vector<float> scales(static_cast<std::size_t>(int_expert_group_entries(t)));
          std::vector<float> zeros(zero ? scales.size() : 0);
          std::vector<float> ref(static_cast<std::size_t>(R * C));
          for (int64_t e = 0; e < E; ++e) {
            int_expert_layout(t, e, reorder ? &order : nullptr, values.data(), scales.data(),
                              zero ? zeros.data() : nullptr);
            quant::dequantize_expert(t, e, ref.data());
            int64_t exact = 0;
            for (int64_t r = 0; r < R; ++r) {
              const int64_t from = reorder ? order[static_cast<std::size_t>(r)] : r;
              const uint8_t* row = values.data() + r * C * bits / 8;
              for (int64_t c = 0; c < C; ++c) {
                const int64_t at = (c / group) * R + r;  // [C / group, R]
                const float s = scales[static_cast<std::size_t>(at)];
                const float q = static_cast<float>(code_at(row, c, bits));
                const float w = zero ? q * s + zeros[static_cast<std::size_t>(at)] : q * s;
                const float want = ref[static_cast<std::size_t>(from * C + c)];
                if (!zero) {
                  ASSERT_EQ(w, want) << "expert " << e << " row " << r << " col " << c;
                } else {
                  // Two products of codes of at most 2^bits times s, each within half an ulp.
                  ASSERT_NEAR(w, want, std::fabs(s) * (1 << bits) * 1e-6f)
                      << "expert " << e << " row " << r << " col " << c;
                }
                exact += w == want;
              }
            }
            EXPECT_GT(exact, 0);
          }
        }
}

TEST(Sm90IntLayout, RefusesBadArguments) {
  const QuantizedTensor t = random_tensor(WeightFormat::kInt4Group, 64, true, false, 2, 16, 128, 3);
  std::vector<uint8_t> v(static_cast<std::size_t>(int_expert_value_bytes(t)));
  std::vector<float> s(static_cast<std::size_t>(int_expert_group_entries(t))), z(s.size());
  const auto code = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(ErrorCode::kOk, std::string());
  };
  auto [c1, m1] = code([&] { int_expert_layout(t, 2, nullptr, v.data(), s.data(), z.data()); });
  EXPECT_EQ(c1, ErrorCode::kInvalidArgument);
  EXPECT_NE(m1.find("expert 2"), std::string::npos) << m1;
  auto [c2, m2] = code([&] { int_expert_layout(t, 0, nullptr, v.data(), s.data(), nullptr); });
  EXPECT_EQ(c2, ErrorCode::kInvalidArgument) << m2;
  std::vector<int64_t> short_order(3, 0);
  auto [c3, m3] =
      code([&] { int_expert_layout(t, 0, &short_order, v.data(), s.data(), z.data()); });
  EXPECT_EQ(c3, ErrorCode::kInvalidArgument);
  EXPECT_NE(m3.find("3"), std::string::npos) << m3;
  std::vector<int64_t> bad_order(16, 0);
  bad_order[5] = 16;
  auto [c4, m4] = code([&] { int_expert_layout(t, 0, &bad_order, v.data(), s.data(), z.data()); });
  EXPECT_EQ(c4, ErrorCode::kInvalidArgument);
  EXPECT_NE(m4.find("16"), std::string::npos) << m4;
  QuantizedTensor bf16;
  bf16.format = WeightFormat::kBF16;
  auto [c5, m5] = code([&] { int_expert_layout(bf16, 0, nullptr, v.data(), s.data(), z.data()); });
  EXPECT_EQ(c5, ErrorCode::kUnsupported);
  EXPECT_NE(m5.find("bf16"), std::string::npos) << m5;
}

}  // namespace
}  // namespace moekit::pipeline
