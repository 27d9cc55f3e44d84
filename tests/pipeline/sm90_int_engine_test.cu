// The sm90 W4A16 / W8A16 engine (pipeline/sm90_int_engine.hpp: bf16 or fp16 activations,
// kInt4Group or kInt8Group weights) against reference::forward on fresh random inputs, outputs
// poisoned (0xFF bytes, NaN) before every run, the engine's own buffers poisoned too
// (Sm90IntOptions::poison) unless a case says otherwise. The reference decodes the same codes
// exactly (quant::dequantize_expert) and rounds the activations where the kernels do (the AWQ
// pre-quant product, FC1's output, the activation), so ||out - ref|| / ||ref|| < 1e-2: what is
// left is the order of the sums and, on the tensor cores, each weight rounded to the
// activation type after its scale.
// Cases: int4 and int8 x bf16 and fp16 x groups 32, 64 and 128 x with and without zero points and
// AWQ pre-quant scale, T in {1, 7, 64, 513}, with the engine's pick and with each GEMM tactic
// forced (the GEMV at prefill sizes, CUTLASS at one token); Qwen3-30B-A3B's and Mixtral-8x7B's
// real hidden and intermediate; every routing method x activation; all tokens to the same
// experts; TP and EP ranks; the routing weight on the experts' input; CUDA graph capture of the
// first call equal to eager; bad caller ids and bad views; the specs the engine refuses.
// Sm90IntEngineSanitizer holds the small case for compute-sanitizer. The layers, inputs and
// checks are shared with the other engines' tests: support/engine_check.hpp.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "pipeline/sm90_int_engine.hpp"
#include "quant/quant.hpp"
#include "support/engine_check.hpp"
#include "support/gpu.hpp"

namespace moekit::pipeline {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

constexpr WeightFormat kFormats[] = {WeightFormat::kInt4Group, WeightFormat::kInt8Group};
constexpr double kTolerance = 1e-2;

// `s` with `act` activations and int weights of `format`.
MoeSpec int_layer(MoeSpec s, WeightFormat format, DType act = DType::kBFloat16, int group = 128,
                  bool zero_points = false, bool pre_quant_scale = false) {
  s.act_dtype = act;
  s.weights = WeightQuant{};
  s.weights.format = format;
  s.weights.group_size = group;
  s.weights.zero_points = zero_points;
  s.weights.pre_quant_scale = pre_quant_scale;
  return s;
}

std::string bits_of(WeightFormat f) { return f == WeightFormat::kInt4Group ? "int4" : "int8"; }
// The tactic names (gemm/int_grouped_gemm.hpp) of the two kinds of kernel.
std::string gemv_tactic(WeightFormat f) { return "sm90." + bits_of(f) + ".gemv.n8"; }
std::string cutlass_tactic(WeightFormat f) { return "sm90." + bits_of(f) + ".coop.128x64x64.c1x1"; }

EngineFactory int_factory(bool poison, std::string tactic = "") {
  return hooked_factory<Sm90IntOptions>(
      [](const MoeSpec& s, const MoeWeights& w, int device, const Sm90IntOptions& o) {
        return make_sm90_int_engine(s, w, device, o);
      },
      poison, std::move(tactic));
}

// `spec` may be sharded: weights are drawn for the unsharded layer, then cut.
Layer make_layer(const MoeSpec& spec, uint64_t seed, bool poison = true, std::string tactic = "") {
  return make_engine_layer(spec, seed, int_factory(poison, std::move(tactic)));
}

class Sm90IntEngineTest : public GpuTest {
 protected:
  // Each token count on fresh inputs against the reference.
  void check_tokens(Layer& l, const std::vector<int64_t>& tokens, Ids mode, std::mt19937_64& rng) {
    const WeightQuant& q = l.spec.weights;
    check_token_counts(l, tokens, mode, rng, kTolerance,
                       " group " + std::to_string(q.group_size) +
                           (q.zero_points ? " zero points" : "") +
                           (q.pre_quant_scale ? " pre-quant" : ""));
  }
};

// Every variant of the formats on a small layer with both biases, at the engine's pick, then
// with each kind of kernel forced at the token counts where the pick would not run it.
TEST_F(Sm90IntEngineTest, EveryVariantAcrossTokenCounts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a01);
  int n = 0;
  for (const WeightFormat f : kFormats)
    for (const DType act : {DType::kBFloat16, DType::kFloat16})
      for (const int group : {32, 64, 128})
        for (const bool zero : {false, true})
          for (const bool pre : {false, true}) {
            MoeSpec s = int_layer(
                engine_spec(16, 4, 256, 192, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU),
                f, act, group, zero, pre);
            if (group == 128) s.intermediate = 256;
            s.fc1_bias = n % 2 == 0;
            s.fc2_bias = n % 3 == 0;
            s.max_tokens = 513;
            ++n;
            const uint64_t seed = rng();
            Layer l = make_layer(s, seed);
            check_tokens(l, {1, 7, 64, 513}, Ids::kRouted, rng);
            if (group == 32) continue;  // the streaming GEMV is its only tactic
            Layer gemv = make_layer(s, seed, true, gemv_tactic(f));
            check_tokens(gemv, {64, 513}, Ids::kRouted, rng);
            Layer tensor_cores = make_layer(s, seed, true, cutlass_tactic(f));
            check_tokens(tensor_cores, {1, 7}, Ids::kRouted, rng);
          }
}

