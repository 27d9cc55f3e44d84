// The Hopper FP8 implementations in the registry (cuda.sm90.cutlass.fp8_block128 for
// kFP8Block128 weights, cuda.sm90.cutlass.fp8 for kFP8PerTensor, both with bf16 activations):
// on an sm_90 environment written by hand, auto and the cutlass family resolve such a layer to
// them; a hidden size or local intermediate that is not a multiple of 128 is rejected at the
// alignment stage with a sentence that names the implementation and the value, and auto then
// says so when it falls back to the CPU; other activation dtypes are rejected at the format
// stage.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "moekit/registry.hpp"
#include "registry/registry_fixtures.hpp"

namespace moekit::registry::test {
namespace {

constexpr std::pair<WeightFormat, const char*> kFp8Impls[] = {
    {WeightFormat::kFP8Block128, "cuda.sm90.cutlass.fp8_block128"},
    {WeightFormat::kFP8PerTensor, "cuda.sm90.cutlass.fp8"},
};

TEST(Sm90Fp8Registry, Bf16ActivationsWithFp8WeightsResolveToTheirImplementation) {
  for (const auto& [format, id] : kFp8Impls) {
    SCOPED_TRACE(id);
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr);
    const MoeSpec s = small_spec(format, DType::kBFloat16);
    ASSERT_TRUE(s.validate().empty());
    expect_resolves_to(s, "cutlass", id);
    EXPECT_EQ(impl->family(), "cutlass");
    EXPECT_EQ(impl->device(), Device::kCuda);
    // Everything the reference runs at these shapes: biases, the weight on the input, GeGLU on
    // interleaved gate/up, TP and EP.
    expect_runs_every_feature(s, id);
  }
}

// Shapes the FP8 kernels do not tile: 128-column k blocks and 128-row scale blocks.
TEST(Sm90Fp8Registry, ShapesNotMultiplesOf128AreRejectedAtAlignment) {
  for (const auto& [format, id] : kFp8Impls) {
    SCOPED_TRACE(id);
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr);
    struct Case {
      MoeSpec spec;
      std::string value;  // what the reason must name
    };
    MoeSpec hidden = small_spec(format, DType::kBFloat16);
    hidden.hidden = 7000;  // valid for both formats: kFP8Block128 stores a partial last block
    std::vector<Case> cases = {{hidden, "7000"}};
    if (format == WeightFormat::kFP8PerTensor) {
      // (For kFP8Block128 these are invalid specs: the 128-row blocks must not be cut.)
      MoeSpec inter = small_spec(format, DType::kBFloat16);
      inter.intermediate = 200;
      cases.push_back({inter, "200"});
      MoeSpec shard = small_spec(format, DType::kBFloat16);
      shard.intermediate = 384;
      shard.tp_size = 2;  // 192 local rows
      cases.push_back({shard, "192"});
    }
    for (const Case& c : cases) {
      SCOPED_TRACE(c.value);
      ASSERT_TRUE(c.spec.validate().empty());
      expect_refused_then_reference(c.spec, id, RejectStage::kAlignment, c.value);
    }
  }
}

TEST(Sm90Fp8Registry, OnlyBf16Activations) {
  for (const auto& [format, id] : kFp8Impls) {
    const Implementation* impl = find_implementation(id);
    ASSERT_NE(impl, nullptr) << id;
    for (const DType act : {DType::kFloat16, DType::kFloat32}) {
      const Eligibility e = impl->can_implement(small_spec(format, act), h200_env());
      ASSERT_FALSE(e.ok()) << id << " " << to_string(act);
      EXPECT_EQ(e.rejection().stage, RejectStage::kFormat) << e.rejection().reason;
    }
    // And the other FP8 format's weights.
    const WeightFormat other = format == WeightFormat::kFP8Block128 ? WeightFormat::kFP8PerTensor
                                                                    : WeightFormat::kFP8Block128;
    const Eligibility e = impl->can_implement(small_spec(other, DType::kBFloat16), h200_env());
    ASSERT_FALSE(e.ok()) << id;
    EXPECT_EQ(e.rejection().stage, RejectStage::kFormat) << e.rejection().reason;
  }
}

// Per-token activation scales (weights.dynamic_activations) run on the per-tensor engine too.
TEST(Sm90Fp8Registry, DynamicActivationsRunOnThePerTensorImplementation) {
  MoeSpec s = small_spec(WeightFormat::kFP8PerTensor, DType::kBFloat16);
  s.weights.dynamic_activations = true;
  const Resolution r = resolve(s, h200_env(), "auto");
  ASSERT_TRUE(r.ok()) << r.table();
  EXPECT_EQ(r.chosen->id(), "cuda.sm90.cutlass.fp8");
}

}  // namespace
}  // namespace moekit::registry::test
