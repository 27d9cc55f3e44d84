// spec_to_json / spec_from_json: exact round trips (every preset, every optional field) and
// malformed text refused with kInvalidArgument naming the field and the value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "moekit/presets.hpp"
#include "moekit/spec.hpp"
#include "moekit/status.hpp"
#include "support/specs.hpp"

namespace moekit {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void expect_same_float(const std::optional<float>& a, const std::optional<float>& b,
                       const char* what) {
  ASSERT_EQ(a.has_value(), b.has_value()) << what;
  if (a) EXPECT_EQ(bits(*a), bits(*b)) << what << ": " << *a << " vs " << *b;
}

// Field by field; floats bit for bit.
void expect_same(const MoeSpec& a, const MoeSpec& b) {
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.act_dtype, b.act_dtype);
  EXPECT_EQ(a.weights.format, b.weights.format);
  EXPECT_EQ(a.weights.group_size, b.weights.group_size);
  EXPECT_EQ(a.weights.zero_points, b.weights.zero_points);
  EXPECT_EQ(a.weights.pre_quant_scale, b.weights.pre_quant_scale);
  EXPECT_EQ(a.activation.kind, b.activation.kind);
  expect_same_float(a.activation.limit, b.activation.limit, "limit");
  expect_same_float(a.activation.alpha, b.activation.alpha, "alpha");
  expect_same_float(a.activation.beta, b.activation.beta, "beta");
  EXPECT_EQ(a.gate_up_layout, b.gate_up_layout);
  EXPECT_EQ(a.fc1_bias, b.fc1_bias);
  EXPECT_EQ(a.fc2_bias, b.fc2_bias);
  EXPECT_EQ(a.routing.method, b.routing.method);
  EXPECT_EQ(a.routing.n_group, b.routing.n_group);
  EXPECT_EQ(a.routing.topk_group, b.routing.topk_group);
  EXPECT_EQ(bits(a.routing.routed_scaling_factor), bits(b.routing.routed_scaling_factor));
  EXPECT_EQ(a.routing.correction_bias, b.routing.correction_bias);
  EXPECT_EQ(a.routing.renormalize, b.routing.renormalize);
  EXPECT_EQ(a.routing.weight_placement, b.routing.weight_placement);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.tp_size, b.tp_size);
  EXPECT_EQ(a.tp_rank, b.tp_rank);
  EXPECT_EQ(a.ep_size, b.ep_size);
  EXPECT_EQ(a.ep_rank, b.ep_rank);
}

void expect_round_trip(const MoeSpec& s) {
  const std::string text = spec_to_json(s);
  const MoeSpec back = spec_from_json(text);
  expect_same(s, back);
  EXPECT_EQ(spec_to_json(back), text);
}

TEST(SpecJson, EveryPresetRoundTrips) {
  for (const Preset& p : list_presets()) {
    SCOPED_TRACE(p.name);
    expect_round_trip(p.spec);
  }
}