// The presets' routing and activations at scaled-down shapes, 1..4096 tokens.
TEST_F(Sm90IntEngineTest, PresetRoutingAcrossTokenCounts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a02);
  for (const WeightFormat f : kFormats) {
    const MoeSpec specs[] = {
        int_layer(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f, DType::kBFloat16, 128, true,
                  true),
        int_layer(scaled_preset("mixtral-8x7b", 8, 512, 384), f, DType::kFloat16, 64, false, false),
        int_layer(scaled_preset("deepseek-v3", 64, 512, 256), f, DType::kBFloat16, 64, true, false),
        int_layer(scaled_preset("gpt-oss-120b", 32, 384, 256), f, DType::kBFloat16, 128, false,
                  true),  // both biases, clamped SwiGLU, interleaved gate/up
    };
    for (const MoeSpec& s : specs) {
      Layer l = make_layer(s, rng());
      EXPECT_GT(l.engine->workspace_bytes(), 0u);
      check_tokens(l, {1, 7, 64, 513, 4096}, Ids::kRouted, rng);
    }
  }
}

// Qwen3-30B-A3B's and Mixtral-8x7B's own hidden and intermediate (2048 x 768 with 32 of its 128
// experts; 4096 x 14336 with its 8), their routing and activation, a few token counts.
TEST_F(Sm90IntEngineTest, PresetShapes) {
  if (sanitizer_run()) GTEST_SKIP() << "the same kernels run at the other tests' sizes";
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a03);
  MoeSpec qwen = find_preset("qwen3-30b-a3b").spec;
  qwen.num_experts = 32;
  MoeSpec mixtral = find_preset("mixtral-8x7b").spec;
  for (MoeSpec* s : {&qwen, &mixtral}) {
    s->max_tokens = 513;
    s->tp_size = s->ep_size = 1;
    s->tp_rank = s->ep_rank = 0;
  }
  ASSERT_EQ(qwen.hidden, 2048);
  ASSERT_EQ(qwen.intermediate, 768);
  ASSERT_EQ(mixtral.hidden, 4096);
  ASSERT_EQ(mixtral.intermediate, 14336);
  struct Case {
    MoeSpec spec;
    std::vector<int64_t> tokens;
  };
  const Case cases[] = {
      {int_layer(qwen, WeightFormat::kInt4Group, DType::kBFloat16, 128, true, true),
       {1, 7, 64, 513}},
      {int_layer(qwen, WeightFormat::kInt8Group, DType::kFloat16, 64, false, false), {1, 64}},
      {int_layer(mixtral, WeightFormat::kInt4Group, DType::kBFloat16, 128, true, false),
       {1, 7, 64}},
      {int_layer(mixtral, WeightFormat::kInt8Group, DType::kBFloat16, 128, false, true), {1, 64}},
  };
  for (const Case& c : cases) {
    Layer l = make_layer(c.spec, rng());
    check_tokens(l, c.tokens, Ids::kRouted, rng);
  }
}

