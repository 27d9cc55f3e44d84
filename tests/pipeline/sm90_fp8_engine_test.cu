// The sm90 FP8 engine (pipeline/sm90_fp8_engine.hpp: bf16 activations, kFP8Block128 or
// kFP8PerTensor weights) against reference::forward on fresh random inputs, outputs poisoned
// (0xFF bytes, NaN) before every run, the engine's own buffers poisoned too
// (Sm90Fp8Options::poison) unless a case says otherwise. Two references:
//  - the layer as stored: reference::forward quantizes the activations to e4m3 as the engine
//    does (quant::prepare_activations: per token per 128 columns, or the static input scale),
//    so ||out - ref|| / ||ref|| < 1e-2 (the sums run in another order);
//  - bf16 activations with the weights dequantized to fp32 (the layer without its activations'
//    FP8 rounding): < 6e-2 over all the outputs of a test (one forward < 0.15: see
//    kBf16ActivationsPooled), the figure printed and recorded as a property
//    (bf16_activation_rel_error_<format>). kFP8PerTensor layers get static input scales that
//    cover their activations (set_static_input_scales).
// Cases: the presets' routing (the real DeepSeek-V3 grouped routing with its correction bias and
// 2.5 scaling, Mixtral's softmax-topk) at scaled-down shapes for 1..4096 tokens, and
// DeepSeek-V3's real H and I for a few tokens; every routing method x activation; all tokens to
// the same experts (the others empty); codes at the e4m3 limits (+-448, subnormals) in the
// weights and the activations; all-zero hidden rows; TP and EP ranks; the routing weight on the
// experts' input (Llama-4); every named tactic forced; CUDA graph capture of the first call
// equal to eager; bad caller ids and bad views; the specs the engine refuses.
// Sm90Fp8EngineSanitizer holds the small case for compute-sanitizer; under sanitizer_run() the
// largest token counts and the real shape are left out. The layers, inputs and checks are shared
// with the BF16 engine's test: support/engine_check.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moekit/registry.hpp"
#include "pipeline/sm90_fp8_engine.hpp"
#include "quant/quant.hpp"
#include "support/engine_check.hpp"
#include "support/large_batch.cuh"
#include "support/gpu.hpp"

