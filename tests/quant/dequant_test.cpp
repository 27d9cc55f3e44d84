// dequantize_expert and prepare_activations against hand-computed values: nibble order, zero
// points, scale indexing of every format (also for shapes that are not block multiples).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/numeric.hpp"
#include "moekit/status.hpp"
#include "quant/quant.hpp"

namespace moekit::quant {
namespace {

QuantizedTensor tensor(WeightFormat f, int64_t experts, int64_t rows, int64_t cols, int group) {
  QuantizedTensor t;
  t.format = f;
  t.experts = experts;
  t.rows = rows;
  t.cols = cols;
  t.group_size = group;
  t.values.assign(static_cast<std::size_t>(experts * t.expert_value_bytes()), 0);
  return t;
}

std::vector<float> dequant(const QuantizedTensor& t, int64_t e) {
  std::vector<float> out(static_cast<std::size_t>(t.rows * t.cols), -12345.0f);
  dequantize_expert(t, e, out.data());
  return out;
}

TEST(Dequantize, Int4SignedNibbleOrder) {
  // [2 experts, 2 rows, 64 cols], group 32; scales [e][row][group].
  auto t = tensor(WeightFormat::kInt4Group, 2, 2, 64, 32);
  t.scales = {1, 2, 3, 4, 0.5f, 0.25f, 8, 16};  // [e][row][group]
  // Expert 1, row 1, first byte: low nibble 0xF is element 0 (-1), high 0x9 is element 1 (-7).
  const int64_t row_bytes = 32;
  t.values[(1 * 2 + 1) * row_bytes + 0] = 0x9f;
  t.values[(1 * 2 + 1) * row_bytes + 1] = 0x78;   // element 2: -8, element 3: +7
  t.values[(1 * 2 + 1) * row_bytes + 16] = 0x21;  // group 1: element 32: 1, element 33: 2
  const auto w = dequant(t, 1);
  EXPECT_EQ(w[64 + 0], -1.0f * 8);
  EXPECT_EQ(w[64 + 1], -7.0f * 8);
  EXPECT_EQ(w[64 + 2], -8.0f * 8);
  EXPECT_EQ(w[64 + 3], 7.0f * 8);
  EXPECT_EQ(w[64 + 32], 1.0f * 16);
  EXPECT_EQ(w[64 + 33], 2.0f * 16);
  EXPECT_EQ(w[64 + 4], 0.0f);
  EXPECT_EQ(w[0], 0.0f);
  // Expert 0 is untouched.
  for (float v : dequant(t, 0)) EXPECT_EQ(v, 0.0f);
}

TEST(Dequantize, Int4WithZeroPointsIsUnsigned) {
  auto t = tensor(WeightFormat::kInt4Group, 1, 1, 64, 32);
  t.scales = {0.5f, 3.0f};
  t.zeros = {8, 3};
  t.values[0] = 0x9f;   // elements 0, 1: (15 - 8) * 0.5, (9 - 8) * 0.5
  t.values[1] = 0x00;   // (0 - 8) * 0.5 twice
  t.values[16] = 0xf3;  // group 1: (3 - 3) * 3, (15 - 3) * 3
  const auto w = dequant(t, 0);
  EXPECT_EQ(w[0], 3.5f);
  EXPECT_EQ(w[1], 0.5f);
  EXPECT_EQ(w[2], -4.0f);
  EXPECT_EQ(w[3], -4.0f);
  EXPECT_EQ(w[32], 0.0f);
  EXPECT_EQ(w[33], 36.0f);
  EXPECT_EQ(w[34], -9.0f);  // nibble 0 with zero 3
}

TEST(Dequantize, Int8SignedAndWithZeroPoints) {
  auto t = tensor(WeightFormat::kInt8Group, 2, 1, 64, 64);
  t.scales = {0.5f, 0.25f};
  t.values[64 + 0] = 0x80;
  t.values[64 + 1] = 0x7f;
  t.values[64 + 2] = 0xff;
  const auto w = dequant(t, 1);
  EXPECT_EQ(w[0], -128 * 0.25f);
  EXPECT_EQ(w[1], 127 * 0.25f);
  EXPECT_EQ(w[2], -0.25f);
  t.zeros = {128, 130};
  const auto z = dequant(t, 1);
  EXPECT_EQ(z[0], (128 - 130) * 0.25f);
  EXPECT_EQ(z[1], (127 - 130) * 0.25f);
  EXPECT_EQ(z[2], (255 - 130) * 0.25f);
  EXPECT_EQ(z[3], -130 * 0.25f);
}

TEST(Dequantize, Fp8Block128ScaleIndexingForPartialBlocks) {
  // [2, 130, 200]: scale blocks [2 x 2] per expert; the last row/column blocks are partial.
  auto t = tensor(WeightFormat::kFP8Block128, 2, 130, 200, 128);
  t.scales = {1, 2, 4, 8, 16, 32, 64, 128};
  std::fill(t.values.begin(), t.values.end(), 0x38);  // 1.0
  const int64_t n = 130 * 200;
  t.values[n + 129 * 200 + 199] = 0xc0;  // -2.0 in expert 1's last element
  for (int e = 0; e < 2; ++e) {
    const auto w = dequant(t, e);
    const float* s = t.scales.data() + e * 4;
    for (int64_t r = 0; r < 130; ++r)
      for (int64_t c = 0; c < 200; ++c) {
        if (e == 1 && r == 129 && c == 199) continue;
        ASSERT_EQ(w[r * 200 + c], s[(r / 128) * 2 + c / 128]) << e << " " << r << " " << c;
      }
  }
  const auto w1 = dequant(t, 1);
  EXPECT_EQ(w1[0], 16.0f);
  EXPECT_EQ(w1[127 * 200 + 127], 16.0f);
  EXPECT_EQ(w1[127 * 200 + 128], 32.0f);
  EXPECT_EQ(w1[128 * 200 + 0], 64.0f);
  EXPECT_EQ(w1[129 * 200 + 199], -2.0f * 128);
}

TEST(Dequantize, Fp8PerTensorAndNaNCodes) {
  auto t = tensor(WeightFormat::kFP8PerTensor, 2, 1, 4, 0);
  t.weight_scale = {0.5f, 3.0f};
  t.input_scale = {1.0f, 1.0f};
  t.values = {0x38, 0x7e, 0xb4, 0x7f, 0x01, 0x80, 0xfe, 0xff};
  const auto w0 = dequant(t, 0), w1 = dequant(t, 1);
  EXPECT_EQ(w0[0], 0.5f);
  EXPECT_EQ(w0[1], 224.0f);
  EXPECT_EQ(w0[2], -0.375f);  // 0xb4: -(1.5 * 2^-1) * 0.5
  EXPECT_TRUE(std::isnan(w0[3]));
  EXPECT_EQ(w1[0], 0.001953125f * 3.0f);
  EXPECT_EQ(w1[1], 0.0f);
  EXPECT_EQ(w1[2], -1344.0f);
  EXPECT_TRUE(std::isnan(w1[3]));
}

TEST(Dequantize, MXFP4ScaleIndexingAndNibbleOrder) {
  // [2, 2, 64]: e8m0 scales [2, 2, 2].
  auto t = tensor(WeightFormat::kMXFP4, 2, 2, 64, 32);
  t.scale_bytes = {127, 128, 125, 130, 127, 127, 126, 0xff};
  t.values[0] = 0x72;        // e0 r0: element 0 = e2m1 2 (1.0), element 1 = e2m1 7 (6.0), scale 1
  t.values[16] = 0x9d;       // e0 r0 group 1 (scale 2): element 32 = -3, element 33 = -0.5
  t.values[32 + 15] = 0x5c;  // e0 r1 group 0 (scale 0.25): element 30 = -2, element 31 = 3
  t.values[32 + 16] = 0x01;  // e0 r1 group 1 (scale 8): element 32 = 0.5
  t.values[64 + 32] = 0x11;  // e1 r1 group 0 (scale 0.5)
  const auto w = dequant(t, 0);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], 6.0f);
  EXPECT_EQ(w[32], -6.0f);
  EXPECT_EQ(w[33], -1.0f);
  EXPECT_EQ(w[64 + 30], -0.5f);
  EXPECT_EQ(w[64 + 31], 0.75f);
  EXPECT_EQ(w[64 + 32], 4.0f);
  const auto w1 = dequant(t, 1);
  EXPECT_EQ(w1[64 + 0], 0.25f);
  EXPECT_EQ(w1[64 + 1], 0.25f);
  EXPECT_TRUE(std::isnan(w1[64 + 32]));  // scale 0xff is NaN
}