TEST_F(Sm90IntEngineTest, EveryRoutingMethodTimesActivation) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a04);
  for_every_routing_method_times_activation(
      [](const MoeSpec& s, int n) {
        return int_layer(s, kFormats[n % 2], n % 3 == 0 ? DType::kFloat16 : DType::kBFloat16,
                         n % 2 ? 64 : 128, n % 4 < 2, n % 5 < 2);
      },
      [&](const MoeSpec& s) {
        Layer l = make_layer(s, rng());
        check_tokens(l, {1, 7, 64, 513}, ids_for(s), rng);
      });
}

// Every token to the same k experts; the other experts receive nothing.
TEST_F(Sm90IntEngineTest, AllTokensToTheSameExperts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a05);
  for (const WeightFormat f : kFormats)
    for (const int64_t k : {1, 4}) {
      MoeSpec s =
          int_layer(engine_spec(32, k, 256, 256, RoutingMethod::kExternal, ActivationKind::kSwiGLU),
                    f, DType::kBFloat16, 64, true, true);
      s.fc1_bias = s.fc2_bias = true;
      Layer l = make_layer(s, rng());
      check_tokens(l, {1, 8, 64, 4096}, Ids::kSameForAll, rng);
    }
}

TEST_F(Sm90IntEngineTest, TensorParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a06);
  for (const WeightFormat f : kFormats) {
    // Local intermediate 256: whole groups on each rank. Biases: only rank 0 adds FC2's.
    MoeSpec s = int_layer(scaled_preset("gpt-oss-120b", 16, 256, 512), f, DType::kBFloat16, 128,
                          true, true);
    s.tp_size = 2;
    const uint64_t seed = rng();
    for (const int64_t T : {1, 7, 513})
      check_tensor_parallel_ranks(s, seed, T, rng, int_factory(true));
  }
}

// EP ranks: tokens whose experts all live on other ranks get exact zeros.
TEST_F(Sm90IntEngineTest, ExpertParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a07);
  for (const WeightFormat f : kFormats)
    for_each_expert_parallel_rank(
        [&](const MoeSpec& s) {
          return int_layer(s, f, DType::kBFloat16, 64, f == WeightFormat::kInt4Group, true);
        },
        rng,
        [&](const MoeSpec& s, uint64_t seed) {
          Layer l = make_layer(s, seed);
          check_tokens(l, {1, 64, 513}, ids_for(s), rng);
        });
}

// The routing weight on the experts' input (RouterWeightPlacement::kInput, Llama-4): the rows
// are scaled by their slots' weights (rounded), then by the pre-quant scale (rounded), as the
// reference orders them. Engine buffers poisoned and not.
TEST_F(Sm90IntEngineTest, WeightOnTheInput) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a08);
  for (const WeightFormat f : kFormats)
    for_each_weight_on_input_layer(
        [&](const MoeSpec& s, int i) {
          // llama: bf16, groups of 128, zero points; top-2: fp16, groups of 64, zero points and
          // pre-quant scales; caller ids: bf16, groups of 128, pre-quant scales.
          return int_layer(s, f, i == 1 ? DType::kFloat16 : DType::kBFloat16, i == 1 ? 64 : 128,
                           i != 2, i != 0);
        },
        [&](const MoeSpec& s, bool poison) {
          Layer l = make_layer(s, rng(), poison);
          check_tokens(l, {1, 7, 64, 513}, ids_for(s), rng);
        });
}