namespace moekit::pipeline {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

constexpr WeightFormat kFormats[] = {WeightFormat::kFP8Block128, WeightFormat::kFP8PerTensor};

// `s` with bf16 activations and FP8 weights of `format`.
MoeSpec fp8(MoeSpec s, WeightFormat format) {
  s.act_dtype = DType::kBFloat16;
  s.weights = WeightQuant{};
  s.weights.format = format;
  return s;
}

// 8 experts, top-2, H 256, I 128, SwiGLU: the small layer of the error and sanitizer cases.
MoeSpec small_fp8(RoutingMethod m, WeightFormat format, int64_t max_tokens) {
  MoeSpec s = fp8(engine_spec(8, 2, 256, 128, m, ActivationKind::kSwiGLU), format);
  s.max_tokens = max_tokens;
  return s;
}

EngineFactory fp8_factory(bool poison) {
  return [poison](const MoeSpec& s, const MoeWeights& w) {
    Sm90Fp8Options options;
    options.poison = poison;
    return make_sm90_fp8_engine(s, w, 0, options);
  };
}

// kFP8PerTensor static input scales that cover the activations, as a checkpoint's calibrated
// amax / 448 would, one per expert and matrix (different ones, so that an expert's rows taking
// another's scale shows): FC1's input (normal hidden) 4 or 5, FC2's (the activation's output;
// gpt-oss's clamped SwiGLU reaches 56) 48 to 80. make_random_weights' 4/448 on FC2's input
// saturates the largest outputs of the activation: ~10% off the bf16 activations.
void set_static_input_scales(MoeWeights& w) {
  if (w.fc1.format != WeightFormat::kFP8PerTensor) return;
  for (std::size_t e = 0; e < w.fc1.input_scale.size(); ++e) {
    w.fc1.input_scale[e] = (4.0f + static_cast<float>(e % 2)) / 448.0f;
    w.fc2.input_scale[e] = (48.0f + 16.0f * static_cast<float>(e % 3)) / 448.0f;
  }
}

// `spec` may be sharded: weights are drawn for the unsharded layer, then cut.
Layer make_layer(const MoeSpec& spec, uint64_t seed, bool poison = true) {
  return make_engine_layer(spec, seed, fp8_factory(poison), set_static_input_scales);
}

// The layer's weights dequantized to fp32 (bit-exactly, quant::dequantize_expert) under a copy
// of its spec: reference::forward on it keeps the activations in bf16.
struct DequantizedLayer {
  MoeSpec spec;
  MoeWeights weights;
};

QuantizedTensor dequantized(const QuantizedTensor& t) {
  QuantizedTensor d;
  d.format = WeightFormat::kFP32;
  d.experts = t.experts;
  d.rows = t.rows;
  d.cols = t.cols;
  const std::size_t per_expert = static_cast<std::size_t>(t.rows * t.cols);
  d.values.resize(per_expert * static_cast<std::size_t>(t.experts) * sizeof(float));
  std::vector<float> expert(per_expert);
  for (int64_t e = 0; e < t.experts; ++e) {
    quant::dequantize_expert(t, e, expert.data());
    std::memcpy(d.values.data() + e * per_expert * sizeof(float), expert.data(),
                per_expert * sizeof(float));
  }
  return d;
}

DequantizedLayer dequantize_layer(const Layer& l) {
  DequantizedLayer d;
  d.spec = l.spec;
  d.spec.weights = WeightQuant{};
  d.spec.weights.format = WeightFormat::kFP32;
  d.weights = l.local;
  d.weights.fc1 = dequantized(l.local.fc1);
  d.weights.fc2 = dequantized(l.local.fc2);
  return d;
}

// Against bf16 activations the error is the activations' FP8 rounding: ~4.5% of the output's
// norm over many tokens, but one token's 256 or 512 outputs scatter around that (past 6% at one
// token in 30 draws of the two references alone). So each forward is held to a loose bound and
// the test's outputs pooled, ||out - ref|| / ||ref|| over all of them, to 6e-2.
constexpr double kBf16ActivationsPerForward = 0.15, kBf16ActivationsPooled = 6e-2;

class Sm90Fp8EngineTest : public GpuTest {
 protected:
  // One forward of `in` against both references (the second one only with `dq`). Returns the
  // output.
  std::vector<uint16_t> check_inputs(Layer& l, const DequantizedLayer* dq, const Inputs& in) {
    const std::vector<float> ref = reference_out(l, in);
    const std::vector<uint16_t> out = run_forward(l, in);
    expect_close(l.spec, out, ref, tolerance(l.spec));
    if (dq != nullptr) {
      SCOPED_TRACE("against bf16 activations and the dequantized weights");
      const std::vector<float> bf16_ref = reference_out(dq->spec, dq->weights, in);
      active_error_pool() = nullptr;  // pooled apart, below
      const double rel = expect_close(l.spec, out, bf16_ref, kBf16ActivationsPerForward);
      active_error_pool() = &exact_;
      double norm = 0;
      for (const float v : bf16_ref) norm += double(v) * v;
      Pooled& p = pooled_[l.spec.weights.format == WeightFormat::kFP8Block128 ? 0 : 1];
      p.squared_error += rel * rel * norm;
      p.squared_norm += norm;
      p.worst_forward = std::max(p.worst_forward, rel);
    }
    return out;
  }

  // Each token count on fresh inputs, against both references.
  void check_tokens(Layer& l, const std::vector<int64_t>& tokens, Ids mode, std::mt19937_64& rng) {
    const DequantizedLayer dq = dequantize_layer(l);
    for (const int64_t T : tokens) {
      if (T > kSanitizerMaxTokens && sanitizer_run()) continue;
      SCOPED_TRACE(describe(l.spec) + " T" + std::to_string(T) + " ids " +
                   std::to_string(static_cast<int>(mode)));
      check_inputs(l, &dq, make_inputs(l, T, mode, rng));
    }
  }

