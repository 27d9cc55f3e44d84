// The eligibility matrix: each rule rejects exactly what it should, with its stage, and the
// checks run in RejectStage order.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "registry/registry_fixtures.hpp"
#include "support/specs.hpp"

namespace moekit::registry::test {
namespace {

struct Row {
  std::string name;
  std::function<void(MoeSpec&)> spec;
  std::function<void(Environment&)> env;
  std::optional<RejectStage> expected;  // nullopt: eligible
};

auto no_spec = [](MoeSpec&) {};
auto no_env = [](Environment&) {};

void expect_row(const Implementation& impl, const Row& row) {
  MoeSpec spec = small_spec(WeightFormat::kBF16, DType::kBFloat16);
  Environment env = h200_env();
  row.spec(spec);
  row.env(env);
  ASSERT_TRUE(spec.validate().empty()) << row.name << ": the row's spec must be valid";
  Eligibility e = impl.can_implement(spec, env);
  if (!row.expected) {
    EXPECT_TRUE(e.ok()) << row.name << ": rejected at " << to_string(e.rejection().stage) << ": "
                        << e.rejection().reason;
    return;
  }
  ASSERT_FALSE(e.ok()) << row.name << ": expected a rejection at " << to_string(*row.expected);
  EXPECT_EQ(e.rejection().stage, *row.expected) << row.name << ": " << e.rejection().reason;
  EXPECT_NE(e.rejection().reason.find(impl.id()), std::string::npos)
      << row.name << ": the sentence names the implementation: " << e.rejection().reason;
}

TEST(Eligibility, CutlassBf16Matrix) {
  using S = RejectStage;
  const std::vector<Row> rows = {
      {"base", no_spec, no_env, std::nullopt},
      {"fp16 weights",
       [](MoeSpec& s) {
         s.weights.format = WeightFormat::kFP16;
         s.act_dtype = DType::kFloat16;
       },
       no_env, S::kFormat},
      {"fp8 block weights", [](MoeSpec& s) { s.weights.format = WeightFormat::kFP8Block128; },
       no_env, S::kFormat},
      {"mxfp4 weights", [](MoeSpec& s) { s.weights.format = WeightFormat::kMXFP4; }, no_env,
       S::kFormat},
      {"fp32 activations", [](MoeSpec& s) { s.act_dtype = DType::kFloat32; }, no_env, S::kFormat},
      {"fp16 activations", [](MoeSpec& s) { s.act_dtype = DType::kFloat16; }, no_env, S::kFormat},
      {"no GPU", no_spec,
       [](Environment& e) {
         e.gpus.clear();
         e.probe_note = "no driver";
       },
       S::kGpuGeneration},
      {"A100 (SM 80)", no_spec,
       [](Environment& e) {
         e.gpus[0].sm = 80;
         e.gpus[0].name = "A100";
       },
       S::kGpuGeneration},
      {"B200 (SM 100)", no_spec, [](Environment& e) { e.gpus[0].sm = 100; }, S::kGpuGeneration},
      {"no CUDA build", no_spec, [](Environment& e) { e.built_with_cuda = false; }, S::kBuild},
      {"no CUTLASS build", no_spec, [](Environment& e) { e.built_with_cutlass = false; },
       S::kBuild},
      {"NCCL not needed", no_spec, [](Environment& e) { e.built_with_nccl = false; }, std::nullopt},
      // Order: what the problem is and where it runs is never blamed on the build.
      {"format before build", [](MoeSpec& s) { s.weights.format = WeightFormat::kFP8PerTensor; },
       [](Environment& e) { e.built_with_cuda = e.built_with_cutlass = false; }, S::kFormat},
      {"SM before build", no_spec,
       [](Environment& e) {
         e.gpus[0].sm = 80;
         e.built_with_cuda = e.built_with_cutlass = false;
       },
       S::kGpuGeneration},
      {"no GPU before build", no_spec,
       [](Environment& e) {
         e.gpus.clear();
         e.built_with_cuda = false;
       },
       S::kGpuGeneration},
      {"format before SM", [](MoeSpec& s) { s.act_dtype = DType::kFloat32; },
       [](Environment& e) { e.gpus.clear(); }, S::kFormat},
      // Everything the Hopper engine declares it runs.
      {"clamped swiglu, alpha, beta", [](MoeSpec& s) { moekit::test::set_clamped_swiglu(s); },
       no_env, std::nullopt},
      {"gelu tanh", [](MoeSpec& s) { s.activation.kind = ActivationKind::kGeGLUTanh; }, no_env,
       std::nullopt},
      {"relu2 (non-gated)", [](MoeSpec& s) { s.activation.kind = ActivationKind::kReLU2; }, no_env,
       std::nullopt},
      {"mixtral routing", [](MoeSpec& s) { s.routing.method = RoutingMethod::kSoftmaxTopK; },
       no_env, std::nullopt},
      {"external routing", [](MoeSpec& s) { s.routing.method = RoutingMethod::kExternal; }, no_env,
       std::nullopt},
      {"llama4 routing, weight on the input",
       [](MoeSpec& s) {
         s.routing.method = RoutingMethod::kLlama4;
         s.routing.weight_placement = RouterWeightPlacement::kInput;
       },
       no_env, std::nullopt},
      {"both biases", [](MoeSpec& s) { s.fc1_bias = s.fc2_bias = true; }, no_env, std::nullopt},
      {"TP 2 and EP 2",
       [](MoeSpec& s) {
         s.tp_size = 2;
         s.tp_rank = 1;
         s.ep_size = 2;
         s.ep_rank = 1;
       },
       no_env, std::nullopt},
      // 16-byte TMA rows: hidden and the local intermediate are multiples of 8 elements.
      {"hidden 260", [](MoeSpec& s) { s.hidden = 260; }, no_env, S::kAlignment},
      {"intermediate 260", [](MoeSpec& s) { s.intermediate = 260; }, no_env, S::kAlignment},
      {"intermediate 256 over TP 64 = 4",
       [](MoeSpec& s) {
         s.tp_size = 64;
         s.tp_rank = 3;
       },
       no_env, S::kAlignment},
      {"intermediate 256 over TP 32 = 8",
       [](MoeSpec& s) {
         s.tp_size = 32;
         s.tp_rank = 31;
       },
       no_env, std::nullopt},
      {"top-k 32",
       [](MoeSpec& s) {
         s.num_experts = 64;
         s.top_k = 32;
       },
       no_env, std::nullopt},
      {"top-k 33",
       [](MoeSpec& s) {
         s.num_experts = 64;
         s.top_k = 33;
       },
       no_env, S::kLimits},
      {"alignment before limits",
       [](MoeSpec& s) {
         s.num_experts = 64;
         s.top_k = 33;
         s.hidden = 260;
       },
       no_env, S::kAlignment},
      {"memory does not matter", no_spec, [](Environment& e) { e.gpus[0].memory_bytes = 1; },
       std::nullopt},
  };
  for (const Row& row : rows) expect_row(*find_implementation("cuda.sm90.cutlass.bf16"), row);
}

TEST(Eligibility, CutlassFp16TakesOnlyFp16) {
  const Implementation& fp16 = *find_implementation("cuda.sm90.cutlass.fp16");
  Environment env = h200_env();
  EXPECT_TRUE(fp16.can_implement(small_spec(WeightFormat::kFP16, DType::kFloat16), env).ok());
  for (auto [w, a] : {std::pair{WeightFormat::kBF16, DType::kBFloat16},
                      std::pair{WeightFormat::kFP16, DType::kBFloat16},
                      std::pair{WeightFormat::kBF16, DType::kFloat16},
                      std::pair{WeightFormat::kFP32, DType::kFloat32}}) {
    Eligibility e = fp16.can_implement(small_spec(w, a), env);
    ASSERT_FALSE(e.ok()) << to_string(w) << "/" << to_string(a);
    EXPECT_EQ(e.rejection().stage, RejectStage::kFormat);
  }
}

TEST(Eligibility, ReferenceRunsEveryFormatActivationAndRoutingWithoutAGpu) {
  const Implementation& ref = *find_implementation("cpu.reference");
  Environment env = Environment::cpu_only();
  env.built_with_cuda = env.built_with_cutlass = false;
  for (WeightFormat f : permissive_capability().weight_formats)
    for (DType a : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      MoeSpec s = small_spec(f, a);
      ASSERT_TRUE(s.validate().empty()) << to_string(f);
      Eligibility e = ref.can_implement(s, env);
      EXPECT_TRUE(e.ok()) << to_string(f) << "/" << to_string(a) << ": " << e.rejection().reason;
    }
  for (ActivationKind k : permissive_capability().activations) {
    MoeSpec s = small_spec();
    s.activation.kind = k;
    EXPECT_TRUE(ref.can_implement(s, env).ok()) << to_string(k);
  }
  for (RoutingMethod m :
       {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax, RoutingMethod::kExternal}) {
    MoeSpec s = small_spec();
    s.routing.method = m;
    EXPECT_TRUE(ref.can_implement(s, env).ok()) << to_string(m);
  }
  for (RouterWeightPlacement p : {RouterWeightPlacement::kOutput, RouterWeightPlacement::kInput}) {
    MoeSpec s = small_spec();
    s.routing.weight_placement = p;
    EXPECT_TRUE(ref.can_implement(s, env).ok()) << to_string(p);
  }
  MoeSpec sharded = small_spec();
  sharded.tp_size = 2;
  sharded.ep_size = 4;
  sharded.fc1_bias = sharded.fc2_bias = true;
  EXPECT_TRUE(ref.can_implement(sharded, env).ok());
  EXPECT_TRUE(ref.can_implement(small_spec(), h200_env()).ok()) << "a GPU does not stop it";
}

// The rules the table's implementations never trip today, on a fake whose capability each row
// narrows by one thing.
struct CapRow {
  std::string name;
  std::function<void(Capability&)> cap;
  std::function<void(MoeSpec&)> spec;
  std::function<void(Environment&)> env;
  std::optional<RejectStage> expected;
};

TEST(Eligibility, EachSharedRuleOnAFake) {
  using S = RejectStage;
  auto no_cap = [](Capability&) {};
  const std::vector<CapRow> rows = {
      {"permissive", no_cap, no_spec, no_env, std::nullopt},
      {"no formats", [](Capability& c) { c.weight_formats.clear(); }, no_spec, no_env, S::kFormat},
      {"no act dtypes", [](Capability& c) { c.act_dtypes = {DType::kFloat32}; }, no_spec, no_env,
       S::kFormat},
      {"int group size",
       [](Capability& c) {
         c.int_group_sizes = {64, 128};
       },
       [](MoeSpec& s) {
         s.weights.format = WeightFormat::kInt4Group;
         s.weights.group_size = 32;
       },
       no_env, S::kFormat},
      {"int group size taken",
       [](Capability& c) {
         c.int_group_sizes = {64, 128};
       },
       [](MoeSpec& s) {
         s.weights.format = WeightFormat::kInt8Group;
         s.weights.group_size = 64;
       },
       no_env, std::nullopt},
      {"no int group sizes, bf16 weights", [](Capability& c) { c.int_group_sizes.clear(); },
       no_spec, no_env, std::nullopt},
      {"int zero points", [](Capability& c) { c.int_zero_points = false; },
       [](MoeSpec& s) {
         s.weights.format = WeightFormat::kInt8Group;
         s.weights.zero_points = true;
       },
       no_env, S::kFormat},
      {"int pre-quant scale", [](Capability& c) { c.int_pre_quant_scale = false; },
       [](MoeSpec& s) {
         s.weights.format = WeightFormat::kInt4Group;
         s.weights.pre_quant_scale = true;
       },
       no_env, S::kFormat},
      {"neither asked, neither supported",
       [](Capability& c) { c.int_zero_points = c.int_pre_quant_scale = false; },
       [](MoeSpec& s) { s.weights.format = WeightFormat::kInt4Group; }, no_env, std::nullopt},
      {"needs SM 100", [](Capability& c) { c.sm_min = c.sm_max = 100; }, no_spec, no_env,
       S::kGpuGeneration},
      {"SM range 80..90",
       [](Capability& c) {
         c.sm_min = 80;
         c.sm_max = 90;
       },
       no_spec, no_env, std::nullopt},
      {"no GPU needed, none there", no_cap, no_spec, [](Environment& e) { e.gpus.clear(); },
       std::nullopt},
      {"needs NCCL", [](Capability& c) { c.needs_nccl = true; }, no_spec, no_env, S::kBuild},
      {"needs NCCL, has it", [](Capability& c) { c.needs_nccl = true; }, no_spec,
       [](Environment& e) { e.built_with_nccl = true; }, std::nullopt},
      {"activation kind", [](Capability& c) { c.activations = {ActivationKind::kSiLU}; }, no_spec,
       no_env, S::kActivation},
      {"clamp", [](Capability& c) { c.clamp = false; },
       [](MoeSpec& s) {
         s.activation.kind = ActivationKind::kSwiGLUClamped;
         s.activation.limit = 7.0f;
       },
       no_env, S::kActivation},
      {"alpha only", [](Capability& c) { c.alpha_beta = false; },
       [](MoeSpec& s) {
         s.activation.kind = ActivationKind::kSwiGLUClamped;
         s.activation.limit = 7.0f;
         s.activation.alpha = 1.702f;
       },
       no_env, S::kActivation},
      {"beta only", [](Capability& c) { c.alpha_beta = false; },
       [](MoeSpec& s) {
         s.activation.kind = ActivationKind::kSwiGLUClamped;
         s.activation.limit = 7.0f;
         s.activation.beta = 1.0f;
       },
       no_env, S::kActivation},
      {"routing", [](Capability& c) { c.routings = {RoutingMethod::kTopKSoftmax}; },
       [](MoeSpec& s) { s.routing.method = RoutingMethod::kSoftmaxTopK; }, no_env, S::kRouting},
      {"weight on the input", [](Capability& c) { c.router_weight_on_input = false; },
       [](MoeSpec& s) { s.routing.weight_placement = RouterWeightPlacement::kInput; }, no_env,
       S::kRouting},
      {"weight on the output, input not supported",
       [](Capability& c) { c.router_weight_on_input = false; }, no_spec, no_env, std::nullopt},
      {"fc1 bias", [](Capability& c) { c.fc1_bias = false; }, [](MoeSpec& s) { s.fc1_bias = true; },
       no_env, S::kFeature},
      {"fc2 bias", [](Capability& c) { c.fc2_bias = false; }, [](MoeSpec& s) { s.fc2_bias = true; },
       no_env, S::kFeature},
      {"no bias asked, none supported", [](Capability& c) { c.fc1_bias = c.fc2_bias = false; },
       no_spec, no_env, std::nullopt},
      {"hidden multiple 512", [](Capability& c) { c.hidden_multiple = 512; }, no_spec, no_env,
       S::kAlignment},
      {"intermediate multiple 512", [](Capability& c) { c.intermediate_multiple = 512; }, no_spec,
       no_env, S::kAlignment},
      {"max tokens 32", [](Capability& c) { c.max_tokens = 32; }, no_spec, no_env, S::kLimits},
      {"max tokens 64", [](Capability& c) { c.max_tokens = 64; }, no_spec, no_env, std::nullopt},
      {"max experts 4", [](Capability& c) { c.max_experts = 4; }, no_spec, no_env, S::kLimits},
      {"max top-k 1", [](Capability& c) { c.max_top_k = 1; }, no_spec, no_env, S::kLimits},
      {"no TP", [](Capability& c) { c.tensor_parallel = false; }, [](MoeSpec& s) { s.tp_size = 2; },
       no_env, S::kParallelism},
      {"no EP", [](Capability& c) { c.expert_parallel = false; }, [](MoeSpec& s) { s.ep_size = 2; },
       no_env, S::kParallelism},
      {"no TP, TP 1", [](Capability& c) { c.tensor_parallel = c.expert_parallel = false; }, no_spec,
       no_env, std::nullopt},
  };
  for (const CapRow& row : rows) {
    Capability cap = permissive_capability();
    row.cap(cap);
    FakeImpl fake("fake.test.kernel.any", "fake", cap);
    expect_row(fake, Row{row.name, row.spec, row.env, row.expected});
  }
}

// Break every stage at once, then repair them one by one: the reported stage walks the
// RejectStage order exactly.
TEST(Eligibility, ChecksRunInStageOrder) {
  Capability cap = permissive_capability();
  cap.weight_formats = {WeightFormat::kFP16};
  cap.sm_min = cap.sm_max = 100;
  cap.needs_nccl = true;
  cap.activations = {ActivationKind::kSiLU};
  cap.routings = {RoutingMethod::kSoftmaxTopK};
  cap.fc1_bias = false;
  cap.hidden_multiple = 512;
  cap.max_top_k = 1;
  cap.tensor_parallel = false;
  FakeImpl fake("fake.order.kernel.fp16", "fake", cap);

  MoeSpec s = small_spec();
  s.fc1_bias = true;
  s.tp_size = 2;
  Environment env = h200_env();
  const std::vector<std::function<void()>> repairs = {
      [&] {
        s.weights.format = WeightFormat::kFP16;
        s.act_dtype = DType::kFloat16;
      },
      [&] { env.gpus[0].sm = 100; },
      [&] { env.built_with_nccl = true; },
      [&] { s.activation.kind = ActivationKind::kSiLU; },
      [&] { s.routing.method = RoutingMethod::kSoftmaxTopK; },
      [&] { s.fc1_bias = false; },
      [&] { s.hidden = 512; },
      [&] { s.top_k = 1; },
      [&] { s.tp_size = 1; },
  };
  for (size_t i = 0; i < repairs.size(); ++i) {
    ASSERT_TRUE(s.validate().empty());
    Eligibility e = fake.can_implement(s, env);
    ASSERT_FALSE(e.ok()) << "step " << i;
    EXPECT_EQ(static_cast<int>(e.rejection().stage), static_cast<int>(i) + 1)
        << "step " << i << ": " << e.rejection().reason;
    repairs[i]();
  }
  EXPECT_TRUE(fake.can_implement(s, env).ok());
}

TEST(Eligibility, ReasonsNameTheValues) {
  const Implementation& bf16 = *find_implementation("cuda.sm90.cutlass.bf16");
  Environment env = h200_env();
  MoeSpec s = small_spec();
  s.hidden = 260;
  EXPECT_NE(bf16.can_implement(s, env).rejection().reason.find("260"), std::string::npos);
  env.gpus[0].sm = 80;
  env.gpus[0].name = "NVIDIA A100";
  std::string r = bf16.can_implement(small_spec(), env).rejection().reason;
  EXPECT_NE(r.find("NVIDIA A100"), std::string::npos) << r;
  EXPECT_NE(r.find("80"), std::string::npos) << r;
  env.gpus.clear();
  env.probe_note = "cudaGetDeviceCount failed: cudaErrorNoDevice";
  r = bf16.can_implement(small_spec(), env).rejection().reason;
  EXPECT_NE(r.find("cudaErrorNoDevice"), std::string::npos) << "the probe note explains: " << r;
}

// An implementation that applies the routing weight to the experts' output only refuses the
// input placement at stage routing, with a sentence naming the placement.
TEST(Eligibility, WeightOnTheInputNeedsTheCapability) {
  Capability cap = permissive_capability();
  cap.router_weight_on_input = false;
  FakeImpl fake("fake.output.kernel.any", "fake", cap);
  MoeSpec s = small_spec();
  s.routing.method = RoutingMethod::kLlama4;
  s.routing.weight_placement = RouterWeightPlacement::kInput;
  ASSERT_TRUE(s.validate().empty());
  const Eligibility e = fake.can_implement(s, h200_env());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.rejection().stage, RejectStage::kRouting);
  EXPECT_NE(e.rejection().reason.find("weight_placement input"), std::string::npos)
      << e.rejection().reason;
  // The resolver then passes it over for one that can.
  const Resolution r = resolve(s, Environment::cpu_only(), "auto");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.chosen->capability().router_weight_on_input) << r.chosen->id();
}

TEST(Eligibility, RejectStageNamesRoundTrip) {
  for (int i = 1; i <= 9; ++i) {
    auto s = static_cast<RejectStage>(i);
    EXPECT_EQ(reject_stage_from_string(to_string(s)), s);
  }
  EXPECT_FALSE(reject_stage_from_string("nonsense").has_value());
}

}  // namespace
}  // namespace moekit::registry::test