// The very first forward of a fresh engine captured in a CUDA graph, replayed on old and new
// inputs, equal to eager runs (support/engine_check.hpp, check_graph): the GEMV and CUTLASS
// tokens counts, zero points (the finish kernel) and pre-quant scales; the poisoning memsets
// captured too.
TEST_F(Sm90IntEngineTest, GraphCaptureOfFirstCallEqualsEager) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a09);
  for (const WeightFormat f : kFormats)
    for (const bool poison : {false, true}) {
      SCOPED_TRACE(poison ? "engine buffers poisoned" : "");
      MoeSpec q = int_layer(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f, DType::kBFloat16, 128,
                            true, true);
      MoeSpec m = int_layer(scaled_preset("mixtral-8x7b", 8, 512, 384), f, DType::kFloat16, 64,
                            false, false);
      MoeSpec e = int_layer(
          engine_spec(16, 2, 256, 128, RoutingMethod::kExternal, ActivationKind::kGeGLUTanh), f,
          DType::kBFloat16, 64, true, false);
      e.fc1_bias = true;
      for (MoeSpec* s : {&q, &m, &e}) s->max_tokens = 600;
      const std::pair<MoeSpec*, int64_t> cases[] = {{&q, 1}, {&q, 64},  {&q, 600},
                                                    {&m, 7}, {&m, 600}, {&e, 300}};
      for (const auto& [s, T] : cases) {
        Layer l = make_layer(*s, rng(), poison);
        check_graph(l, T, rng);
      }
    }
}

// Bad caller ids (out of range, negative, repeated) dropped and the first one reported; views
// of the wrong dtype, shape, device or alignment refused with kInvalidArgument.
TEST_F(Sm90IntEngineTest, BadCallerIdsAndBadViews) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a0a);
  for (const WeightFormat f : kFormats) {
    const MoeSpec s =
        int_layer(engine_spec(8, 2, 256, 128, RoutingMethod::kExternal, ActivationKind::kSwiGLU), f,
                  DType::kBFloat16, 64, true, true);
    check_bad_calls(s, int_factory(true), rng);
    expect_unknown_tactic_refused(s, int_factory(true, "sm90.int4.no_such_tactic"),
                                  "no_such_tactic");
  }
}

// Host-side refusals: no GPU needed (checked before any CUDA call). Each is kUnsupported and
// its message names the value.
TEST(Sm90IntEngineLimits, RefusesWhatItDoesNotRun) {
  const auto base = [](WeightFormat f) {
    return int_layer(
        engine_spec(8, 2, 256, 256, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU), f);
  };
  std::vector<Refused> cases;
  for (const WeightFormat f : kFormats) {
    MoeSpec fp32 = base(f);
    fp32.act_dtype = DType::kFloat32;
    cases.push_back({fp32, to_string(DType::kFloat32)});
  }
  for (const WeightFormat other : {WeightFormat::kBF16, WeightFormat::kFP8Block128,
                                   WeightFormat::kMXFP4, WeightFormat::kNVFP4}) {
    MoeSpec s = base(WeightFormat::kInt4Group);
    s.weights = WeightQuant{};
    s.weights.format = other;
    cases.push_back({s, to_string(other)});
  }
  add_limit_refusals(cases, base(WeightFormat::kInt4Group));
  expect_refused(
      cases, [](const MoeSpec& s, const MoeWeights& w) { return make_sm90_int_engine(s, w, 0); });
}

// The small cases compute-sanitizer runs (memcheck, racecheck, initcheck): both formats with
// zero points and pre-quant scales, the GEMV (3 tokens), the tensor cores with the finish kernel
// (64 and 512 tokens), a bad caller id, the weight on the input.
class Sm90IntEngineSanitizer : public GpuTest {};

TEST_F(Sm90IntEngineSanitizer, SmallCase) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1a0b);
  for (const WeightFormat f : kFormats) {
    MoeSpec s =
        int_layer(engine_spec(8, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU),
                  f, DType::kBFloat16, 64, true, true);
    s.fc1_bias = s.fc2_bias = true;
    s.max_tokens = 512;
    check_sanitizer_small_case(s, int_factory(true), rng);
  }
}

}  // namespace
}  // namespace moekit::pipeline