TEST(SpecJson, EveryFieldSetRoundTrips) {
  MoeSpec s = test::qwen3_30b_spec();
  s.act_dtype = DType::kFloat16;
  s.weights = {WeightFormat::kInt4Group, 64, true, true};
  test::set_clamped_swiglu(s);
  s.gate_up_layout = GateUpLayout::kInterleaved;
  s.fc1_bias = s.fc2_bias = true;
  test::set_deepseek_v3_routing(s, 8, 4);
  s.routing.renormalize = false;
  s.routing.weight_placement = RouterWeightPlacement::kInput;
  s.max_tokens = int64_t{1} << 40;
  s.tp_size = 4;
  s.tp_rank = 3;
  s.ep_size = 8;
  s.ep_rank = 5;
  expect_round_trip(s);

  // Floats whose shortest text is long, tiny, huge or subnormal, and the non-finite ones.
  for (float f : {0.1f, 1.0f / 3.0f, std::nextafter(1.0f, 2.0f), std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                  -0.0f, -1.5e-7f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(f);
    s.activation.limit = f;
    s.activation.alpha = -f;
    s.routing.routed_scaling_factor = f;
    expect_round_trip(s);
  }
  s.activation.beta = std::numeric_limits<float>::quiet_NaN();
  const MoeSpec back = spec_from_json(spec_to_json(s));
  ASSERT_TRUE(back.activation.beta.has_value());
  EXPECT_TRUE(std::isnan(*back.activation.beta));
}

TEST(SpecJson, AbsentOptionalsStayAbsent) {
  MoeSpec s;
  s.activation.kind = ActivationKind::kSwiGLUClamped;
  s.activation.alpha = 1.5f;  // limit and beta absent
  const std::string text = spec_to_json(s);
  EXPECT_EQ(text.find("\"limit\""), std::string::npos) << text;
  EXPECT_EQ(text.find("\"beta\""), std::string::npos) << text;
  const MoeSpec back = spec_from_json(text);
  EXPECT_FALSE(back.activation.limit.has_value());
  EXPECT_FALSE(back.activation.beta.has_value());
  ASSERT_TRUE(back.activation.alpha.has_value());
  EXPECT_EQ(*back.activation.alpha, 1.5f);
}

TEST(SpecJson, EnumsAreNamesAndAliasesAreRead) {
  MoeSpec s;
  s.weights.format = WeightFormat::kFP8Block128;
  const std::string text = spec_to_json(s);
  EXPECT_NE(text.find(std::string("\"") + to_string(WeightFormat::kFP8Block128) + "\""),
            std::string::npos)
      << text;
  const MoeSpec read =
      spec_from_json(R"({"act_dtype": "float16", "routing": {"method": "mixtral"}})");
  EXPECT_EQ(read.act_dtype, DType::kFloat16);
  EXPECT_EQ(read.routing.method, RoutingMethod::kSoftmaxTopK);
}

TEST(SpecJson, MissingKeysKeepTheDefaults) {
  const MoeSpec s =
      spec_from_json(R"({"num_experts": 8, "top_k": 2, "hidden": 64, "intermediate": 32})");
  MoeSpec want;
  want.num_experts = 8;
  want.top_k = 2;
  want.hidden = 64;
  want.intermediate = 32;
  expect_same(s, want);
  EXPECT_TRUE(s.validate().empty());
}

// Each case: the text, and what the message must contain (the field and the value).
TEST(SpecJson, MalformedInputIsRefusedNamingFieldAndValue) {
  const struct {
    const char* text;
    std::vector<std::string> names;
  } cases[] = {
      {"{\"hidden\": 128", {"not valid JSON"}},
      // Deep nesting where a number belongs: refused before a message dump()s it.
      {"{\"hidden\": "
       "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]"
       "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
       {"deeper than 64"}},
      {"[1, 2]", {"[1,2]", "not an object"}},
      {R"({"hiden": 128})", {"hiden", "unknown"}},
      {R"({"weights": {"format": "bf16", "groupsize": 64}})", {"weights.groupsize"}},
      {R"({"routing": {"methd": "deepseek_v3"}})", {"routing.methd"}},
      {R"({"activation": {"kind": "swiglu_clamped", "limt": 7}})", {"activation.limt"}},
      {R"({"hidden": "128"})", {"hidden", "\"128\"", "not an integer"}},
      {R"({"hidden": 128.5})", {"hidden", "128.5"}},
      {R"({"hidden": true})", {"hidden", "true"}},
      {R"({"fc1_bias": 1})", {"fc1_bias", "1"}},
      {R"({"weights": 3})", {"weights", "3", "not an object"}},
      {R"({"act_dtype": "bf17"})", {"act_dtype", "bf17"}},
      {R"({"act_dtype": 2})", {"act_dtype", "2"}},
      {R"({"weights": {"format": "fp9"}})", {"weights.format", "fp9"}},
      {R"({"activation": {"kind": "swish2"}})", {"activation.kind", "swish2"}},
      {R"({"gate_up_layout": "diagonal"})", {"gate_up_layout", "diagonal"}},
      {R"({"routing": {"method": "random"}})", {"routing.method", "random"}},
      {R"({"routing": {"weight_placement": "middle"}})", {"routing.weight_placement", "middle"}},
      {R"({"activation": {"limit": "seven"}})", {"activation.limit", "seven"}},
      {R"({"activation": {"limit": null}})", {"activation.limit", "null"}},
      {R"({"activation": {"alpha": 1e39}})", {"activation.alpha", "1e+39"}},
      {R"({"routing": {"routed_scaling_factor": -1e300}})", {"routing.routed_scaling_factor"}},
      // Integers that do not fit their field: refused, never wrapped.
      {R"({"hidden": 9223372036854775808})", {"hidden", "9223372036854775808"}},
      {R"({"num_experts": 18446744073709551615})", {"num_experts", "18446744073709551615"}},
      {R"({"max_tokens": 1e30})", {"max_tokens", "1e+30"}},
      {R"({"tp_size": 4294967297})", {"tp_size", "4294967297"}},
      {R"({"routing": {"n_group": -3000000000}})", {"routing.n_group", "-3000000000"}},
      {R"({"weights": {"group_size": 2147483648}})", {"weights.group_size", "2147483648"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      spec_from_json(c.text);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      for (const std::string& n : c.names)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
}

TEST(SpecJson, ReadingDoesNotValidate) {
  // Values of the right type but out of range read fine; validate() names them.
  const MoeSpec s = spec_from_json(R"({"num_experts": -4, "tp_size": 0})");
  EXPECT_EQ(s.num_experts, -4);
  EXPECT_FALSE(s.validate().empty());
}

}  // namespace
}  // namespace moekit
