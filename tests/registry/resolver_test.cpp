// The resolver: the priority table, auto by priority, family and id requests, and which
// rejection degraded_from reports.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "moekit/status.hpp"
#include "registry/registry_fixtures.hpp"
#include "registry/registry_internal.hpp"

namespace moekit::registry::test {
namespace {

TEST(PriorityTable, EveryImplementationExactlyOnce) {
  const auto& table = all_implementations();
  ASSERT_FALSE(table.empty());
  std::set<std::string> ids;
  std::set<const Implementation*> objects;
  for (size_t i = 0; i < table.size(); ++i) {
    ASSERT_NE(table[i], nullptr);
    EXPECT_TRUE(ids.insert(table[i]->id()).second) << table[i]->id() << " is listed twice";
    EXPECT_TRUE(objects.insert(table[i]).second) << table[i]->id() << " object listed twice";
    EXPECT_EQ(priority_of(table[i]->id()), static_cast<int>(i));
    EXPECT_EQ(find_implementation(table[i]->id()), table[i]);
  }
  // Every implementation this library has must be in the table, in both builds.
  for (const char* id : {"cpu.reference", "cuda.sm90.cutlass.bf16", "cuda.sm90.cutlass.fp16",
                         "cuda.sm90.cutlass.int4_group", "cuda.sm90.cutlass.int8_group",
                         "cuda.sm90.mx.mxfp4", "cuda.sm90.mx.nvfp4", "cuda.sm90.mx.mxfp8"})
    EXPECT_EQ(ids.count(id), 1u) << id;
  EXPECT_EQ(table.back()->id(), "cpu.reference") << "the fallback comes last";
  EXPECT_EQ(priority_of("no.such.impl"), -1);
  EXPECT_EQ(find_implementation("no.such.impl"), nullptr);
}

TEST(PriorityTable, IdsAreLowerCaseDotted) {
  for (const Implementation* impl : all_implementations()) {
    const std::string id = impl->id();
    for (char c : id)
      EXPECT_TRUE(std::islower(static_cast<unsigned char>(c)) ||
                  std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '_')
          << id;
    EXPECT_NE(id.find('.'), std::string::npos) << id;
    EXPECT_FALSE(impl->family().empty()) << id;
    EXPECT_NE(id, impl->family()) << "a family and an id must not collide: " << id;
  }
}

TEST(Resolve, AutoPicksByPriority) {
  Environment gpu = h200_env();
  Resolution r = resolve(small_spec(WeightFormat::kBF16, DType::kBFloat16), gpu, "auto");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.chosen->id(), "cuda.sm90.cutlass.bf16");
  EXPECT_FALSE(r.degraded_from.has_value());
  ASSERT_EQ(r.candidates.size(), all_implementations().size()) << "auto considers every candidate";
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    EXPECT_EQ(r.candidates[i].priority, static_cast<int>(i));
    EXPECT_EQ(r.candidates[i].chosen, r.candidates[i].id == "cuda.sm90.cutlass.bf16");
  }
  EXPECT_TRUE(r.candidates.back().eligible) << "the reference stays eligible, just lower";

  r = resolve(small_spec(WeightFormat::kFP16, DType::kFloat16), gpu, "auto");
  EXPECT_EQ(r.chosen->id(), "cuda.sm90.cutlass.fp16");
  r = resolve(small_spec(WeightFormat::kFP32, DType::kFloat32), gpu, "auto");
  EXPECT_EQ(r.chosen->id(), "cpu.reference");
  // With a GPU present, falling back to the CPU is said out loud, with the device's reason.
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->chosen, "cpu.reference");
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kFormat);
  EXPECT_NE(r.degraded_from->reason.reason.find("cuda.sm90.cutlass.bf16"), std::string::npos);
  r = resolve(small_spec(), Environment::cpu_only(), "auto");
  EXPECT_EQ(r.chosen->id(), "cpu.reference");
  EXPECT_FALSE(r.degraded_from.has_value()) << "without a GPU the CPU is no degradation";
  EXPECT_EQ(r.environment_fingerprint, Environment::cpu_only().fingerprint());
}

TEST(Resolve, AutoOnThisMachine) {
  // Wherever the tests run, auto finds something for a bf16 layer: a GPU kernel or the reference.
  Resolution r = resolve(small_spec(), Environment::detected(), "auto");
  ASSERT_TRUE(r.ok()) << r.table();
  if (Environment::detected().gpus.empty()) EXPECT_EQ(r.chosen->id(), "cpu.reference");
}

