// Names, aliases and properties of the public enumerations, and ErrorCode names.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit {
namespace {

TEST(Types, DTypeNamesAndSizes) {
  const DType all[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3,
                       DType::kUInt8,   DType::kInt8,     DType::kInt32,   DType::kInt64};
  const std::size_t sizes[] = {4, 2, 2, 1, 1, 1, 4, 8};
  std::set<std::string> names;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    names.insert(to_string(all[i]));
    EXPECT_EQ(dtype_from_string(to_string(all[i])), all[i]);
  }
  EXPECT_EQ(names.size(), 8u);
  EXPECT_EQ(dtype_from_string("BF16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_string("float16"), DType::kFloat16);
  EXPECT_EQ(dtype_from_string("F8_E4M3"), DType::kFloat8E4M3);
  EXPECT_EQ(dtype_from_string("float32"), DType::kFloat32);
  EXPECT_FALSE(dtype_from_string("bf17").has_value());
  EXPECT_FALSE(dtype_from_string("").has_value());
  try {
    dtype_size(static_cast<DType>(99));
    FAIL() << "an unknown dtype must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos);
  }
  EXPECT_STREQ(to_string(static_cast<DType>(99)), "unknown");
}

struct FormatRow {
  WeightFormat f;
  const char* name;
  int group;  // for user group 64
  int row_block;
  int bits;
  bool quantizes_activations;
};

TEST(Types, WeightFormats) {
  const FormatRow rows[] = {
      {WeightFormat::kBF16, "bf16", 0, 1, 16, false},
      {WeightFormat::kFP16, "fp16", 0, 1, 16, false},
      {WeightFormat::kFP32, "fp32", 0, 1, 32, false},
      {WeightFormat::kFP8PerTensor, "fp8", 0, 1, 8, true},
      {WeightFormat::kFP8Block128, "fp8_block128", 128, 128, 8, true},
      {WeightFormat::kInt8Group, "int8_group", 64, 1, 8, false},
      {WeightFormat::kInt4Group, "int4_group", 64, 1, 4, false},
      {WeightFormat::kMXFP4, "mxfp4", 32, 1, 4, false},
      {WeightFormat::kNVFP4, "nvfp4", 16, 1, 4, false},
      {WeightFormat::kMXFP8, "mxfp8", 32, 1, 8, true},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_STREQ(to_string(r.f), r.name);
    EXPECT_EQ(weight_format_from_string(r.name), r.f);
    EXPECT_EQ(format_scale_group(r.f, 64), r.group);
    EXPECT_EQ(format_row_block(r.f), r.row_block);
    EXPECT_EQ(format_value_bits(r.f), r.bits);
    EXPECT_EQ(format_quantizes_activations(r.f), r.quantizes_activations);
  }
  EXPECT_EQ(static_cast<int>(WeightFormat::kMXFP8), 10);  // stable ids
  EXPECT_EQ(weight_format_from_string("FP8-Block128"), WeightFormat::kFP8Block128);
  EXPECT_EQ(weight_format_from_string("int4"), WeightFormat::kInt4Group);
  EXPECT_EQ(weight_format_from_string("w8a16"), WeightFormat::kInt8Group);
  EXPECT_EQ(weight_format_from_string("bfloat16"), WeightFormat::kBF16);
  EXPECT_EQ(weight_format_from_string("MXFP4"), WeightFormat::kMXFP4);
  EXPECT_FALSE(weight_format_from_string("int3").has_value());
  EXPECT_THROW(format_value_bits(static_cast<WeightFormat>(0)), Error);
  EXPECT_THROW(format_scale_group(static_cast<WeightFormat>(42), 32), Error);
}

TEST(Types, Activations) {
  const ActivationKind all[] = {
      ActivationKind::kSwiGLU,   ActivationKind::kSwiGLUClamped, ActivationKind::kGeGLUTanh,
      ActivationKind::kGeGLUErf, ActivationKind::kSiLU,          ActivationKind::kGeLUTanh,
      ActivationKind::kGeLUErf,  ActivationKind::kReLU2,         ActivationKind::kIdentity};
  const char* names[] = {"swiglu",    "swiglu_clamped", "geglu_tanh", "geglu_erf", "silu",
                         "gelu_tanh", "gelu_erf",       "relu2",      "identity"};
  for (int i = 0; i < 9; ++i) {
    EXPECT_STREQ(to_string(all[i]), names[i]);
    EXPECT_EQ(activation_from_string(names[i]), all[i]);
    EXPECT_EQ(activation_is_gated(all[i]), i < 4) << names[i];
  }
  EXPECT_EQ(activation_from_string("swigluoai"), ActivationKind::kSwiGLUClamped);
  EXPECT_EQ(activation_from_string("GELU"), ActivationKind::kGeLUErf);
  EXPECT_EQ(activation_from_string("gelu_pytorch_tanh"), ActivationKind::kGeLUTanh);
  EXPECT_FALSE(activation_from_string("relu3").has_value());
}

TEST(Types, GateUpLayoutAndRouting) {
  EXPECT_STREQ(to_string(GateUpLayout::kHalves), "halves");
  EXPECT_STREQ(to_string(GateUpLayout::kInterleaved), "interleaved");
  EXPECT_EQ(gate_up_layout_from_string("interleaved"), GateUpLayout::kInterleaved);
  EXPECT_EQ(gate_up_layout_from_string("Halves"), GateUpLayout::kHalves);
  EXPECT_FALSE(gate_up_layout_from_string("diagonal").has_value());

  const RoutingMethod all[] = {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                               RoutingMethod::kDeepSeekV3, RoutingMethod::kLlama4,
                               RoutingMethod::kExternal};
  const char* names[] = {"softmax_topk", "topk_softmax", "deepseek_v3", "llama4", "external"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_STREQ(to_string(all[i]), names[i]);
    EXPECT_EQ(routing_from_string(names[i]), all[i]);
  }
  EXPECT_EQ(routing_from_string("DeepSeek-V3"), RoutingMethod::kDeepSeekV3);
  EXPECT_EQ(routing_from_string("renormalize"), RoutingMethod::kTopKSoftmax);
  EXPECT_FALSE(routing_from_string("random").has_value());
}

TEST(Types, ErrorCodeNamesAreDistinct) {
  std::set<std::string> names;
  for (int c = 0; c <= 10; ++c) names.insert(to_string(static_cast<ErrorCode>(c)));
  EXPECT_EQ(names.size(), 11u);
  EXPECT_EQ(names.count("unknown"), 0u);
  EXPECT_STREQ(to_string(ErrorCode::kFormatMismatch), "format_mismatch");
  EXPECT_STREQ(to_string(static_cast<ErrorCode>(77)), "unknown");
}

}  // namespace
}  // namespace moekit
