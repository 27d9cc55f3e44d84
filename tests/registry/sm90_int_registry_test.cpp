// The Hopper W4A16 / W8A16 implementations in the registry (cuda.sm90.cutlass.int4_group for
// kInt4Group weights, cuda.sm90.cutlass.int8_group for kInt8Group, both with bf16 or fp16
// activations): their capability as data (group sizes 32, 64 and 128, zero points, the AWQ
// pre-quant scale, K and N in whole 64-deep k tiles); on an sm_90 environment written by hand,
// auto and the cutlass family resolve such layers to them, and what they refuse is rejected
// with the stage and a sentence that names the implementation and the value: a hidden size off
// the 64-deep k tiles at the alignment stage (auto then falls back to the reference and says so
// with that sentence), other activation dtypes at the format stage.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "moekit/registry.hpp"
#include "registry/registry_fixtures.hpp"

namespace moekit::registry::test {
namespace {

constexpr std::pair<WeightFormat, const char*> kIntImpls[] = {
    {WeightFormat::kInt4Group, "cuda.sm90.cutlass.int4_group"},
    {WeightFormat::kInt8Group, "cuda.sm90.cutlass.int8_group"},
};

MoeSpec int_spec(WeightFormat f, DType act, int group, bool zero_points, bool pre_quant_scale) {
  MoeSpec s = small_spec(f, act);
  s.weights.group_size = group;
  s.weights.zero_points = zero_points;
  s.weights.pre_quant_scale = pre_quant_scale;
  return s;
}

TEST(Sm90IntRegistry, CapabilityAsData) {
  for (const auto& [format, id] : kIntImpls) {
    SCOPED_TRACE(id);
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr);
    const Capability& c = impl->capability();
    EXPECT_EQ(c.weight_formats, std::vector<WeightFormat>{format});
    EXPECT_EQ(c.act_dtypes, (std::vector<DType>{DType::kBFloat16, DType::kFloat16}));
    EXPECT_EQ(c.int_group_sizes, (std::vector<int>{32, 64, 128}));
    EXPECT_TRUE(c.int_zero_points);
    EXPECT_TRUE(c.int_pre_quant_scale);
    EXPECT_EQ(c.hidden_multiple, 64);
    EXPECT_EQ(c.intermediate_multiple, 64);
    EXPECT_EQ(c.sm_min, 90);
    EXPECT_EQ(c.sm_max, 90);
    EXPECT_TRUE(c.needs_cuda && c.needs_cutlass);
    EXPECT_TRUE(c.cuda_graph_safe);
    EXPECT_EQ(impl->family(), "cutlass");
    EXPECT_EQ(impl->device(), Device::kCuda);
  }
  // The reference runs every int variant.
  const Capability& ref = find_implementation("cpu.reference")->capability();
  EXPECT_EQ(ref.int_group_sizes, (std::vector<int>{32, 64, 128}));
  EXPECT_TRUE(ref.int_zero_points && ref.int_pre_quant_scale);
}

TEST(Sm90IntRegistry, IntLayersResolveToTheirImplementation) {
  for (const auto& [format, id] : kIntImpls)
    for (const DType act : {DType::kBFloat16, DType::kFloat16})
      for (const int group : {32, 64, 128})
        for (const bool zero : {false, true})
          for (const bool pre : {false, true}) {
            const MoeSpec s = int_spec(format, act, group, zero, pre);
            SCOPED_TRACE(std::string(id) + " " + to_string(act) + " group " +
                         std::to_string(group) + (zero ? " zero points" : "") +
                         (pre ? " pre-quant scale" : ""));
            ASSERT_TRUE(s.validate().empty());
            expect_resolves_to(s, "cutlass", id);
          }
}

// Everything the reference runs at these shapes: biases, the weight on the input, TP and EP.
TEST(Sm90IntRegistry, EveryFeatureOfTheReferenceAtTheseShapes) {
  for (const auto& [format, id] : kIntImpls) {
    SCOPED_TRACE(id);
    expect_runs_every_feature(int_spec(format, DType::kFloat16, 128, true, true), id);
  }
}

// A hidden size off the kernels' 64-deep k tiles (but on every group size's own multiple):
// rejected at the alignment stage naming the implementation and the value; auto falls back to
// the reference and reports this implementation's sentence, not another format's.
TEST(Sm90IntRegistry, HiddenOffTheKTilesIsRefusedWithItsReason) {
  for (const auto& [format, id] : kIntImpls) {
    SCOPED_TRACE(id);
    MoeSpec s = int_spec(format, DType::kBFloat16, 32, true, false);
    s.hidden = 288;  // 9 groups of 32, 4.5 k tiles of 64
    ASSERT_TRUE(s.validate().empty());
    expect_refused_then_reference(s, id, RejectStage::kAlignment, "288");
  }
}

TEST(Sm90IntRegistry, OnlyBf16AndFp16Activations) {
  for (const auto& [format, id] : kIntImpls) {
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr) << id;
    const Eligibility e =
        impl->can_implement(int_spec(format, DType::kFloat32, 128, false, false), h200_env());
    ASSERT_FALSE(e.ok()) << id;
    EXPECT_EQ(e.rejection().stage, RejectStage::kFormat) << e.rejection().reason;
    // And the other int format's weights.
    const WeightFormat other =
        format == WeightFormat::kInt4Group ? WeightFormat::kInt8Group : WeightFormat::kInt4Group;
    const Eligibility o =
        impl->can_implement(int_spec(other, DType::kBFloat16, 128, false, false), h200_env());
    ASSERT_FALSE(o.ok()) << id;
    EXPECT_EQ(o.rejection().stage, RejectStage::kFormat) << o.rejection().reason;
  }
}

// Without a GPU (this build's own environment or none written) the int layers run on the
// reference, and a request for the implementation says why not at the GPU stage.
TEST(Sm90IntRegistry, NoGpuMeansTheReference) {
  for (const auto& [format, id] : kIntImpls)
    expect_reference_without_gpu(int_spec(format, DType::kBFloat16, 128, true, true), id);
}

}  // namespace
}  // namespace moekit::registry::test