TEST(Resolve, FamilyAndIdRequests) {
  Environment gpu = h200_env();
  Resolution r = resolve(small_spec(WeightFormat::kFP16, DType::kFloat16), gpu, "cutlass");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.chosen->id(), "cuda.sm90.cutlass.fp16");
  ASSERT_EQ(r.candidates.size(), 6u) << "a family request considers its members only (bf16, fp16, "
                                        "fp8_block128, fp8, int4_group, int8_group)";
  EXPECT_EQ(r.candidates[0].rejection->stage, RejectStage::kFormat);

  r = resolve(small_spec(), gpu, "reference");
  EXPECT_EQ(r.chosen->id(), "cpu.reference") << "a lower-priority family is given when asked for";
  r = resolve(small_spec(), gpu, "cpu.reference");
  EXPECT_EQ(r.chosen->id(), "cpu.reference");
  ASSERT_EQ(r.candidates.size(), 1u);

  r = resolve(small_spec(), Environment::cpu_only(), "cuda.sm90.cutlass.bf16");
  EXPECT_FALSE(r.ok());
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->requested, "cuda.sm90.cutlass.bf16");
  EXPECT_EQ(r.degraded_from->chosen, "");
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kGpuGeneration);
}

TEST(Resolve, UnknownRequestIsNotFound) {
  try {
    resolve(small_spec(), h200_env(), "triton");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("triton"), std::string::npos);
  }
}

TEST(Resolve, InvalidSpecIsRefused) {
  MoeSpec s = small_spec();
  s.top_k = 0;
  try {
    resolve(s, h200_env(), "auto");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidSpec);
  }
}

TEST(Resolve, CutlassFamilyExplainsTheInformativeRejection) {
  // fp16 layer, hidden not a multiple of 8: the bf16 member declines on format (not news), the
  // fp16 member on alignment (the reason the user can act on).
  MoeSpec s = small_spec(WeightFormat::kFP16, DType::kFloat16);
  s.hidden = 260;
  Resolution r = resolve(s, h200_env(), "cutlass");
  EXPECT_FALSE(r.ok());
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->requested, "cutlass");
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kAlignment);
  EXPECT_NE(r.degraded_from->reason.reason.find("cuda.sm90.cutlass.fp16"), std::string::npos);

  // No GPU: the fp16 member matched the format and lacks only the GPU; that is said, not the
  // bf16 member's format mismatch.
  r = resolve(small_spec(WeightFormat::kFP16, DType::kFloat16), Environment::cpu_only(), "cutlass");
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kGpuGeneration);
  EXPECT_NE(r.degraded_from->reason.reason.find("cuda.sm90.cutlass.fp16"), std::string::npos);

  // An H200 but a CUDA-less build: the build is blamed, since format and SM fit.
  Environment nocuda = h200_env();
  nocuda.built_with_cuda = nocuda.built_with_cutlass = false;
  r = resolve(small_spec(), nocuda, "cutlass");
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kBuild);
}

TEST(Resolve, Fp16WeightsWithBf16ActivationsNameTheDtypeNeeded) {
  // Both members decline on format: the bf16 one for the weights, the fp16 one for the
  // activations. The fp16 one says what to change.
  for (const Environment& env : {Environment::cpu_only(), h200_env()}) {
    Resolution r = resolve(small_spec(WeightFormat::kFP16, DType::kBFloat16), env, "cutlass");
    EXPECT_FALSE(r.ok());
    ASSERT_TRUE(r.degraded_from.has_value());
    EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kFormat);
    EXPECT_NE(r.degraded_from->reason.reason.find("fp16 weights need fp16 activations, not bf16"),
              std::string::npos)
        << r.degraded_from->reason.reason;
  }
}

#ifndef MOEKIT_WITH_CUDA
TEST(Resolve, CudaLessBuildSaysSo) {
  Resolution r = resolve(small_spec(), Environment::detected(), "cutlass");
  EXPECT_FALSE(r.ok());
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_NE(r.degraded_from->reason.reason.find("no CUDA"), std::string::npos)
      << r.degraded_from->reason.reason;
}
#endif

// degraded_from among fakes: family "f" of four members, priority order A, B, C, D.
class DegradedFrom : public ::testing::Test {
 protected:
  static Capability cap_with(WeightFormat f) {
    Capability c = permissive_capability();
    c.weight_formats = {f};
    return c;
  }
  static Capability gpu_cap() {
    Capability c = permissive_capability();
    c.sm_min = c.sm_max = 100;
    return c;
  }
  static Capability limited_cap(int64_t max_top_k) {
    Capability c = permissive_capability();
    c.max_top_k = max_top_k;
    return c;
  }
  Resolution run(const std::vector<const Implementation*>& table,
                 const std::string& request = "f") {
    return resolve_in(table, small_spec(), h200_env(), request);
  }
};

