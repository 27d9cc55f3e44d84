// The built-in presets: valid specs, the shapes of the released models, families that can hold
// them (a scaled-down copy of each goes through its family's files and back).
#include "moekit/presets.hpp"

#include <gtest/gtest.h>

#include <set>

#include "io/io_test_util.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"
#include "quant/quant.hpp"

namespace moekit {
namespace {

TEST(Presets, AllValidateAndAreUnique) {
  std::set<std::string> names;
  for (const Preset& p : list_presets()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
    const auto v = p.spec.validate();
    EXPECT_TRUE(v.empty()) << p.name << ": " << (v.empty() ? "" : v[0]);
    EXPECT_FALSE(p.description.empty()) << p.name;
    EXPECT_EQ(p.spec.max_tokens, 4096) << p.name;
    EXPECT_EQ(p.spec.tp_size, 1);
    EXPECT_EQ(p.spec.ep_size, 1);
    EXPECT_NO_THROW(find_model_family(p.family)) << p.name;
    EXPECT_EQ(&find_preset(p.name), &p);
  }
  for (const char* n : {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b",
                        "gpt-oss-20b", "llama4-maverick", "qwen3-235b-a22b"})
    EXPECT_TRUE(names.count(n)) << n;
}

TEST(Presets, UnknownNameListsKnownOnes) {
  try {
    find_preset("mixtral-8x22b");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    const std::string m = e.what();
    EXPECT_NE(m.find("mixtral-8x22b"), std::string::npos);
    for (const Preset& p : list_presets()) EXPECT_NE(m.find(p.name), std::string::npos) << p.name;
  }
}

TEST(Presets, ShapesOfTheReleasedModels) {
  const MoeSpec& mx = find_preset("mixtral-8x7b").spec;
  EXPECT_EQ(mx.num_experts, 8);
  EXPECT_EQ(mx.top_k, 2);
  EXPECT_EQ(mx.hidden, 4096);
  EXPECT_EQ(mx.intermediate, 14336);
  EXPECT_EQ(mx.routing.method,
            RoutingMethod::kTopKSoftmax);  // Mixtral renormalizes its top-2 softmax
  EXPECT_EQ(mx.activation.kind, ActivationKind::kSwiGLU);
  EXPECT_EQ(mx.weights.format, WeightFormat::kBF16);

  const MoeSpec& q = find_preset("qwen3-30b-a3b").spec;
  EXPECT_EQ(q.num_experts, 128);
  EXPECT_EQ(q.top_k, 8);
  EXPECT_EQ(q.hidden, 2048);
  EXPECT_EQ(q.intermediate, 768);
  EXPECT_EQ(q.routing.method, RoutingMethod::kTopKSoftmax);

  const MoeSpec& q2 = find_preset("qwen3-235b-a22b").spec;
  EXPECT_EQ(q2.hidden, 4096);
  EXPECT_EQ(q2.intermediate, 1536);

  const MoeSpec& ds = find_preset("deepseek-v3").spec;
  EXPECT_EQ(ds.num_experts, 256);
  EXPECT_EQ(ds.top_k, 8);
  EXPECT_EQ(ds.hidden, 7168);
  EXPECT_EQ(ds.intermediate, 2048);
  EXPECT_EQ(ds.routing.method, RoutingMethod::kDeepSeekV3);
  EXPECT_EQ(ds.routing.n_group, 8);
  EXPECT_EQ(ds.routing.topk_group, 4);
  EXPECT_FLOAT_EQ(ds.routing.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(ds.routing.correction_bias);
  EXPECT_EQ(ds.weights.format, WeightFormat::kFP8Block128);

  for (const char* n : {"gpt-oss-120b", "gpt-oss-20b"}) {
    const MoeSpec& g = find_preset(n).spec;
    EXPECT_EQ(g.num_experts, std::string(n) == "gpt-oss-120b" ? 128 : 32);
    EXPECT_EQ(g.top_k, 4);
    EXPECT_EQ(g.hidden, 2880);
    EXPECT_EQ(g.intermediate, 2880);
    EXPECT_EQ(g.routing.method, RoutingMethod::kTopKSoftmax);
    EXPECT_EQ(g.activation.kind, ActivationKind::kSwiGLUClamped);
    EXPECT_FLOAT_EQ(g.activation.limit.value_or(0), 7.0f);
    EXPECT_FLOAT_EQ(g.activation.alpha.value_or(0), 1.702f);
    EXPECT_FLOAT_EQ(g.activation.beta.value_or(0), 1.0f);
    EXPECT_EQ(g.gate_up_layout, GateUpLayout::kInterleaved);
    EXPECT_TRUE(g.fc1_bias && g.fc2_bias);
    EXPECT_EQ(g.weights.format, WeightFormat::kMXFP4);
  }

  const MoeSpec& l4 = find_preset("llama4-maverick").spec;
  EXPECT_EQ(l4.num_experts, 128);
  EXPECT_EQ(l4.top_k, 1);
  EXPECT_EQ(l4.hidden, 5120);
  EXPECT_EQ(l4.intermediate, 8192);
  EXPECT_EQ(l4.routing.method, RoutingMethod::kLlama4);
  EXPECT_EQ(l4.gate_up_layout, GateUpLayout::kHalves);  // Llama4TextExperts: gate_up chunk(2)
}

// Llama-4 multiplies the experts' input by the routing weight (transformers'
// Llama4TextMoe.forward); every other preset multiplies their output.
TEST(Presets, RoutingWeightPlacement) {
  for (const Preset& p : list_presets()) {
    const RouterWeightPlacement want = p.spec.routing.method == RoutingMethod::kLlama4
                                           ? RouterWeightPlacement::kInput
                                           : RouterWeightPlacement::kOutput;
    EXPECT_EQ(p.spec.routing.weight_placement, want) << p.name;
  }
  EXPECT_EQ(find_preset("llama4-maverick").spec.routing.weight_placement,
            RouterWeightPlacement::kInput);
}

// Each preset's family holds its format, routing bias and biases: a copy with fewer experts and
// smaller matrices goes through the family's files unchanged.
TEST(Presets, FamilyRoundTripOfScaledDownPresets) {
  uint64_t seed = 40;
  for (const Preset& p : list_presets()) {
    SCOPED_TRACE(p.name);
    MoeSpec s = p.spec;
    s.num_experts = std::min<int64_t>(s.num_experts, 16);
    s.hidden = 256;
    s.intermediate = 256;
    ASSERT_TRUE(s.validate().empty()) << s.validate()[0];
    const ModelFamily& fam = find_model_family(p.family);
    MoeWeights w = quant::make_random_weights(s, ++seed);
    const std::string path = test::temp_path(p.name + ".safetensors");
    save_layer_weights(path, fam, 0, s, w);
    const MoeWeights back = load_layer_weights({path}, fam, 0, s);
    EXPECT_EQ(back.fc1.values, w.fc1.values);
    EXPECT_EQ(back.fc1.scales, w.fc1.scales);
    EXPECT_EQ(back.fc1.scale_bytes, w.fc1.scale_bytes);
    EXPECT_EQ(back.fc2.values, w.fc2.values);
    EXPECT_EQ(back.routing_bias, w.routing_bias);
    EXPECT_EQ(back.fc1_bias.size(), w.fc1_bias.size());
  }
}

}  // namespace
}  // namespace moekit