  void SetUp() override {
    GpuTest::SetUp();
    active_error_pool() = &exact_;
  }

  // The pooled relative errors of this test: against the exact reference (every forward, both
  // formats; engine_check.hpp: kFp8Pooled), and against bf16 activations per format. Checked,
  // printed and recorded (exact_rel_error, bf16_activation_rel_error_<format>).
  void TearDown() override {
    active_error_pool() = nullptr;
    if (exact_.squared_norm > 0) {
      EXPECT_LT(exact_.rel(), kFp8Pooled) << "all outputs against the exact reference";
      std::printf(
          "[ moekit ] %s: ||out - ref|| / ||ref|| against the exact reference %.2e over "
          "all forwards, %.2e at worst in one\n",
          ::testing::UnitTest::GetInstance()->current_test_info()->name(), exact_.rel(),
          exact_.worst_forward);
      RecordProperty("exact_rel_error", std::to_string(exact_.rel()));
    }
    const char* names[] = {"fp8_block128", "fp8"};
    for (int f = 0; f < 2; ++f) {
      const Pooled& p = pooled_[f];
      if (p.squared_norm == 0) continue;
      const double rel = std::sqrt(p.squared_error / p.squared_norm);
      EXPECT_LT(rel, kBf16ActivationsPooled)
          << names[f] << ": all outputs against bf16 activations";
      std::printf(
          "[ moekit ] %s, %s weights: ||out - ref|| / ||ref|| against bf16 activations "
          "and the dequantized weights %.4f over all forwards, %.4f at worst in one\n",
          ::testing::UnitTest::GetInstance()->current_test_info()->name(), names[f], rel,
          p.worst_forward);
      RecordProperty(std::string("bf16_activation_rel_error_") + names[f], std::to_string(rel));
    }
  }

  struct Pooled {
    double squared_error = 0, squared_norm = 0, worst_forward = 0;
  };
  Pooled pooled_[2];  // [kFP8Block128, kFP8PerTensor]
  ErrorPool exact_;
};

TEST_F(Sm90Fp8EngineTest, PresetRoutingAcrossTokenCounts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf801);
  for (const WeightFormat f : kFormats) {
    const MoeSpec specs[] = {
        fp8(scaled_preset("deepseek-v3", 64, 512, 256), f),  // grouped, bias, scaling 2.5
        fp8(scaled_preset("mixtral-8x7b", 8, 512, 384), f),  // softmax then top-k
        fp8(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f),
        fp8(scaled_preset("gpt-oss-120b", 32, 384, 256), f),  // both biases, clamped SwiGLU
    };
    for (const MoeSpec& s : specs) {
      Layer l = make_layer(s, rng());
      EXPECT_GT(l.engine->workspace_bytes(), 0u);
      check_tokens(l, {1, 7, 64, 513, 4096}, Ids::kRouted, rng);
    }
  }
}

// Every named tactic of both GEMMs (what a tuning file may choose), forced at a decode and a
// prefill token count, against the exact reference.
TEST_F(Sm90Fp8EngineTest, EveryTacticMatchesTheReference) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf8e7);
  for (const WeightFormat f : kFormats) {
    Layer l = make_layer(fp8(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f), rng());
    for (const Gemm g : {Gemm::kFc1, Gemm::kFc2})
      for (const std::string& tactic : l.engine->tactics(g))
        for (const int64_t T : {int64_t{7}, int64_t{513}}) {
          if (T > kSanitizerMaxTokens && sanitizer_run()) continue;
          SCOPED_TRACE(describe(l.spec) + " " + to_string(g) + " " + tactic + " T" +
                       std::to_string(T));
          l.engine->set_tactics(TacticChoices{{TacticChoice{g, T, tactic}}});
          check_inputs(l, nullptr, make_inputs(l, T, Ids::kRouted, rng));
        }
    l.engine->set_tactics(TacticChoices{});
  }
}