TEST(Dequantize, NVFP4UsesE4M3BlockScalesAndTheGlobalScale) {
  // [2, 1, 32]: e4m3 scales [2, 1, 2], global scales per expert.
  auto t = tensor(WeightFormat::kNVFP4, 2, 1, 32, 16);
  t.scale_bytes = {0x40, 0x3c, 0x30, 0x01};  // 2.0, 1.5, 0.5, 2^-9
  t.global_scale = {0.5f, 4.0f};
  t.values[0] = 0xf1;       // element 0: 0.5, element 1: -6
  t.values[8] = 0x07;       // element 16: 6 (scale 1.5), element 17: 0
  t.values[16 + 8] = 0x60;  // expert 1, element 16: 0, element 17: 4
  const auto w = dequant(t, 0);
  EXPECT_EQ(w[0], 0.5f * 2.0f * 0.5f);
  EXPECT_EQ(w[1], -6.0f * 2.0f * 0.5f);
  EXPECT_EQ(w[16], 6.0f * 1.5f * 0.5f);
  EXPECT_EQ(w[17], 0.0f);
  const auto w1 = dequant(t, 1);
  EXPECT_EQ(w1[17], 4.0f * 0.001953125f * 4.0f);
}

// ModelOpt's order: the block scale times the global scale first, then the element
// (NVFP4QTensor.dequantize); with 1.5 x 0.6875 x 0.1 the two orders differ.
TEST(Dequantize, NVFP4MultipliesTheScalesFirst) {
  auto t = tensor(WeightFormat::kNVFP4, 1, 1, 16, 16);
  t.scale_bytes = {0x33};  // 0.6875
  t.global_scale = {0.1f};
  t.values[0] = 0x03;                               // element 0: 1.5
  volatile float s = 0.6875f, gs = 0.1f, e = 1.5f;  // fp32 products, no constant folding
  const float block = s * gs;
  EXPECT_EQ(dequant(t, 0)[0], e * block);
  const float other_order = (e * s) * gs;
  EXPECT_NE(e * block, other_order);  // the order is visible with these values
  // A NaN block scale (e4m3 0x7f) is not refused: its 16 weights decode to NaN (types.hpp).
  t.scale_bytes = {0x7f};
  for (float v : dequant(t, 0)) EXPECT_TRUE(std::isnan(v));
}

