// The device layout of microscaling weights (pipeline/sm90_mx_layout.hpp), decoded back on the
// host the way the GEMV reads it (the 16-byte chunks of a row and their scale bytes, row-major):
// every weight bit-equal to quant::dequantize_expert's at its source row, FC1's rows in the
// blocked gate/up order gathered from gpt-oss's interleaved ones. Bad arguments, an e8m0 scale
// 0xff and shapes off the kernels' alignment are refused with the value named.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "activation/gate_up_order.hpp"
#include "common/numeric.hpp"
#include "moekit/status.hpp"
#include "pipeline/sm90_mx_layout.hpp"
#include "quant/quant.hpp"

namespace moekit::pipeline {
namespace {

QuantizedTensor random_tensor(WeightFormat f, int64_t experts, int64_t rows, int64_t cols,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(experts * rows * cols));
  for (float& x : w) x = normal(rng);
  WeightQuant q;
  q.format = f;
  q.group_size = format_scale_group(f, 0);
  return quant::quantize(q, experts, rows, cols, w.data(), 4.0f, seed);
}

// Weight c of a device-layout row, decoded as the GEMV decodes it.
float decode_at(const QuantizedTensor& t, int64_t e, const uint8_t* row, const uint8_t* srow,
                int64_t c) {
  switch (t.format) {
    case WeightFormat::kMXFP4:
      return numeric::e2m1_to_float((row[c / 2] >> (4 * (c % 2))) & 0xf) *
             numeric::e8m0_to_float(srow[c / 32]);
    case WeightFormat::kNVFP4:
      return numeric::e2m1_to_float((row[c / 2] >> (4 * (c % 2))) & 0xf) *
             (numeric::e4m3_to_float(srow[c / 16]) * t.global_scale[static_cast<std::size_t>(e)]);
    default:  // kMXFP8
      return numeric::e4m3_to_float(row[c]) * numeric::e8m0_to_float(srow[c / 32]);
  }
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::pair<ErrorCode, std::string> code_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return {e.code(), std::string(e.what())};
  }
  return {ErrorCode::kOk, std::string()};
}

TEST(Sm90MxLayout, DecodesToTheReferenceWeightsBitEqual) {
  const int64_t E = 3, R = 32, C = 128;
  for (const WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kNVFP4, WeightFormat::kMXFP8})
    for (const bool reorder : {false, true}) {
      SCOPED_TRACE(std::string(to_string(f)) + (reorder ? " blocked rows" : ""));
      const QuantizedTensor t = random_tensor(f, E, R, C, 11 + static_cast<int>(f));
      const int bits = format_value_bits(f), block = format_scale_group(f, 0);
      ASSERT_EQ(mx_expert_value_bytes(t), R * C * bits / 8);
      ASSERT_EQ(mx_expert_scale_bytes(t), R * C / block);
      const std::vector<int64_t> order =
          activation::blocked_fc1_source_rows(GateUpLayout::kInterleaved, R / 2);
      std::vector<uint8_t> values(static_cast<std::size_t>(mx_expert_value_bytes(t)));
      std::vector<uint8_t> scales(static_cast<std::size_t>(mx_expert_scale_bytes(t)));
      std::vector<float> ref(static_cast<std::size_t>(R * C));
      for (int64_t e = 0; e < E; ++e) {
        mx_expert_layout(t, e, reorder ? &order : nullptr, values.data(), scales.data());
        quant::dequantize_expert(t, e, ref.data());
        for (int64_t r = 0; r < R; ++r) {
          const int64_t from = reorder ? order[static_cast<std::size_t>(r)] : r;
          const uint8_t* row = values.data() + r * C * bits / 8;
          const uint8_t* srow = scales.data() + r * (C / block);
          for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(bits_of(decode_at(t, e, row, srow, c)),
                      bits_of(ref[static_cast<std::size_t>(from * C + c)]))
                << "expert " << e << " row " << r << " col " << c;
        }
      }
    }
}

