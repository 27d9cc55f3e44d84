// The sm90 microscaling engine (pipeline/sm90_mx_engine.hpp: bf16 or fp16 activations, kMXFP4,
// kNVFP4 or kMXFP8 weights) against reference::forward on fresh random inputs, outputs poisoned
// (0xFF bytes, NaN) before every run, the engine's own buffers poisoned too
// (Sm90MxOptions::poison) unless a case says otherwise. The reference decodes the same values
// and scales exactly (quant::dequantize_expert) and rounds where the kernels do (FC1's output,
// the activation; MXFP8's activations through e4m3 per 32 columns, W8A8), so
// ||out - ref|| / ||ref|| < 1e-2: what is left is the order of the fp32 sums (for MXFP8, as for
// the FP8 engine, 5e-2 per forward and 1e-2 over a test's outputs).
// Cases: the three formats x bf16 and fp16, with and without biases, T in {1, 7, 64, 513};
// gpt-oss-120b's own hidden and intermediate (2880 x 2880, 32 of its 128 experts) in MXFP4 with
// its clamped SwiGLU, interleaved gate/up and biases; every routing method x activation; all
// tokens to the same experts; TP and EP ranks; the routing weight on the experts' input; CUDA
// graph capture of the first call equal to eager; bad caller ids and bad views; the specs the
// engine refuses (no GPU needed). Sm90MxEngineSanitizer holds the small case for
// compute-sanitizer. The layers, inputs and checks are shared with the other engines' tests:
// support/engine_check.hpp.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "pipeline/sm90_mx_engine.hpp"
#include "quant/quant.hpp"
#include "support/engine_check.hpp"
#include "support/gpu.hpp"

namespace moekit::pipeline {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

constexpr WeightFormat kFormats[] = {WeightFormat::kMXFP4, WeightFormat::kNVFP4,
                                     WeightFormat::kMXFP8};
constexpr double kTolerance = 1e-2;

// `s` with `act` activations and microscaling weights of `format`.
MoeSpec mx_layer(MoeSpec s, WeightFormat format, DType act = DType::kBFloat16) {
  s.act_dtype = act;
  s.weights = WeightQuant{};
  s.weights.format = format;
  s.weights.group_size = format_scale_group(format, 0);
  return s;
}

EngineFactory mx_factory(bool poison, std::string tactic = "") {
  return hooked_factory<Sm90MxOptions>(
      [](const MoeSpec& s, const MoeWeights& w, int device, const Sm90MxOptions& o) {
        return make_sm90_mx_engine(s, w, device, o);
      },
      poison, std::move(tactic));
}

// `spec` may be sharded: weights are drawn for the unsharded layer, then cut.
Layer make_layer(const MoeSpec& spec, uint64_t seed, bool poison = true, std::string tactic = "") {
  return make_engine_layer(spec, seed, mx_factory(poison, std::move(tactic)));
}

// MXFP8 rounds FC2's input to e4m3 as the reference does (W8A8), so a forward of a few tokens
// can move by an e4m3 step where the tensor cores' sum tips a value across a rounding boundary:
// held per forward as the FP8 engine is (engine_check.hpp: kFp8PerForward), and every output of
// a test pooled to kFp8Pooled.
class Sm90MxEngineTest : public GpuTest {
 protected:
  // Each token count on fresh inputs against the reference.
  void check_tokens(Layer& l, const std::vector<int64_t>& tokens, Ids mode, std::mt19937_64& rng) {
    const bool w8a8 = l.spec.weights.format == WeightFormat::kMXFP8;
    check_token_counts(l, tokens, mode, rng, w8a8 ? kFp8PerForward : kTolerance);
  }
  void SetUp() override {
    GpuTest::SetUp();
    active_error_pool() = &pool_;
  }
  void TearDown() override {
    active_error_pool() = nullptr;
    if (pool_.squared_norm > 0)
      EXPECT_LT(pool_.rel(), kFp8Pooled) << "all outputs of the test against the reference";
  }
  ErrorPool pool_;
};

TEST_F(Sm90MxEngineTest, EveryFormatAcrossTokenCounts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a01);
  int n = 0;
  for (const WeightFormat f : kFormats)
    for (const DType act : {DType::kBFloat16, DType::kFloat16})
      for (const bool biases : {false, true}) {
        MoeSpec s = mx_layer(
            engine_spec(16, 4, 256, 192, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU), f,
            act);
        s.fc1_bias = biases;
        s.fc2_bias = biases && n % 2 == 0;
        s.max_tokens = 513;
        ++n;
        Layer l = make_layer(s, rng());
        check_tokens(l, {1, 7, 64, 513}, Ids::kRouted, rng);
      }
}