TEST(Dequantize, MXFP8AndPlainFormats) {
  auto t = tensor(WeightFormat::kMXFP8, 1, 1, 64, 32);
  t.scale_bytes = {126, 131};
  t.values[0] = 0x40;   // 2.0 * 0.5
  t.values[33] = 0xc4;  // -3.0 * 16
  const auto w = dequant(t, 0);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[33], -48.0f);

  auto b = tensor(WeightFormat::kBF16, 1, 1, 2, 0);
  b.values = {0x80, 0x3f, 0x49, 0xc0};  // 1.0, -3.140625 (little endian)
  EXPECT_EQ(dequant(b, 0), (std::vector<float>{1.0f, -3.140625f}));
  auto h = tensor(WeightFormat::kFP16, 1, 1, 2, 0);
  h.values = {0x00, 0x3c, 0x01, 0x80};  // 1.0, -2^-24
  EXPECT_EQ(dequant(h, 0), (std::vector<float>{1.0f, -std::ldexp(1.0f, -24)}));
  auto f = tensor(WeightFormat::kFP32, 1, 1, 1, 0);
  const float x = 0.1f;
  std::memcpy(f.values.data(), &x, 4);
  EXPECT_EQ(dequant(f, 0)[0], 0.1f);
}

TEST(Dequantize, RejectsBadExpertsAndBuffers) {
  auto t = tensor(WeightFormat::kMXFP4, 2, 1, 32, 32);
  t.scale_bytes = {127, 127};
  std::vector<float> out(32);
  try {
    dequantize_expert(t, 2, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("2"), std::string::npos);
  }
  t.scale_bytes.pop_back();
  EXPECT_THROW(dequantize_expert(t, 0, out.data()), Error);
}