// Per-tensor weights without static input scales: the activations quantized per token
// (WeightQuant::dynamic_activations), the gated, interleaved and plain activations, both biases.
TEST_F(Sm90Fp8EngineTest, DynamicPerTokenActivations) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf80d);
  MoeSpec specs[] = {
      fp8(scaled_preset("qwen3-30b-a3b", 32, 256, 256), WeightFormat::kFP8PerTensor),
      fp8(scaled_preset("gpt-oss-120b", 32, 384, 256), WeightFormat::kFP8PerTensor),
      fp8(engine_spec(16, 2, 256, 128, RoutingMethod::kSoftmaxTopK, ActivationKind::kReLU2),
          WeightFormat::kFP8PerTensor),
  };
  for (MoeSpec& s : specs) {
    s.weights.dynamic_activations = true;
    Layer l = make_layer(s, rng());
    ASSERT_TRUE(l.local.fc1.input_scale.empty());
    check_tokens(l, {1, 7, 64, 513}, Ids::kRouted, rng);
  }
}

// DeepSeek-V3's own hidden and intermediate (7168, 2048; 32 of its 256 experts so that the
// weights stay small) with its routing, a few tokens. Against the stored layer only: the
// dequantized weights would take 5.6 GB of host memory.
TEST_F(Sm90Fp8EngineTest, DeepSeekV3ShapeFewTokens) {
  if (sanitizer_run()) GTEST_SKIP() << "the same kernels run at the other tests' sizes";
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf802);
  MoeSpec s = find_preset("deepseek-v3").spec;
  s.num_experts = 32;
  s.max_tokens = 16;
  s.tp_size = s.ep_size = 1;
  s.tp_rank = s.ep_rank = 0;
  ASSERT_EQ(s.hidden, 7168);
  ASSERT_EQ(s.intermediate, 2048);
  for (const WeightFormat f : kFormats) {
    Layer l = make_layer(fp8(s, f), rng());
    for (const int64_t T : {1, 5, 16}) {
      SCOPED_TRACE(describe(l.spec) + " T" + std::to_string(T));
      check_inputs(l, nullptr, make_inputs(l, T, Ids::kRouted, rng));
    }
  }
}

TEST_F(Sm90Fp8EngineTest, EveryRoutingMethodTimesActivation) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf803);
  for_every_routing_method_times_activation(
      [](const MoeSpec& s, int n) { return fp8(s, kFormats[n % 2]); },
      [&](const MoeSpec& s) {
        Layer l = make_layer(s, rng());
        check_tokens(l, {1, 7, 64, 513}, ids_for(s), rng);
      });
}

// Every token to the same k experts; the other experts receive nothing.
TEST_F(Sm90Fp8EngineTest, AllTokensToTheSameExperts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf804);
  for (const WeightFormat f : kFormats)
    for (const int64_t k : {1, 4}) {
      MoeSpec s =
          fp8(engine_spec(32, k, 256, 256, RoutingMethod::kExternal, ActivationKind::kSwiGLU), f);
      s.fc1_bias = s.fc2_bias = true;
      Layer l = make_layer(s, rng());
      check_tokens(l, {1, 8, 64, 4096}, Ids::kSameForAll, rng);
    }
}

// fp32 weights [experts, rows, cols] whose FP8 codes reach the format's limits: in every
// 128 x 128 block one entry of magnitude 1 (its code +-448: it sets the block's, or for
// kFP8PerTensor the expert's, scale) and the others 2^-8..2^-20 of it (small normal codes,
// subnormal codes down to 2^-9 and codes that flush to 0).
std::vector<float> limit_weights(int64_t experts, int64_t rows, int64_t cols,
                                 std::mt19937_64& rng) {
  std::uniform_real_distribution<float> exponent(-20.0f, -8.0f);
  std::vector<float> w(static_cast<std::size_t>(experts * rows * cols));
  for (float& x : w) x = std::ldexp(1.0f, static_cast<int>(exponent(rng))) * (rng() % 2 ? 1 : -1);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r0 = 0; r0 < rows; r0 += 128)
      for (int64_t c0 = 0; c0 < cols; c0 += 128) {
        const int64_t r = r0 + static_cast<int64_t>(rng() % std::min<uint64_t>(rows - r0, 128));
        const int64_t c = c0 + static_cast<int64_t>(rng() % std::min<uint64_t>(cols - c0, 128));
        w[(e * rows + r) * cols + c] = rng() % 2 ? 1.0f : -1.0f;
      }
  return w;
}