// gpt-oss-120b as it ships, at its own hidden and intermediate with 32 of its experts; the other
// presets' routing and activations at scaled-down shapes in each format.
TEST_F(Sm90MxEngineTest, PresetShapesAndRouting) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a02);
  if (!sanitizer_run()) {
    MoeSpec gpt = find_preset("gpt-oss-120b").spec;
    ASSERT_EQ(gpt.weights.format, WeightFormat::kMXFP4);
    ASSERT_EQ(gpt.hidden, 2880);
    ASSERT_EQ(gpt.intermediate, 2880);
    gpt.num_experts = 32;
    gpt.max_tokens = 64;
    gpt.tp_size = gpt.ep_size = 1;
    gpt.tp_rank = gpt.ep_rank = 0;
    Layer l = make_layer(gpt, rng());
    check_tokens(l, {1, 7, 64}, Ids::kRouted, rng);
  }
  for (const WeightFormat f : kFormats) {
    const MoeSpec specs[] = {
        mx_layer(scaled_preset("gpt-oss-120b", 32, 384, 256), f),
        mx_layer(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f),
        mx_layer(scaled_preset("mixtral-8x7b", 8, 512, 384), f, DType::kFloat16),
        mx_layer(scaled_preset("deepseek-v3", 64, 512, 256), f),
    };
    for (const MoeSpec& s : specs) {
      Layer l = make_layer(s, rng());
      EXPECT_GT(l.engine->workspace_bytes(), 0u);
      check_tokens(l, {1, 7, 64, 513}, Ids::kRouted, rng);
    }
  }
}

TEST_F(Sm90MxEngineTest, EveryRoutingMethodTimesActivation) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a03);
  for_every_routing_method_times_activation(
      [](const MoeSpec& s, int n) {
        return mx_layer(s, kFormats[n % 3], n % 4 == 0 ? DType::kFloat16 : DType::kBFloat16);
      },
      [&](const MoeSpec& s) {
        Layer l = make_layer(s, rng());
        check_tokens(l, {1, 7, 64, 513}, ids_for(s), rng);
      });
}

// Every token to the same k experts; the other experts receive nothing.
TEST_F(Sm90MxEngineTest, AllTokensToTheSameExperts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a04);
  for (const WeightFormat f : kFormats)
    for (const int64_t k : {1, 4}) {
      MoeSpec s = mx_layer(
          engine_spec(32, k, 256, 256, RoutingMethod::kExternal, ActivationKind::kSwiGLU), f);
      s.fc1_bias = s.fc2_bias = true;
      s.max_tokens = 1024;
      Layer l = make_layer(s, rng());
      check_tokens(l, {1, 8, 64, 1024}, Ids::kSameForAll, rng);
    }
}

TEST_F(Sm90MxEngineTest, TensorAndExpertParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a05);
  for (const WeightFormat f : kFormats) {
    // Local intermediate 256 (a multiple of 32). Biases: only TP rank 0 adds FC2's.
    MoeSpec tp = mx_layer(scaled_preset("gpt-oss-120b", 16, 256, 512), f);
    tp.tp_size = 2;
    const uint64_t seed = rng();
    for (const int64_t T : {1, 7, 513})
      check_tensor_parallel_ranks(tp, seed, T, rng, mx_factory(true));
    for_each_expert_parallel_rank([&](const MoeSpec& s) { return mx_layer(s, f); }, rng,
                                  [&](const MoeSpec& s, uint64_t ep_seed) {
                                    Layer l = make_layer(s, ep_seed);
                                    check_tokens(l, {1, 64, 513}, ids_for(s), rng);
                                  });
  }
}