// ModelOpt / TensorRT-LLM multiply the activations by pre_quant_scale (types.hpp).
TEST(PrepareActivations, AwqMultipliesByThePreQuantScale) {
  auto t = tensor(WeightFormat::kInt4Group, 2, 1, 32, 32);
  t.scales = {1, 1};
  std::vector<float> x(2 * 32);
  for (int i = 0; i < 64; ++i) x[i] = 0.1f * static_cast<float>(i + 1);
  auto none = x;
  prepare_activations(t, 1, none.data(), 2, DType::kFloat32);
  EXPECT_EQ(none, x);  // no pre-quant scale: unchanged
  t.pre_quant_scale.resize(64);
  for (int i = 0; i < 64; ++i) t.pre_quant_scale[i] = i < 32 ? 100.0f : 0.5f + 0.1f * (i - 32);
  auto y = x;
  prepare_activations(t, 1, y.data(), 2, DType::kFloat32);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 32; ++c)
      ASSERT_EQ(y[r * 32 + c], x[r * 32 + c] * t.pre_quant_scale[32 + c]);
  EXPECT_EQ(y[0], 0.05f);  // 0.1 * 0.5
  // With bf16 activations the product is rounded to bf16, as TensorRT-LLM's bf16 product is.
  auto b = x;
  prepare_activations(t, 1, b.data(), 2, DType::kBFloat16);
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(b[i], round_to(DType::kBFloat16, x[i] * t.pre_quant_scale[32 + i % 32])) << i;
  EXPECT_NE(b, y);
}

TEST(PrepareActivations, Fp8PerTensorUsesTheStaticScale) {
  auto t = tensor(WeightFormat::kFP8PerTensor, 2, 1, 4, 0);
  t.weight_scale = {1, 1};
  t.input_scale = {1.0f, 0.5f};
  std::vector<float> x = {1.3f, 300.0f, -0.01f, 0.0f};
  prepare_activations(t, 1, x.data(), 1, DType::kFloat32);
  EXPECT_EQ(x[0], 1.25f);          // 2.6 -> 2.5
  EXPECT_EQ(x[1], 224.0f);         // 600 saturates to 448
  EXPECT_EQ(x[2], -0.009765625f);  // -0.02 -> -10 * 2^-9
  EXPECT_EQ(x[3], 0.0f);
}

// WeightQuant::dynamic_activations (no input_scale): one scale per token, amax / 448 floored at
// 1 / (448 * 512) as vLLM's per-token FP8 quantization floors it.
TEST(PrepareActivations, Fp8PerTensorDynamicPerToken) {
  auto t = tensor(WeightFormat::kFP8PerTensor, 1, 1, 4, 0);
  t.weight_scale = {1};
  t.input_scale.clear();
  std::vector<float> x = {448.0f, 2.6f, -1.0f, 0.0f,   // token 0: scale 1
                          0.0f,   0.0f, 0.0f,  0.0f,   // token 1: zeros stay zeros
                          1e-4f,  0.0f, 0.0f,  0.0f};  // token 2: the floor 1 / (448 * 512)
  prepare_activations(t, 0, x.data(), 3, DType::kFloat32);
  EXPECT_EQ(x[0], 448.0f);
  EXPECT_EQ(x[1], 2.5f);
  EXPECT_EQ(x[2], -1.0f);
  for (int i = 3; i < 8; ++i) EXPECT_EQ(x[i], 0.0f) << i;
  const float floor = 1.0f / (448.0f * 512.0f);
  EXPECT_EQ(x[8], numeric::e4m3_to_float_hd(numeric::float_to_e4m3_hd(1e-4f / floor)) * floor);
}

// sat_e4m3 (types.hpp): nearest even, +-448 beyond the range (infinities too), NaN stays NaN.
TEST(PrepareActivations, E4m3SaturatesAndKeepsNaN) {
  auto t = tensor(WeightFormat::kFP8PerTensor, 1, 1, 6, 0);
  t.weight_scale = {1};
  t.input_scale = {1.0f};
  std::vector<float> x = {INFINITY, -INFINITY, NAN, 464.0f, 463.9f, 17.0f};
  prepare_activations(t, 0, x.data(), 1, DType::kFloat32);
  EXPECT_EQ(x[0], 448.0f);
  EXPECT_EQ(x[1], -448.0f);
  EXPECT_TRUE(std::isnan(x[2]));
  EXPECT_EQ(x[3], 448.0f);  // the midpoint to the next (absent) code 480: saturates
  EXPECT_EQ(x[4], 448.0f);
  EXPECT_EQ(x[5], 16.0f);  // between 16 and 18: the tie goes to the even code, 16
}