TEST_F(DegradedFrom, HighestPriorityInformativeRejection) {
  FakeImpl a("f.a.k.fp8", "f", cap_with(WeightFormat::kFP8Block128));  // format
  FakeImpl b("f.b.k.bf16", "f", gpu_cap());                            // GPU generation
  FakeImpl c("f.c.k.bf16", "f", limited_cap(1));                       // limits: informative
  Capability feat = permissive_capability();
  feat.routings = {RoutingMethod::kLlama4};
  FakeImpl d("f.d.k.bf16", "f", feat);  // routing: informative, but lower priority
  FakeImpl other("g.x.k.bf16", "g", permissive_capability());
  Resolution r = run({&a, &b, &c, &d, &other});
  EXPECT_FALSE(r.ok()) << "a family with no eligible member fails; other families do not stand in";
  ASSERT_EQ(r.candidates.size(), 4u);
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kLimits);
  EXPECT_NE(r.degraded_from->reason.reason.find("f.c.k.bf16"), std::string::npos);
}

TEST_F(DegradedFrom, GpuGenerationOverFormatWhenNothingElse) {
  FakeImpl a("f.a.k.fp8", "f", cap_with(WeightFormat::kFP8Block128));
  FakeImpl b("f.b.k.bf16", "f", gpu_cap());
  Resolution r = run({&a, &b});
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kGpuGeneration);
  EXPECT_NE(r.degraded_from->reason.reason.find("f.b.k.bf16"), std::string::npos);
}

TEST_F(DegradedFrom, MemberTakingTheWeightFormatNamesTheActivationDtype) {
  FakeImpl a("f.a.k.fp8", "f", cap_with(WeightFormat::kFP8Block128));
  Capability half_acts = permissive_capability();
  half_acts.act_dtypes = {DType::kFloat16, DType::kFloat32};
  FakeImpl b("f.b.k.bf16", "f", half_acts);
  Resolution r = run({&a, &b});
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kFormat);
  EXPECT_NE(
      r.degraded_from->reason.reason.find("bf16 weights need fp16 or fp32 activations, not bf16"),
      std::string::npos)
      << r.degraded_from->reason.reason;
  EXPECT_NE(r.degraded_from->reason.reason.find("f.b.k.bf16"), std::string::npos);
}

TEST_F(DegradedFrom, FirstMemberWhenAllAreFormat) {
  FakeImpl a("f.a.k.fp8", "f", cap_with(WeightFormat::kFP8Block128));
  FakeImpl b("f.b.k.mxfp4", "f", cap_with(WeightFormat::kMXFP4));
  Resolution r = run({&a, &b});
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kFormat);
  EXPECT_NE(r.degraded_from->reason.reason.find("f.a.k.fp8"), std::string::npos);
}

TEST_F(DegradedFrom, NoDegradationWhenAMemberIsEligible) {
  FakeImpl a("f.a.k.bf16", "f", limited_cap(1));
  FakeImpl b("f.b.k.bf16", "f", permissive_capability());
  Resolution r = run({&a, &b});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.chosen, &b);
  EXPECT_FALSE(r.degraded_from.has_value());
  EXPECT_EQ(a.engines_created + b.engines_created, 0) << "resolving builds no engine";
}

TEST_F(DegradedFrom, AutoNeverDegrades) {
  FakeImpl a("f.a.k.bf16", "f", limited_cap(1));
  Resolution r = run({&a}, "auto");
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.degraded_from.has_value());
  ASSERT_EQ(r.candidates.size(), 1u);
  EXPECT_EQ(r.candidates[0].rejection->stage, RejectStage::kLimits);
}

TEST_F(DegradedFrom, IdRequestReportsItsOwnRejection) {
  FakeImpl a("f.a.k.bf16", "f", limited_cap(1));
  FakeImpl b("f.b.k.bf16", "f", permissive_capability());
  Resolution r = run({&a, &b}, "f.a.k.bf16");
  EXPECT_FALSE(r.ok()) << "an id request is not served by a sibling";
  ASSERT_EQ(r.candidates.size(), 1u);
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->requested, "f.a.k.bf16");
  EXPECT_EQ(r.degraded_from->reason.stage, RejectStage::kLimits);
}

}  // namespace
}  // namespace moekit::registry::test