// Hidden rows whose e4m3 codes reach the limits: per group of 128 columns one entry whose code
// is +-448 (kFP8Block128: the group's amax, 8; kFP8PerTensor: 4 to 2048, at or past the static
// scale's 448, saturating) and the others 4 * 2^-8..2^-20 (small normal codes, subnormals,
// zeros). hidden is a multiple of 128.
void set_limit_hidden(const MoeSpec& s, Inputs& in, std::mt19937_64& rng) {
  const bool per_tensor = s.weights.format == WeightFormat::kFP8PerTensor;
  std::uniform_real_distribution<float> exponent(-20.0f, -8.0f);
  for (int64_t t = 0; t < in.tokens; ++t)
    for (int64_t c0 = 0; c0 < s.hidden; c0 += 128) {
      const float big = per_tensor ? std::ldexp(4.0f, static_cast<int>(rng() % 10)) : 8.0f;
      for (int64_t c = c0; c < c0 + 128; ++c)
        in.set_hidden(s, t, c,
                      std::ldexp(4.0f, static_cast<int>(exponent(rng))) * (rng() % 2 ? 1 : -1));
      in.set_hidden(s, t, c0 + static_cast<int64_t>(rng() % 128), rng() % 2 ? big : -big);
    }
}

TEST_F(Sm90Fp8EngineTest, CodesAtTheE4m3Limits) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf805);
  for (const WeightFormat f : kFormats)
    for (const RoutingMethod m : {RoutingMethod::kTopKSoftmax, RoutingMethod::kExternal}) {
      MoeSpec s = fp8(engine_spec(16, 4, 256, 256, m, ActivationKind::kSwiGLU), f);
      s.fc2_bias = m == RoutingMethod::kExternal;
      Layer l = make_layer(s, rng());  // its biases and routing bias; the weights replaced:
      const int64_t E = s.num_experts, H = s.hidden, R = s.fc1_rows();
      const std::vector<float> w1 = limit_weights(E, R, H, rng);
      const std::vector<float> w2 = limit_weights(E, H, s.intermediate, rng);
      l.local.fc1 = quant::quantize(s.weights, E, R, H, w1.data());
      l.local.fc2 = quant::quantize(s.weights, E, H, s.intermediate, w2.data());
      l.engine = fp8_factory(true)(s, l.local);
      for (const int64_t T : {7, 64, 513}) {
        SCOPED_TRACE(describe(s) + " T" + std::to_string(T));
        // Random activations on the limit weights, then limit activations.
        Inputs in = make_inputs(l, T, ids_for(s), rng);
        check_inputs(l, nullptr, in);
        set_limit_hidden(s, in, rng);
        check_inputs(l, nullptr, in);
      }
    }
}

// All-zero hidden rows (the first, one inside, the last): with no bias exact zeros, with FC2's
// bias only that bias (times the routing weights), with FC1's too what the reference makes of
// it; never NaN (kFP8Block128's eps keeps the all-zero groups' scale finite). Each such token is
// also compared alone, so that its exact zeros are checked.
TEST_F(Sm90Fp8EngineTest, AllZeroHiddenRows) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf806);
  for (const WeightFormat f : kFormats)
    for (const int biases : {0, 1, 2}) {  // none, FC2's, both
      MoeSpec s = fp8(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f);
      s.fc2_bias = biases >= 1;
      s.fc1_bias = biases == 2;
      Layer l = make_layer(s, rng());
      const DequantizedLayer dq = dequantize_layer(l);
      for (const int64_t T : {1, 7, 513}) {
        SCOPED_TRACE(describe(s) + " T" + std::to_string(T));
        Inputs in = make_inputs(l, T, Ids::kRouted, rng);
        const std::vector<int64_t> zero_rows = {0, T / 2, T - 1};
        for (const int64_t t : zero_rows)
          for (int64_t h = 0; h < s.hidden; ++h) in.set_hidden(s, t, h, 0.0f);
        const std::vector<float> ref = reference_out(l, in);
        const std::vector<uint16_t> out = check_inputs(l, &dq, in);
        const int64_t H = s.hidden;
        for (const int64_t t : zero_rows) {
          SCOPED_TRACE("zero row " + std::to_string(t));
          expect_close(s, std::vector<uint16_t>(out.begin() + t * H, out.begin() + (t + 1) * H),
                       std::vector<float>(ref.begin() + t * H, ref.begin() + (t + 1) * H),
                       tolerance(s));
        }
      }
    }
}