// gpt-oss's FC1 rows (2 x I, interleaved) and FC2's K pass; K off the 32-wide chunks and rows
// off 8 are refused naming the value.
TEST(Sm90MxLayout, ChecksTheKernelsAlignment) {
  for (const WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kNVFP4, WeightFormat::kMXFP8}) {
    EXPECT_TRUE(mx_check_matrix(f, 2 * 2880, 2880, "fc1").ok());  // gpt-oss-120b
    EXPECT_TRUE(mx_check_matrix(f, 2880, 2880, "fc2").ok());
    Status st = mx_check_matrix(f, 2880, 2880 + 16, "fc2");
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
    EXPECT_NE(st.message().find("2896"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("fc2"), std::string::npos) << st.message();
    st = mx_check_matrix(f, 2 * 2882, 2880, "fc1");
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
    EXPECT_NE(st.message().find("5764"), std::string::npos) << st.message();
  }
  const Status st = mx_check_matrix(WeightFormat::kInt4Group, 64, 64, "fc1");
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("int4_group"), std::string::npos) << st.message();
}

TEST(Sm90MxLayout, RefusesBadArguments) {
  QuantizedTensor t = random_tensor(WeightFormat::kMXFP4, 2, 16, 64, 3);
  std::vector<uint8_t> v(static_cast<std::size_t>(mx_expert_value_bytes(t)));
  std::vector<uint8_t> s(static_cast<std::size_t>(mx_expert_scale_bytes(t)));
  auto [c1, m1] = code_of([&] { mx_expert_layout(t, 2, nullptr, v.data(), s.data()); });
  EXPECT_EQ(c1, ErrorCode::kInvalidArgument);
  EXPECT_NE(m1.find("expert 2"), std::string::npos) << m1;
  std::vector<int64_t> short_order(3, 0);
  auto [c2, m2] = code_of([&] { mx_expert_layout(t, 0, &short_order, v.data(), s.data()); });
  EXPECT_EQ(c2, ErrorCode::kInvalidArgument);
  EXPECT_NE(m2.find("3"), std::string::npos) << m2;
  std::vector<int64_t> bad_order(16, 0);
  bad_order[5] = 16;
  auto [c3, m3] = code_of([&] { mx_expert_layout(t, 0, &bad_order, v.data(), s.data()); });
  EXPECT_EQ(c3, ErrorCode::kInvalidArgument);
  EXPECT_NE(m3.find("16"), std::string::npos) << m3;
  auto [c4, m4] = code_of([&] { mx_expert_layout(t, 0, nullptr, nullptr, s.data()); });
  EXPECT_EQ(c4, ErrorCode::kInvalidArgument) << m4;
  QuantizedTensor bf16;
  bf16.format = WeightFormat::kBF16;
  auto [c5, m5] = code_of([&] { mx_expert_layout(bf16, 0, nullptr, v.data(), s.data()); });
  EXPECT_EQ(c5, ErrorCode::kUnsupported);
  EXPECT_NE(m5.find("bf16"), std::string::npos) << m5;
  // An e8m0 NaN scale: expert 1, row 3, block 1 (of 2 per row).
  t.scale_bytes[static_cast<std::size_t>(1 * 16 * 2 + 3 * 2 + 1)] = 0xff;
  auto [c6, m6] = code_of([&] { mx_expert_layout(t, 1, nullptr, v.data(), s.data()); });
  EXPECT_EQ(c6, ErrorCode::kInvalidArgument);
  EXPECT_NE(m6.find("expert 1 row 3 block 1"), std::string::npos) << m6;
  EXPECT_NO_THROW(mx_expert_layout(t, 0, nullptr, v.data(), s.data()));  // the other expert
  // NVFP4's e4m3 block scales have no such code: 0xff is a NaN value the kernels decode.
  QuantizedTensor nv = random_tensor(WeightFormat::kNVFP4, 1, 16, 64, 5);
  nv.scale_bytes[7] = 0xff;
  std::vector<uint8_t> nvv(static_cast<std::size_t>(mx_expert_value_bytes(nv)));
  std::vector<uint8_t> nvs(static_cast<std::size_t>(mx_expert_scale_bytes(nv)));
  EXPECT_NO_THROW(mx_expert_layout(nv, 0, nullptr, nvv.data(), nvs.data()));
  EXPECT_EQ(nvs[7], 0xff);
}

}  // namespace
}  // namespace moekit::pipeline
