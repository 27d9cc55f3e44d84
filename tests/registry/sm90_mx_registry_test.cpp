// The Hopper microscaling implementations in the registry (cuda.sm90.mx.mxfp4, .nvfp4, .mxfp8,
// bf16 or fp16 activations): their capability as data (K in multiples of 32, moekit's kernels
// only: no CUTLASS needed); on an sm_90 environment written by hand, auto, the mx family and the
// id resolve such layers to them, gpt-oss-120b's real shape and features included; a shape off
// the multiple of 32 is rejected at the alignment stage naming the implementation and the value
// (auto then falls back to the reference with that sentence); other activation dtypes and
// formats at the format stage; no GPU means the reference.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "moekit/presets.hpp"
#include "moekit/registry.hpp"
#include "registry/registry_fixtures.hpp"

namespace moekit::registry::test {
namespace {

constexpr std::pair<WeightFormat, const char*> kMxImpls[] = {
    {WeightFormat::kMXFP4, "cuda.sm90.mx.mxfp4"},
    {WeightFormat::kNVFP4, "cuda.sm90.mx.nvfp4"},
    {WeightFormat::kMXFP8, "cuda.sm90.mx.mxfp8"},
};

MoeSpec mx_spec(WeightFormat f, DType act = DType::kBFloat16) {
  MoeSpec s = small_spec(f, act);
  s.weights.group_size = format_scale_group(f, 0);
  return s;
}

TEST(Sm90MxRegistry, CapabilityAsData) {
  for (const auto& [format, id] : kMxImpls) {
    SCOPED_TRACE(id);
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr);
    const Capability& c = impl->capability();
    EXPECT_EQ(c.weight_formats, std::vector<WeightFormat>{format});
    EXPECT_EQ(c.act_dtypes, (std::vector<DType>{DType::kBFloat16, DType::kFloat16}));
    EXPECT_EQ(c.hidden_multiple, 32);
    EXPECT_EQ(c.intermediate_multiple, 32);
    EXPECT_EQ(c.sm_min, 90);
    EXPECT_EQ(c.sm_max, 90);
    EXPECT_TRUE(c.needs_cuda);
    EXPECT_FALSE(c.needs_cutlass);
    EXPECT_TRUE(c.cuda_graph_safe && c.clamp && c.alpha_beta && c.fc1_bias && c.fc2_bias);
    EXPECT_EQ(impl->family(), "mx");
    EXPECT_EQ(impl->device(), Device::kCuda);
  }
}

TEST(Sm90MxRegistry, MxLayersResolveToTheirImplementation) {
  for (const auto& [format, id] : kMxImpls)
    for (const DType act : {DType::kBFloat16, DType::kFloat16}) {
      const MoeSpec s = mx_spec(format, act);
      SCOPED_TRACE(std::string(id) + " " + to_string(act));
      ASSERT_TRUE(s.validate().empty());
      expect_resolves_to(s, "mx", id);
    }
}

// gpt-oss-120b as it ships (MXFP4 experts, clamped SwiGLU, interleaved gate/up, both biases,
// top-k then softmax), and every other feature of the reference at these shapes.
TEST(Sm90MxRegistry, GptOssAndEveryFeatureOfTheReference) {
  const MoeSpec gpt_oss = find_preset("gpt-oss-120b").spec;
  ASSERT_EQ(gpt_oss.weights.format, WeightFormat::kMXFP4);
  ASSERT_TRUE(gpt_oss.validate().empty());
  const Resolution r = resolve(gpt_oss, h200_env(), "auto");
  ASSERT_TRUE(r.ok()) << r.table();
  EXPECT_EQ(r.chosen->id(), "cuda.sm90.mx.mxfp4");
  for (const auto& [format, id] : kMxImpls) {
    SCOPED_TRACE(id);
    expect_runs_every_feature(mx_spec(format, DType::kFloat16), id);
  }
}

// NVFP4's blocks are 16 wide, the kernels' K a multiple of 32: a hidden size of 17 x 16 is a
// valid NVFP4 layer that this implementation refuses, naming itself and the value; auto falls
// back to the reference with that sentence. (MXFP4 and MXFP8 blocks are 32 wide: the spec
// itself refuses such a size.)
TEST(Sm90MxRegistry, Nvfp4HiddenOffTheMultipleOf32IsRefusedWithItsReason) {
  for (const auto& [format, id] : kMxImpls) {
    SCOPED_TRACE(id);
    MoeSpec s = mx_spec(format);
    s.hidden = 272;
    if (format != WeightFormat::kNVFP4) {
      EXPECT_FALSE(s.validate().empty());
      continue;
    }
    ASSERT_TRUE(s.validate().empty());
    expect_refused_then_reference(s, id, RejectStage::kAlignment, "272");
  }
}

TEST(Sm90MxRegistry, OnlyBf16AndFp16ActivationsAndTheirOwnFormat) {
  for (const auto& [format, id] : kMxImpls) {
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr) << id;
    const Eligibility e = impl->can_implement(mx_spec(format, DType::kFloat32), h200_env());
    ASSERT_FALSE(e.ok()) << id;
    EXPECT_EQ(e.rejection().stage, RejectStage::kFormat) << e.rejection().reason;
    for (const auto& [other, other_id] : kMxImpls) {
      if (other == format) continue;
      const Eligibility o = impl->can_implement(mx_spec(other), h200_env());
      ASSERT_FALSE(o.ok()) << id << " with " << other_id << "'s format";
      EXPECT_EQ(o.rejection().stage, RejectStage::kFormat) << o.rejection().reason;
    }
  }
}

TEST(Sm90MxRegistry, NoGpuMeansTheReference) {
  for (const auto& [format, id] : kMxImpls) expect_reference_without_gpu(mx_spec(format), id);
}

}  // namespace
}  // namespace moekit::registry::test