TEST(PrepareActivations, Fp8Block128PerTokenPer128Columns) {
  // cols 200: groups [0, 128) and the partial [128, 200); two tokens.
  auto t = tensor(WeightFormat::kFP8Block128, 1, 1, 200, 128);
  t.scales = {1, 1};
  std::vector<float> x(400, 0.0f);
  x[0] = 7.0f;     // amax 7: s = 7/448 = 2^-6 exactly
  x[1] = 1.0f;     // 64: exact
  x[2] = 0.3f;     // 19.2 -> 20 -> 0.3125
  x[3] = -0.05f;   // -3.2 -> -3.25 -> -0.05078125
  x[130] = -3.5f;  // group 1: amax 3.5, s = 2^-7
  x[131] = 0.01f;  // 1.28 -> 1.25 -> 0.009765625
  // Token 1 stays all zero: the 1e-10 floor keeps it finite.
  prepare_activations(t, 0, x.data(), 2, DType::kFloat32);
  EXPECT_EQ(x[0], 7.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_EQ(x[2], 0.3125f);
  EXPECT_EQ(x[3], -0.05078125f);
  EXPECT_EQ(x[4], 0.0f);
  EXPECT_EQ(x[130], -3.5f);
  EXPECT_EQ(x[131], 0.009765625f);
  for (int c = 0; c < 200; ++c) ASSERT_EQ(x[200 + c], 0.0f);
}

TEST(PrepareActivations, MXFP8PerTokenPer32ColumnsWithPowerOfTwoScales) {
  auto t = tensor(WeightFormat::kMXFP8, 1, 1, 64, 32);
  t.scale_bytes = {127, 127};
  std::vector<float> x(64, 0.0f);
  x[0] = 3.0f;     // amax/448 = 0.0067 -> s = 2^-7; 3 / s = 384, exact
  x[1] = 0.1f;     // 12.8 -> 13 -> 0.1015625
  x[2] = -0.02f;   // -2.56 -> -2.5 -> -0.01953125
  x[40] = 448.0f;  // group 1: amax/448 = 1 -> s = 1
  x[41] = 17.0f;   // 17 -> 16 (tie at exponent 4: 16 | 18 -> even 16)
  prepare_activations(t, 0, x.data(), 1, DType::kFloat32);
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], 0.1015625f);
  EXPECT_EQ(x[2], -0.01953125f);
  EXPECT_EQ(x[40], 448.0f);
  EXPECT_EQ(x[41], 16.0f);
  for (int c = 3; c < 32; ++c) EXPECT_EQ(x[c], 0.0f);
}

TEST(PrepareActivations, WeightOnlyFormatsAreUnchanged) {
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kMXFP4, WeightFormat::kNVFP4}) {
    auto t = tensor(f, 1, 1, 32,
                    f == WeightFormat::kMXFP4   ? 32
                    : f == WeightFormat::kNVFP4 ? 16
                                                : 0);
    std::vector<float> x(32);
    for (int i = 0; i < 32; ++i) x[i] = 0.37f * static_cast<float>(i) - 3.0f;
    auto y = x;
    prepare_activations(t, 0, y.data(), 1, DType::kFloat32);
    EXPECT_EQ(x, y) << to_string(f);
  }
}

TEST(RoundTo, ActivationTypes) {
  EXPECT_EQ(round_to(DType::kFloat32, 0.1f), 0.1f);
  EXPECT_EQ(round_to(DType::kBFloat16, 1.00390625f), 1.0f);  // tie: even
  EXPECT_EQ(round_to(DType::kBFloat16, 1.01171875f), 1.015625f);
  EXPECT_EQ(round_to(DType::kFloat16, 1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(round_to(DType::kFloat16, 70000.0f), INFINITY);
  EXPECT_THROW(round_to(DType::kInt32, 1.0f), Error);
}

}  // namespace
}  // namespace moekit::quant