// The routing weight on the experts' input (RouterWeightPlacement::kInput, Llama-4): the rows
// are scaled by their slots' weights (rounded), as the reference does
// (support/engine_check.hpp: for_each_weight_on_input_layer). Engine buffers poisoned and not.
TEST_F(Sm90MxEngineTest, WeightOnTheInput) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a06);
  for (const WeightFormat f : kFormats)
    for_each_weight_on_input_layer([&](const MoeSpec& s, int) { return mx_layer(s, f); },
                                   [&](const MoeSpec& s, bool poison) {
                                     Layer l = make_layer(s, rng(), poison);
                                     check_tokens(l, {1, 7, 64, 513}, ids_for(s), rng);
                                   });
}

// The very first forward of a fresh engine captured in a CUDA graph, replayed on old and new
// inputs, equal to eager runs (support/engine_check.hpp, check_graph).
TEST_F(Sm90MxEngineTest, GraphCaptureOfFirstCallEqualsEager) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a07);
  for (const WeightFormat f : kFormats)
    for (const bool poison : {false, true}) {
      SCOPED_TRACE(poison ? "engine buffers poisoned" : "");
      MoeSpec g = mx_layer(scaled_preset("gpt-oss-120b", 32, 384, 256), f);
      g.max_tokens = 600;
      for (const int64_t T : {1, 64, 600}) {
        Layer l = make_layer(g, rng(), poison);
        check_graph(l, T, rng);
      }
    }
}

// Bad caller ids (out of range, negative, repeated) dropped and the first one reported; views
// of the wrong dtype, shape, device or alignment refused with kInvalidArgument; a forced tactic
// that is not built refused with kNotFound.
TEST_F(Sm90MxEngineTest, BadCallerIdsAndBadViews) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a08);
  for (const WeightFormat f : kFormats) {
    const MoeSpec s =
        mx_layer(engine_spec(8, 2, 256, 128, RoutingMethod::kExternal, ActivationKind::kSwiGLU), f);
    check_bad_calls(s, mx_factory(true), rng);
    expect_unknown_tactic_refused(s, mx_factory(true, "sm90.mxfp4.no_such_tactic"),
                                  "no_such_tactic");
  }
}

// Host-side refusals: no GPU needed (checked before any CUDA call). Each is kUnsupported and
// its message names the value.
TEST(Sm90MxEngineLimits, RefusesWhatItDoesNotRun) {
  const auto base = [](WeightFormat f) {
    return mx_layer(
        engine_spec(8, 2, 256, 256, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU), f);
  };
  std::vector<Refused> cases;
  for (const WeightFormat f : kFormats) {
    MoeSpec fp32 = base(f);
    fp32.act_dtype = DType::kFloat32;
    cases.push_back({fp32, to_string(DType::kFloat32)});
  }
  MoeSpec nvfp4 = base(WeightFormat::kNVFP4);
  nvfp4.hidden = 272;  // 17 NVFP4 blocks of 16: not a multiple of the kernels' 32
  cases.push_back({nvfp4, "272"});
  for (const WeightFormat other :
       {WeightFormat::kBF16, WeightFormat::kFP8Block128, WeightFormat::kInt4Group}) {
    MoeSpec s = base(WeightFormat::kMXFP4);
    s.weights = WeightQuant{};
    s.weights.format = other;
    if (other == WeightFormat::kInt4Group) s.weights.group_size = 128;
    cases.push_back({s, to_string(other)});
  }
  add_limit_refusals(cases, base(WeightFormat::kMXFP4));
  expect_refused(
      cases, [](const MoeSpec& s, const MoeWeights& w) { return make_sm90_mx_engine(s, w, 0); });
}

// The small cases compute-sanitizer runs (memcheck, racecheck, initcheck): each format with
// both biases at 3, 64 and 512 tokens, a bad caller id, the weight on the input
// (support/engine_check.hpp, check_sanitizer_small_case).
class Sm90MxEngineSanitizer : public GpuTest {};

TEST_F(Sm90MxEngineSanitizer, SmallCase) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x3a09);
  for (const WeightFormat f : kFormats) {
    MoeSpec s = mx_layer(
        engine_spec(8, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU), f);
    s.fc1_bias = s.fc2_bias = true;
    s.max_tokens = 512;
    check_sanitizer_small_case(s, mx_factory(true), rng);
  }
}

}  // namespace
}  // namespace moekit::pipeline