TEST_F(Sm90Fp8EngineTest, TensorParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf807);
  for (const WeightFormat f : kFormats) {
    // Local intermediate 256: whole 128-row blocks on each rank. Biases: only rank 0 adds FC2's.
    MoeSpec s = fp8(scaled_preset("gpt-oss-120b", 16, 256, 512), f);
    s.tp_size = 2;
    const uint64_t seed = rng();
    for (const int64_t T : {1, 7, 513})
      check_tensor_parallel_ranks(s, seed, T, rng, fp8_factory(true), set_static_input_scales);
  }
}

// EP ranks: tokens whose experts all live on other ranks get exact zeros.
TEST_F(Sm90Fp8EngineTest, ExpertParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf808);
  for (const WeightFormat f : kFormats)
    for_each_expert_parallel_rank([&](const MoeSpec& s) { return fp8(s, f); }, rng,
                                  [&](const MoeSpec& s, uint64_t seed) {
                                    Layer l = make_layer(s, seed);
                                    check_tokens(l, {1, 64, 513}, ids_for(s), rng);
                                  });
}

// The routing weight on the experts' input (RouterWeightPlacement::kInput, Llama-4): the rows
// are scaled by their slots' weights (rounded to bf16) before they are quantized. The preset's
// top-1 sigmoid routing; top-2 top-k softmax with both biases; caller ids on an EP rank.
// Engine buffers poisoned and not.
TEST_F(Sm90Fp8EngineTest, WeightOnTheInput) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf809);
  for (const WeightFormat f : kFormats)
    for_each_weight_on_input_layer([&](const MoeSpec& s, int) { return fp8(s, f); },
                                   [&](const MoeSpec& s, bool poison) {
                                     Layer l = make_layer(s, rng(), poison);
                                     check_tokens(l, {1, 7, 64, 513}, ids_for(s), rng);
                                   });
}

// The very first forward of a fresh engine captured in a CUDA graph, replayed on old and new
// inputs, equal to eager runs (support/engine_check.hpp, check_graph); the engine's poisoning
// memsets captured too.
TEST_F(Sm90Fp8EngineTest, GraphCaptureOfFirstCallEqualsEager) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf80a);
  for (const WeightFormat f : kFormats)
    for (const bool poison : {false, true}) {
      SCOPED_TRACE(poison ? "engine buffers poisoned" : "");
      MoeSpec q = fp8(scaled_preset("qwen3-30b-a3b", 32, 256, 256), f);
      MoeSpec d = fp8(scaled_preset("deepseek-v3", 64, 512, 256), f);
      MoeSpec e = fp8(
          engine_spec(16, 2, 256, 128, RoutingMethod::kExternal, ActivationKind::kGeGLUTanh), f);
      MoeSpec l4 = fp8(scaled_preset("llama4-maverick", 16, 512, 512), f);
      const std::pair<MoeSpec*, int64_t> cases[] = {{&q, 1},   {&q, 64}, {&q, 600}, {&d, 5},
                                                    {&e, 300}, {&l4, 1}, {&l4, 600}};
      for (MoeSpec* s : {&q, &d, &e, &l4}) s->max_tokens = 600;
      for (const auto& [s, T] : cases) {
        Layer l = make_layer(*s, rng(), poison);
        check_graph(l, T, rng);
      }
    }
}

