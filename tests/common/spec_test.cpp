// MoeSpec::validate(): every violation at once, each naming its value; fc1_rows; derive_local.
#include "moekit/spec.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moekit/status.hpp"
#include "support/specs.hpp"

namespace moekit {
namespace {

MoeSpec qwen3() { return test::qwen3_30b_spec(); }

MoeSpec deepseek() {
  MoeSpec s;
  s.num_experts = 256;
  s.top_k = 8;
  s.hidden = 7168;
  s.intermediate = 2048;
  s.weights.format = WeightFormat::kFP8Block128;
  test::set_deepseek_v3_routing(s, 8, 4);
  return s;
}

MoeSpec gpt_oss() {
  MoeSpec s;
  s.num_experts = 128;
  s.top_k = 4;
  s.hidden = 2880;
  s.intermediate = 2880;
  s.weights.format = WeightFormat::kMXFP4;
  test::set_clamped_swiglu(s);
  s.gate_up_layout = GateUpLayout::kInterleaved;
  s.fc1_bias = s.fc2_bias = true;
  return s;
}

// True when some violation contains every one of `parts`.
bool has(const std::vector<std::string>& v, std::initializer_list<std::string> parts) {
  for (const auto& m : v) {
    bool all = true;
    for (const auto& p : parts) all = all && m.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

ErrorCode code_of_validate(const MoeSpec& s) {
  try {
    s.validate_or_throw();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

std::string dump(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& m : v) s += "\n  " + m;
  return s;
}

TEST(SpecValidate, RealShapesAreValid) {
  for (const MoeSpec& s : {qwen3(), deepseek(), gpt_oss()}) {
    EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  }
  MoeSpec llama;
  llama.num_experts = 128;
  llama.top_k = 1;
  llama.hidden = 5120;
  llama.intermediate = 8192;
  llama.routing.method = RoutingMethod::kLlama4;
  EXPECT_TRUE(llama.validate().empty()) << dump(llama.validate());
}

TEST(SpecValidate, ReportsEveryViolationAtOnce) {
  MoeSpec s = qwen3();
  s.num_experts = 0;
  s.hidden = -5;
  s.max_tokens = 0;
  s.tp_rank = 3;
  s.routing.routed_scaling_factor = 0.0f;
  const auto v = s.validate();
  EXPECT_GE(v.size(), 5u) << dump(v);
  EXPECT_TRUE(has(v, {"num_experts", "0"})) << dump(v);
  EXPECT_TRUE(has(v, {"hidden", "-5"})) << dump(v);
  EXPECT_TRUE(has(v, {"max_tokens", "0"})) << dump(v);
  EXPECT_TRUE(has(v, {"tp_rank", "3"})) << dump(v);
  EXPECT_TRUE(has(v, {"routed_scaling_factor", "0"})) << dump(v);
}

TEST(SpecValidate, DynamicActivationsOnlyForPerTensorFp8) {
  MoeSpec s = qwen3();
  s.weights.dynamic_activations = true;
  EXPECT_TRUE(has(s.validate(), {"dynamic_activations", "bf16"})) << dump(s.validate());
  s.weights.format = WeightFormat::kFP8PerTensor;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
}

TEST(SpecValidate, ValidateOrThrowCarriesTheCodeAndAllMessages) {
  MoeSpec s = qwen3();
  s.top_k = 300;
  s.intermediate = 0;
  try {
    s.validate_or_throw();
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidSpec);
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("intermediate"), std::string::npos);
  }
  EXPECT_NO_THROW(qwen3().validate_or_throw());
}

TEST(SpecValidate, TopKAndDtype) {
  MoeSpec s = qwen3();
  s.top_k = 129;
  s.act_dtype = DType::kFloat8E4M3;
  const auto v = s.validate();
  EXPECT_TRUE(has(v, {"top_k", "129", "128"})) << dump(v);
  EXPECT_TRUE(has(v, {"act_dtype"})) << dump(v);
  s = qwen3();
  s.act_dtype = DType::kFloat32;
  EXPECT_TRUE(s.validate().empty());
}

TEST(SpecValidate, Parallelism) {
  MoeSpec s = qwen3();
  s.ep_size = 3;
  s.ep_rank = 3;
  s.tp_size = 5;
  const auto v = s.validate();
  EXPECT_TRUE(has(v, {"num_experts", "128", "ep_size", "3"})) << dump(v);
  EXPECT_TRUE(has(v, {"ep_rank", "3"})) << dump(v);
  EXPECT_TRUE(has(v, {"intermediate", "768", "tp_size", "5"})) << dump(v);
  s = qwen3();
  s.tp_size = 0;
  s.ep_size = 0;
  const auto v0 = s.validate();
  EXPECT_TRUE(has(v0, {"tp_size", "0"})) << dump(v0);
  EXPECT_TRUE(has(v0, {"ep_size", "0"})) << dump(v0);
  s = qwen3();
  s.tp_size = 4;
  s.tp_rank = -1;
  EXPECT_TRUE(has(s.validate(), {"tp_rank", "-1"}));
}

TEST(SpecValidate, BlockScaledIntermediateSplitOverTP) {
  MoeSpec s = qwen3();
  s.weights.format = WeightFormat::kFP8Block128;
  s.tp_size = 8;
  const auto v = s.validate();
  ASSERT_EQ(v.size(), 1u) << dump(v);
  EXPECT_TRUE(has(v, {"768", "TP 8", "96", "128"})) << dump(v);
  s.tp_size = 2;  // 384 rows = 3 blocks
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.hidden = 2000;  // a partial last 128-column block is part of the format
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.tp_size = 1;
  s.intermediate = 200;  // but a block must not straddle gate and up
  EXPECT_TRUE(has(s.validate(), {"intermediate", "200", "128"})) << dump(s.validate());
}

TEST(SpecValidate, IntGroups) {
  MoeSpec s = qwen3();
  s.weights.format = WeightFormat::kInt4Group;
  s.weights.group_size = 48;
  EXPECT_TRUE(has(s.validate(), {"group_size", "48"})) << dump(s.validate());
  s.weights.group_size = 128;
  s.tp_size = 8;  // 96 columns of FC2's K: not whole groups of 128
  EXPECT_TRUE(has(s.validate(), {"96", "128"})) << dump(s.validate());
  s.weights.group_size = 32;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.hidden = 2000;  // not a multiple of 32 (FC1's K)
  EXPECT_TRUE(has(s.validate(), {"hidden", "2000", "32"})) << dump(s.validate());
  s = qwen3();
  s.weights.format = WeightFormat::kInt8Group;
  s.weights.zero_points = true;
  s.weights.pre_quant_scale = true;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
}

TEST(SpecValidate, MicroscaledFormats) {
  MoeSpec s = qwen3();
  s.hidden = 2064;  // multiple of 16, not of 32
  s.weights.format = WeightFormat::kMXFP4;
  EXPECT_TRUE(has(s.validate(), {"hidden", "2064", "32"})) << dump(s.validate());
  s.weights.format = WeightFormat::kMXFP8;
  EXPECT_TRUE(has(s.validate(), {"hidden", "2064", "32"})) << dump(s.validate());
  s.weights.format = WeightFormat::kNVFP4;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.intermediate = 24;  // not a multiple of 16
  EXPECT_TRUE(has(s.validate(), {"intermediate", "24", "16"})) << dump(s.validate());
  // Plain formats take any size.
  s.weights.format = WeightFormat::kBF16;
  s.hidden = 7;
  s.intermediate = 3;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
}

TEST(SpecValidate, ZeroPointsAndPreQuantScaleOnlyForIntFormats) {
  MoeSpec s = qwen3();
  s.weights.zero_points = true;
  s.weights.pre_quant_scale = true;
  const auto v = s.validate();
  EXPECT_EQ(v.size(), 2u) << dump(v);
  EXPECT_TRUE(has(v, {"zero_points"})) << dump(v);
  EXPECT_TRUE(has(v, {"pre_quant_scale"})) << dump(v);
}

TEST(SpecValidate, ActivationParameters) {
  MoeSpec s = qwen3();
  s.activation.limit = 7.0f;
  s.activation.alpha = 1.5f;
  s.activation.beta = 2.0f;
  auto v = s.validate();
  EXPECT_EQ(v.size(), 3u) << dump(v);
  EXPECT_TRUE(has(v, {"limit", "7"})) << dump(v);
  EXPECT_TRUE(has(v, {"alpha", "1.5"})) << dump(v);
  EXPECT_TRUE(has(v, {"beta", "2"})) << dump(v);

  s.activation.kind = ActivationKind::kSwiGLUClamped;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.activation.limit = 0.0f;
  EXPECT_TRUE(has(s.validate(), {"limit", "0"}));
  s.activation.limit = NAN;
  EXPECT_TRUE(has(s.validate(), {"limit", "nan"}));
  s.activation.limit.reset();  // alpha and beta alone are fine
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.activation.alpha = INFINITY;
  EXPECT_TRUE(has(s.validate(), {"alpha", "inf"}));
}

TEST(SpecValidate, GateUpLayoutOnlyForGated) {
  MoeSpec s = qwen3();
  s.activation.kind = ActivationKind::kReLU2;
  s.gate_up_layout = GateUpLayout::kInterleaved;
  EXPECT_TRUE(has(s.validate(), {"gate_up_layout"})) << dump(s.validate());
  s.gate_up_layout = GateUpLayout::kHalves;
  EXPECT_TRUE(s.validate().empty());
}

TEST(SpecValidate, Routing) {
  MoeSpec s = deepseek();
  s.routing.n_group = 7;
  auto v = s.validate();
  EXPECT_TRUE(has(v, {"n_group", "7", "256"})) << dump(v);

  s = deepseek();
  s.routing.topk_group = 9;
  EXPECT_TRUE(has(s.validate(), {"topk_group", "9"})) << dump(s.validate());
  s.routing.topk_group = 0;
  EXPECT_TRUE(has(s.validate(), {"topk_group", "0"})) << dump(s.validate());

  s = deepseek();
  s.routing.topk_group = 1;  // 32 experts per group: fine for top-8
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.top_k = 33;
  EXPECT_TRUE(has(s.validate(), {"top_k", "33", "32"})) << dump(s.validate());

  s = qwen3();
  s.routing.correction_bias = true;
  s.routing.n_group = 4;
  v = s.validate();
  EXPECT_TRUE(has(v, {"correction_bias"})) << dump(v);
  EXPECT_TRUE(has(v, {"n_group", "4"})) << dump(v);

  s = qwen3();
  s.routing.method = RoutingMethod::kLlama4;  // any top_k, as transformers' Llama4Router
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());

  for (float f : {-1.0f, 0.0f, NAN, INFINITY}) {
    s = qwen3();
    s.routing.routed_scaling_factor = f;
    EXPECT_TRUE(has(s.validate(), {"routed_scaling_factor"})) << f;
  }
  s = qwen3();
  s.routing.method = RoutingMethod::kExternal;
  EXPECT_TRUE(s.validate().empty());
}

TEST(SpecValidate, UnknownEnumValuesAreNamedByNumber) {
  MoeSpec s = qwen3();
  s.weights.format = static_cast<WeightFormat>(77);
  s.activation.kind = static_cast<ActivationKind>(55);
  s.routing.method = static_cast<RoutingMethod>(66);
  s.act_dtype = static_cast<DType>(44);
  const auto v = s.validate();
  EXPECT_TRUE(has(v, {"77"})) << dump(v);
  EXPECT_TRUE(has(v, {"55"})) << dump(v);
  EXPECT_TRUE(has(v, {"66"})) << dump(v);
  EXPECT_TRUE(has(v, {"44"})) << dump(v);
}

TEST(SpecValidate, SizesAreBoundedAndNeverOverflow) {
  // The largest preset tensors are far inside the bound.
  EXPECT_TRUE(deepseek().validate().empty()) << dump(deepseek().validate());

  // --hidden 1e12: the weights of one layer would be 10^17 elements.
  MoeSpec s = qwen3();
  s.hidden = 1000000000000;
  std::vector<std::string> v = s.validate();
  EXPECT_TRUE(has(v, {"FC1", "1000000000000", "exceeds"})) << dump(v);
  EXPECT_TRUE(has(v, {"FC2", "1000000000000"})) << dump(v);

  // --tokens 1e15: the activations and the workspace.
  s = qwen3();
  s.max_tokens = 1000000000000000;
  v = s.validate();
  EXPECT_TRUE(has(v, {"max_tokens x hidden", "1000000000000000", "exceeds"})) << dump(v);
  EXPECT_TRUE(has(v, {"max_tokens x num_experts", "1000000000000000"})) << dump(v);
  EXPECT_TRUE(has(v, {"intermediate workspace", "overflows"})) << dump(v);

  // Products past int64 are named, not wrapped (the extents alone are valid int64 values).
  s = qwen3();
  s.num_experts = 1 << 20;
  s.top_k = 1;
  s.intermediate = int64_t{1} << 62;
  s.hidden = int64_t{1} << 62;
  v = s.validate();
  EXPECT_TRUE(has(v, {"FC1", "overflows"})) << dump(v);
  EXPECT_TRUE(has(v, {"FC2", "overflows"})) << dump(v);
  EXPECT_EQ(code_of_validate(s), ErrorCode::kInvalidSpec);

  // Exactly the bound is allowed; one element more is not.
  s = qwen3();
  s.activation.kind = ActivationKind::kSiLU;  // FC1 rows = intermediate
  s.num_experts = 1;
  s.top_k = 1;
  s.routing.method = RoutingMethod::kSoftmaxTopK;
  s.max_tokens = 1;
  s.hidden = int64_t{1} << 24;
  s.intermediate = int64_t{1} << 24;
  EXPECT_TRUE(s.validate().empty()) << dump(s.validate());
  s.intermediate += 1;
  EXPECT_TRUE(has(s.validate(), {"FC1", std::to_string(kMaxTensorElements)})) << dump(s.validate());
}

TEST(SpecDerive, Fc1Rows) {
  MoeSpec s = qwen3();
  EXPECT_EQ(s.fc1_rows(), 1536);
  s.activation.kind = ActivationKind::kGeLUTanh;
  EXPECT_EQ(s.fc1_rows(), 768);
}

TEST(SpecDerive, LocalProblem) {
  MoeSpec s = gpt_oss();
  s.tp_size = 2;
  s.tp_rank = 1;
  s.ep_size = 4;
  s.ep_rank = 2;
  LocalProblem p = derive_local(s);
  EXPECT_EQ(p.num_experts_global, 128);
  EXPECT_EQ(p.num_experts, 32);
  EXPECT_EQ(p.first_expert, 64);
  EXPECT_EQ(p.top_k, 4);
  EXPECT_EQ(p.hidden, 2880);
  EXPECT_EQ(p.intermediate, 1440);
  EXPECT_EQ(p.intermediate_offset, 1440);
  EXPECT_EQ(p.fc1_rows, 2880);
  EXPECT_FALSE(p.adds_fc2_bias);  // only TP rank 0 adds it
  s.tp_rank = 0;
  EXPECT_TRUE(derive_local(s).adds_fc2_bias);
  s.fc2_bias = false;
  EXPECT_FALSE(derive_local(s).adds_fc2_bias);

  MoeSpec plain = qwen3();
  plain.activation.kind = ActivationKind::kSiLU;
  plain.tp_size = 4;
  plain.tp_rank = 3;
  LocalProblem q = derive_local(plain);
  EXPECT_EQ(q.intermediate, 192);
  EXPECT_EQ(q.intermediate_offset, 576);
  EXPECT_EQ(q.fc1_rows, 192);
  EXPECT_EQ(q.num_experts, 128);
  EXPECT_EQ(q.first_expert, 0);
}

TEST(SpecDerive, InvalidSpecThrows) {
  MoeSpec s = qwen3();
  s.ep_size = 0;
  try {
    derive_local(s);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidSpec);
  }
}

}  // namespace
}  // namespace moekit