// Bad caller ids (out of range, negative, repeated) dropped and the first one reported; views
// of the wrong dtype, shape, device or alignment refused with kInvalidArgument.
TEST_F(Sm90Fp8EngineTest, BadCallerIdsAndBadViews) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf80b);
  for (const WeightFormat f : kFormats)
    check_bad_calls(small_fp8(RoutingMethod::kExternal, f, 1000), fp8_factory(true), rng,
                    set_static_input_scales);
}

// Host-side refusals: no GPU needed (checked before any CUDA call). Each is kUnsupported and
// its message names the value.
// Tokens x hidden past 2^31 elements (support/large_batch.cuh): the quantizing gather's rows,
// FC1's per-group pointers and scales, FC2's output rows and the finalize past 2^31.
TEST_F(Sm90Fp8EngineTest, TokensTimesHiddenPast2To31Elements) {
  // I = 1024, not the BF16 test's 256: the check pools only ~48 sampled tokens, and at I = 256
  // their e4m3 rounding noise alone reaches the 1e-2 bound (1.03e-2 seen on an H100, b442104);
  // it falls as 1 / sqrt(I), 5e-3 at the presets' I.
  MoeSpec s =
      engine_spec(8, 1, kLargeBatchHidden, 1024, RoutingMethod::kExternal, ActivationKind::kSwiGLU);
  s.weights = WeightQuant{};
  s.weights.format = WeightFormat::kFP8Block128;
  check_tokens_times_hidden_past_2_to_31(s, {"fp8_block128"},
                                         [](const MoeSpec& spec, const MoeWeights& w, int) {
                                           return make_sm90_fp8_engine(spec, w, 0);
                                         });
}

TEST(Sm90Fp8EngineLimits, RefusesWhatItDoesNotRun) {
  const auto base = [](WeightFormat f) {
    MoeSpec s = engine_spec(8, 2, 256, 256, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU);
    return fp8(s, f);
  };
  std::vector<Refused> cases;
  for (const WeightFormat f : kFormats) {
    MoeSpec h = base(f);
    h.hidden = 1000;  // a valid spec for both formats (kFP8Block128 stores a partial block)
    cases.push_back({h, "1000"});
    MoeSpec fp16 = base(f);
    fp16.act_dtype = DType::kFloat16;
    cases.push_back({fp16, to_string(DType::kFloat16)});
    MoeSpec fp32 = base(f);
    fp32.act_dtype = DType::kFloat32;
    cases.push_back({fp32, to_string(DType::kFloat32)});
  }
  MoeSpec i = base(WeightFormat::kFP8PerTensor);
  i.intermediate = 200;  // valid for per-tensor weights (no 128-row blocks)
  cases.push_back({i, "200"});
  for (const WeightFormat other : {WeightFormat::kBF16, WeightFormat::kMXFP8,
                                   WeightFormat::kInt4Group, WeightFormat::kNVFP4}) {
    cases.push_back({base(other), to_string(other)});
  }
  add_limit_refusals(cases, base(WeightFormat::kFP8Block128));
  expect_refused(
      cases, [](const MoeSpec& s, const MoeWeights& w) { return make_sm90_fp8_engine(s, w, 0); });
}

// The small cases compute-sanitizer runs (memcheck, racecheck): both formats, routed ids at 64
// and 3 tokens, a bad caller id, the weight on the input, and prefill (~128 rows per expert).
class Sm90Fp8EngineSanitizer : public GpuTest {};

TEST_F(Sm90Fp8EngineSanitizer, SmallCase) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf80d);
  for (const WeightFormat f : kFormats) {
    MoeSpec s = small_fp8(RoutingMethod::kTopKSoftmax, f, 512);
    s.fc1_bias = s.fc2_bias = true;
    check_sanitizer_small_case(s, fp8_factory(true), rng, set_static_input_scales);
  }
}

}  // namespace
}  // namespace moekit::pipeline
