// The sm90 engine against reference::forward on fresh random inputs, outputs poisoned (0xFF
// bytes, NaN) before every run: the real presets' routing and activation at scaled-down shapes
// for tokens 1, 7, 64, 513 and 4096; every routing method x activation; skewed routing (every
// token to the same experts, the others empty); TP and EP ranks (tokens a rank does not own get
// exact zeros); CUDA graph capture of the very first call, replayed on new inputs, equal to
// eager; bad caller ids reported and dropped; a batch of tokens x hidden past 2^31 elements;
// the routing weight on the experts' input (Llama-4); NaN / Inf in one token's inputs staying in
// that token. Relative error ||out - ref|| / ||ref|| < 1e-2 for bf16 (the reference rounds where
// the kernels round, but sums in another order). Sm90EngineSanitizer holds one small case for
// compute-sanitizer (scripts/device.sh runs every GPU test under it, sanitizer_run() set).
// The layers, inputs and checks are shared with the FP8 engine's test: support/engine_check.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "pipeline/sm90_engine.hpp"
#include "quant/quant.hpp"
#include "reference/reference.hpp"
#include "routing/routing.hpp"
#include "support/engine_check.hpp"
#include "support/large_batch.cuh"
#include "support/gpu.hpp"

namespace moekit::pipeline {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

// `spec` may be sharded: weights are drawn for the unsharded layer, then cut.
Layer make_layer(const MoeSpec& spec, uint64_t seed, const Sm90Options& options = {}) {
  return make_engine_layer(spec, seed, [&](const MoeSpec& s, const MoeWeights& w) {
    return make_sm90_engine(s, w, 0, options);
  });
}

class Sm90EngineTest : public GpuTest {};

TEST_F(Sm90EngineTest, PresetShapesAcrossTokenCounts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9001);
  std::vector<MoeSpec> specs = {
      scaled_preset("qwen3-30b-a3b", 32, 512, 256),
      scaled_preset("mixtral-8x7b", 8, 1024, 512),
      scaled_preset("deepseek-v3", 64, 512, 128),
      scaled_preset("gpt-oss-120b", 32, 576, 288),
      scaled_preset("llama4-maverick", 16, 512, 512),
      scaled_preset("qwen3-30b-a3b", 32, 512, 256, DType::kFloat16),
      scaled_preset("gpt-oss-120b", 32, 576, 288, DType::kFloat16),
  };
  for (const MoeSpec& s : specs) {
    Layer l = make_layer(s, rng());
    EXPECT_GT(l.engine->workspace_bytes(), 0u);
    for (int64_t T : {1, 7, 64, 513, 4096})
      if (T <= kSanitizerMaxTokens || !sanitizer_run()) check_forward(l, T, Ids::kRouted, rng);
  }
}

// Decode where the permute's rows exceed its fused gather (a gather kernel follows it): FC1's
// GEMV then reads the offsets before its PDL wait. 4 KB rows, up to one row per expert. From 2 to
// 8 tokens the chained FC1 reads the tokens' own rows instead (Sm90Options::token_rows), and
// nothing is gathered: both ways.
TEST_F(Sm90EngineTest, DecodeGemvAfterTheGatherKernel) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9004);
  for (const bool token_rows : {true, false})
    for (const char* name : {"qwen3-30b-a3b", "gpt-oss-120b"}) {
      SCOPED_TRACE(token_rows ? "token rows" : "gathered rows");
      MoeSpec s = scaled_preset(name, 64, 2048, 256);
      s.max_tokens = 64;
      Sm90Options options;
      options.token_rows = token_rows;
      Layer l = make_layer(s, rng(), options);
      for (int64_t T : {1, 2, 5, 8, 16}) check_forward(l, T, Ids::kRouted, rng);
    }
}

// The forward has no atomics in its sums, so back-to-back forwards on the same inputs (as graph
// replays run them) give the same bits. A race shows as a difference: named by forward, token
// and column range (one token's columns all differing points at FC1's input or output, a few
// columns at FC2's; 16 columns of one expert's tokens, one warp's rows of a TMA GEMV stage:
// the 2026-11-30 missing proxy fence). Decode shapes of DecodeGemvAfterTheGatherKernel, chained
// and not; then with the engine's buffers poisoned before each forward, where a read of an
// element the forward has not written yet shows as NaN.
void expect_back_to_back_equal(const char* preset, const Sm90Options& options,
                               std::mt19937_64& rng) {
  const int kRuns = sanitizer_run() ? 4 : 64;  // the tools check each run's accesses, not its luck
  MoeSpec s = scaled_preset(preset, 64, 2048, 256);
  s.max_tokens = 64;
  Layer l = make_layer(s, rng(), options);
  // T=1 after another T, so that it too follows a forward on other inputs.
  for (int64_t T : {5, 1, 8, 16}) {
    SCOPED_TRACE(describe(s) + " T" + std::to_string(T) +
                 (options.chain_decode ? " chained" : " two launches") +
                 (options.poison_gathered_rows ? " poisoned rows" : "") +
                 (options.poison_activations ? " poisoned activations" : "") +
                 (options.poison_slots ? " poisoned slots" : ""));
    const Inputs in = make_inputs(l, T, Ids::kRouted, rng);
    DeviceRun run(l, in, nullptr);
    const std::size_t elems = static_cast<std::size_t>(T * s.hidden);
    DeviceBuffer outs(elems * 2 * kRuns);
    outs.poison();
    for (int r = 0; r < kRuns; ++r) {
      run.args.output =
          cuda_view(static_cast<char*>(outs.ptr) + elems * 2 * r, s.act_dtype, {T, s.hidden});
      l.engine->forward(run.args);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> all = to_host<uint16_t>(outs.ptr, elems * kRuns);
    expect_close(s, std::vector<uint16_t>(all.begin(), all.begin() + elems), reference_out(l, in),
                 tolerance(s.act_dtype));
    int differing = 0;
    std::string first;
    for (int r = 1; r < kRuns; ++r) {
      const uint16_t* a = all.data();
      const uint16_t* b = all.data() + elems * r;
      int64_t differ = 0;
      std::string where;
      for (int64_t t = 0; t < T; ++t) {
        int64_t n = 0, lo = -1, hi = -1;
        for (int64_t h = 0; h < s.hidden; ++h)
          if (a[t * s.hidden + h] != b[t * s.hidden + h]) {
            ++n;
            hi = h;
            if (lo < 0) lo = h;
          }
        differ += n;
        if (n > 0)
          where += " token " + std::to_string(t) + ": " + std::to_string(n) + " in columns " +
                   std::to_string(lo) + ".." + std::to_string(hi) + ";";
      }
      if (differ > 0 && differing++ == 0)
        first = "forward " + std::to_string(r) + " differs from forward 0:" + where;
    }
    EXPECT_EQ(differing, 0) << "of " << kRuns - 1 << " forwards differ from forward 0; " << first;
    // NaN anywhere: an element read before this forward wrote it (with the poison hooks).
    int with_nan = 0;
    std::string nan_first;
    for (int r = 0; r < kRuns; ++r) {
      std::string tokens;
      for (int64_t t = 0; t < T; ++t) {
        int64_t n = 0;
        for (int64_t h = 0; h < s.hidden; ++h)
          n += std::isnan(from_bits(s.act_dtype, all[elems * r + t * s.hidden + h]));
        if (n > 0) tokens += " token " + std::to_string(t) + ": " + std::to_string(n) + ";";
      }
      if (!tokens.empty() && with_nan++ == 0)
        nan_first = "forward " + std::to_string(r) + " has NaN:" + tokens;
    }
    EXPECT_EQ(with_nan, 0) << "of " << kRuns << " forwards have NaN outputs; " << nan_first;
  }
}

TEST_F(Sm90EngineTest, BackToBackDecodeForwardsAreBitwiseEqual) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9005);
  for (const int mode : {0, 1, 2})         // chained, two launches, chained with FC2 in 3 k slices
    for (const int poison : {0, 1, 2, 3})  // none, gathered rows, activations, slots
      for (const char* name : {"qwen3-30b-a3b", "gpt-oss-120b", "llama4-maverick"}) {
        // Under the sanitizers the kernels are the same whatever the test poisons beforehand.
        if (devtest::sanitizer_run() && poison != 0) continue;
        SCOPED_TRACE(mode == 2 ? "FC2 in 3 k slices" : "");
        Sm90Options options;
        options.chain_decode = mode != 1;
        options.fc2_k_slices = mode == 2 ? 3 : 1;
        options.poison_gathered_rows = poison == 1;
        options.poison_activations = poison == 2;
        options.poison_slots = poison == 3;
        expect_back_to_back_equal(name, options, rng);
      }
}

// One token with FC1 and FC2 sliced along the intermediate (Sm90Options::slice_one_token) and
// without: H 264 and I 104 (the last FC2 box and the last slice partial), biases and the clamped
// SwiGLU, caller ids; and three presets' shapes (mixtral's: two of eight experts, fp16).
TEST_F(Sm90EngineTest, OneTokenSlicedOrNot) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x900a);
  MoeSpec odd =
      engine_spec(16, 4, 264, 104, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLUClamped);
  odd.fc1_bias = odd.fc2_bias = true;
  MoeSpec external = odd;
  external.routing.method = RoutingMethod::kExternal;
  const MoeSpec specs[] = {odd, external, scaled_preset("gpt-oss-120b", 32, 576, 288),
                           scaled_preset("deepseek-v3", 64, 512, 128),
                           scaled_preset("mixtral-8x7b", 8, 512, 1024, DType::kFloat16)};
  for (const MoeSpec& s : specs) {
    std::size_t workspace[2] = {0, 0};  // [sliced]
    for (const bool sliced : {true, false}) {
      SCOPED_TRACE(sliced ? "sliced" : "not sliced");
      Sm90Options options;
      options.slice_one_token = sliced;
      Layer l = make_layer(s, rng(), options);
      workspace[sliced] = l.engine->workspace_bytes();
      for (int rep = 0; rep < 3; ++rep) check_forward(l, 1, ids_for(s), rng);
    }
    // Every shape here slices (its partial sums are allocated): the sliced run is not the other.
    EXPECT_GT(workspace[1], workspace[0]);
  }
}

// Decode chained with FC2's items split along k (Sm90Options::fc2_k_slices), their fp32 sums
// added by the finalize, and not: H 264 and I 200 (4 k boxes, the last one partial: 3 slices
// take 1, 1 and 2 of them; 4 take one each), biases and the clamped SwiGLU, caller ids; and two
// presets' shapes, bf16 and fp16; and gpt-oss's with an I of 1536 (24 k boxes, 9 row tiles),
// where the engine's pick (0) slices FC2. Token counts past kMaxTokenRows run unsliced.
TEST_F(Sm90EngineTest, DecodeFc2KSlicedOrNot) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x900c);
  MoeSpec odd =
      engine_spec(16, 4, 264, 200, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLUClamped);
  odd.fc1_bias = odd.fc2_bias = true;
  odd.max_tokens = 64;
  MoeSpec external = odd;
  external.routing.method = RoutingMethod::kExternal;
  MoeSpec qwen = scaled_preset("qwen3-30b-a3b", 64, 2048, 256, DType::kFloat16);
  qwen.max_tokens = 64;
  MoeSpec oss = scaled_preset("gpt-oss-120b", 32, 576, 288);
  oss.max_tokens = 16;
  MoeSpec long_k = scaled_preset("gpt-oss-120b", 32, 576, 1536);
  long_k.max_tokens = 16;
  for (const MoeSpec* spec : {&odd, &external, &qwen, &oss, &long_k}) {
    const MoeSpec& s = *spec;
    std::size_t workspace[5] = {};
    for (const int slices : {0, 1, 2, 3, 4}) {  // 0: the engine's pick
      SCOPED_TRACE(describe(s) + ", FC2 in " + std::to_string(slices) + " k slices");
      Sm90Options options;
      options.fc2_k_slices = slices;
      options.slice_one_token = false;  // its partials would hide whether these are allocated
      Layer l = make_layer(s, rng(), options);
      workspace[slices] = l.engine->workspace_bytes();
      for (int64_t T : {1, 2, 5, 8, 16}) {
        // Under the sanitizers, one token count per decode kernel shape is enough.
        if (devtest::sanitizer_run() && (T == 2 || T == 8)) continue;
        check_forward(l, T, ids_for(s), rng);
      }
    }
    // The partials are allocated where FC2 is sliced: with the pick only on long k.
    EXPECT_GT(workspace[2], workspace[1]) << describe(s);
    if (spec == &long_k)
      EXPECT_GT(workspace[0], workspace[1]) << describe(s) << ": the pick does not slice";
    else
      EXPECT_EQ(workspace[0], workspace[1]) << describe(s) << ": the pick slices";
  }
}

// fc2_k_slices outside 0..ceil(I / 64) (0: the engine's pick) is refused when the engine is
// built, named.
TEST_F(Sm90EngineTest, Fc2KSlicesOutsideTheirRangeAreRefused) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x900d);
  const MoeSpec s =
      engine_spec(16, 4, 264, 200, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLUClamped);
  for (const int slices : {-1, 5, 1000}) {
    Sm90Options options;
    options.fc2_k_slices = slices;
    try {
      make_layer(s, rng(), options);
      ADD_FAILURE() << "fc2_k_slices " << slices << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(
          std::string(e.what()).find("fc2_k_slices " + std::to_string(slices) + " is outside 0..4"),
          std::string::npos)
          << e.what();
    }
  }
}

// Past the single-block permute, FC1 reading the tokens' rows by index (Sm90Options::
// gather_in_fc1: the permute writes each row's token instead of the row) and reading the rows the
// permute gathered, at the pair tiles' token counts; a hidden size that is no multiple of FC1's
// 64-wide k blocks (576 = 9 x 64; 520: the last block's chunks past k are zeros).
TEST_F(Sm90EngineTest, PrefillFc1GathersItsRowsOrNot) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x900b);
  MoeSpec ragged =
      engine_spec(16, 4, 520, 256, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLUClamped);
  ragged.fc1_bias = ragged.fc2_bias = true;
  for (const MoeSpec& s : {scaled_preset("gpt-oss-120b", 32, 576, 288),
                           scaled_preset("qwen3-30b-a3b", 32, 512, 256, DType::kFloat16), ragged})
    for (const bool gather : {true, false}) {
      SCOPED_TRACE(gather ? "FC1 gathers" : "the permute gathers");
      Sm90Options options;
      options.gather_in_fc1 = gather;
      Layer l = make_layer(s, rng(), options);
      for (int64_t T : {65, 513, 2048}) check_forward(l, T, ids_for(s), rng);
    }
}

TEST_F(Sm90EngineTest, EveryRoutingMethodTimesActivation) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9002);
  const RoutingMethod methods[] = {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                                   RoutingMethod::kDeepSeekV3, RoutingMethod::kLlama4,
                                   RoutingMethod::kExternal};
  int n = 0;
  for (RoutingMethod m : methods)
    for (int a = 1; a <= 9; ++a, ++n) {
      const ActivationKind act = static_cast<ActivationKind>(a);
      const int64_t k = 2;  // llama4 too: any top_k
      MoeSpec s = engine_spec(8, k, 256, 128, m, act);
      if (activation_is_gated(act) && n % 2) s.gate_up_layout = GateUpLayout::kInterleaved;
      s.fc1_bias = n % 3 == 1;
      s.fc2_bias = n % 3 == 2;
      s.max_tokens = 200;
      Layer l = make_layer(s, rng());
      for (int64_t T : {1, 7, 130}) check_forward(l, T, ids_for(s), rng);
    }
}

TEST_F(Sm90EngineTest, SkewedRouting) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9003);
  for (int64_t k : {1, 2, 4}) {
    MoeSpec s = engine_spec(k == 4 ? 32 : 8, k, 256, 128, RoutingMethod::kExternal,
                            ActivationKind::kSwiGLU);
    s.fc1_bias = s.fc2_bias = true;
    Layer l = make_layer(s, rng());
    for (int64_t T : {1, 8, 64, 4096})
      if (T <= kSanitizerMaxTokens || !sanitizer_run()) check_forward(l, T, Ids::kSameForAll, rng);
  }
}

TEST_F(Sm90EngineTest, TensorParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9004);
  MoeSpec s = scaled_preset("gpt-oss-120b", 16, 256, 256);  // biases: only rank 0 adds FC2's
  s.tp_size = 2;
  const uint64_t seed = rng();
  for (int64_t T : {1, 7, 513})
    check_tensor_parallel_ranks(s, seed, T, rng, [](const MoeSpec& rank, const MoeWeights& w) {
      return make_sm90_engine(rank, w, 0);
    });
}

TEST_F(Sm90EngineTest, ExpertParallelRanks) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9005);
  for (RoutingMethod m : {RoutingMethod::kDeepSeekV3, RoutingMethod::kExternal}) {
    MoeSpec s = engine_spec(32, 4, 256, 128, m, ActivationKind::kSwiGLU);
    if (m == RoutingMethod::kDeepSeekV3) s.routing.n_group = 8;  // 4 experts per group
    s.fc2_bias = true;
    s.ep_size = 4;
    for (int rank = 0; rank < 4; ++rank) {
      s.ep_rank = rank;
      Layer l = make_layer(s, 77);
      for (int64_t T : {1, 64, 513}) check_forward(l, T, ids_for(s), rng);
    }
  }
}

// Captures the very first forward of a fresh engine (support/engine_check.hpp).
void check_graph(const MoeSpec& s, int64_t T, std::mt19937_64& rng) {
  Layer l = make_layer(s, rng());
  devtest::check_graph(l, T, rng);
}

TEST_F(Sm90EngineTest, GraphCaptureOfFirstCallEqualsEager) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9006);
  MoeSpec s = scaled_preset("qwen3-30b-a3b", 32, 512, 256);
  s.max_tokens = 600;
  for (int64_t T : {1, 8, 64, 600}) check_graph(s, T, rng);  // single- and multi-block paths
  MoeSpec d = scaled_preset("deepseek-v3", 64, 512, 128);
  d.max_tokens = 600;
  check_graph(d, 5, rng);
  MoeSpec e = engine_spec(16, 2, 256, 128, RoutingMethod::kExternal, ActivationKind::kGeGLUTanh);
  e.max_tokens = 600;
  check_graph(e, 300, rng);
  // The routing weight on the experts' input: one kernel more between the permute and FC1.
  MoeSpec l4 = scaled_preset("llama4-maverick", 16, 512, 512);
  l4.max_tokens = 600;
  for (int64_t T : {1, 8, 600}) check_graph(l4, T, rng);
}

// Bad caller ids dropped and the first one reported (support/engine_check.hpp).
void check_bad_ids(const MoeSpec& s, int64_t T, std::mt19937_64& rng) {
  Layer l = make_layer(s, rng());
  devtest::check_bad_ids(l, T, rng);
}

TEST_F(Sm90EngineTest, BadCallerIdsAreDroppedAndReported) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9007);
  MoeSpec s = engine_spec(8, 2, 256, 128, RoutingMethod::kExternal, ActivationKind::kSwiGLU);
  s.max_tokens = 1000;
  for (int64_t T : {6, 64, 1000}) check_bad_ids(s, T, rng);
}

TEST_F(Sm90EngineTest, ForwardRejectsBadViews) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9008);
  MoeSpec s = engine_spec(8, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU);
  s.max_tokens = 16;
  Layer l = make_layer(s, rng());
  expect_bad_views_refused(l, rng);
}

// The routing weight on the experts' input (RouterWeightPlacement::kInput, Llama-4): the
// permute's gathered rows are scaled by their slots' weights before FC1
// (permute::apply_weights_to_rows) and the experts' outputs summed with weight 1. The preset's
// top-1 sigmoid routing in bf16 and fp16; top-2 with top-k softmax routing and both biases;
// llama4 routing at top-2; DeepSeek-V3 routing with the clamped SwiGLU; caller ids on an EP
// rank (slots of other ranks' experts left alone, tokens without a local expert exact zeros);
// each also with the gathered rows and the slots poisoned before every forward. Decode (1 and 7
// tokens: the one-token sliced kernel and the token-rows FC1 do not run here) and prefill.
TEST_F(Sm90EngineTest, WeightOnTheInput) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x900e);
  const auto on_input = [](MoeSpec s) {
    s.routing.weight_placement = RouterWeightPlacement::kInput;
    return s;
  };
  MoeSpec top2 =
      on_input(engine_spec(32, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU));
  top2.fc1_bias = top2.fc2_bias = true;
  MoeSpec llama_top2 = scaled_preset("llama4-maverick", 16, 512, 512);
  llama_top2.top_k = 2;
  MoeSpec external =
      on_input(engine_spec(32, 4, 256, 128, RoutingMethod::kExternal, ActivationKind::kGeGLUTanh));
  external.ep_size = 4;
  external.ep_rank = 1;
  const MoeSpec specs[] = {
      scaled_preset("llama4-maverick", 16, 512, 512),
      scaled_preset("llama4-maverick", 16, 512, 512, DType::kFloat16),
      top2,
      llama_top2,
      on_input(
          engine_spec(32, 4, 256, 128, RoutingMethod::kDeepSeekV3, ActivationKind::kSwiGLUClamped)),
      external,
  };
  for (const MoeSpec& s : specs) {
    ASSERT_EQ(s.routing.weight_placement, RouterWeightPlacement::kInput) << describe(s);
    for (const bool poison : {false, true}) {
      SCOPED_TRACE(poison ? "rows and slots poisoned" : "");
      Sm90Options options;
      options.poison_gathered_rows = options.poison_slots = poison;
      Layer l = make_layer(s, rng(), options);
      for (int64_t T : {1, 7, 64, 513}) check_forward(l, T, ids_for(s), rng);
    }
  }
}

// Checks `out` against `ref` (expect_close) on every token but those in `skip`.
void expect_close_except(const MoeSpec& s, const std::vector<uint16_t>& out,
                         const std::vector<float>& ref, const std::vector<int64_t>& skip) {
  const int64_t H = s.hidden, T = static_cast<int64_t>(ref.size()) / H;
  std::vector<uint16_t> kept_out;
  std::vector<float> kept_ref;
  for (int64_t t = 0; t < T; ++t) {
    if (std::find(skip.begin(), skip.end(), t) != skip.end()) continue;
    kept_out.insert(kept_out.end(), out.begin() + t * H, out.begin() + (t + 1) * H);
    kept_ref.insert(kept_ref.end(), ref.begin() + t * H, ref.begin() + (t + 1) * H);
  }
  ASSERT_FALSE(kept_ref.empty());
  expect_close(s, kept_out, kept_ref, tolerance(s.act_dtype));
}

// NaN / Inf stay in their token (registry.hpp, ForwardArgs): one token's hidden row holds a NaN,
// another's a +Inf and a -Inf, and with caller ids one token's routing weight is NaN; every other
// token's output equals the reference's and is finite (expect_close counts NaN). What the
// poisoned tokens get is not checked: the rule is only that nothing spreads (the GPU's fminf
// clamp, for one, turns a NaN gate into the limit). With routed ids, a token whose logits are all
// NaN (every expert at -inf: weight 0) and one with a NaN logit are compared like the others.
// Decode (the token-rows FC1 multiplies all of a step's tokens together), prefill (tiles of
// many tokens' rows, FC1 gathering them or not), both weight placements.
TEST_F(Sm90EngineTest, NaNAndInfStayInTheirToken) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x900f);
  MoeSpec external =
      engine_spec(16, 4, 256, 128, RoutingMethod::kExternal, ActivationKind::kSwiGLU);
  external.fc2_bias = true;
  MoeSpec external_on_input = external;
  external_on_input.routing.weight_placement = RouterWeightPlacement::kInput;
  const MoeSpec specs[] = {scaled_preset("qwen3-30b-a3b", 32, 512, 256),
                           scaled_preset("llama4-maverick", 16, 512, 512),
                           scaled_preset("gpt-oss-120b", 32, 576, 288),
                           scaled_preset("qwen3-30b-a3b", 32, 512, 256, DType::kFloat16),
                           external,
                           external_on_input};
  for (const MoeSpec& s : specs) {
    Layer l = make_layer(s, rng());
    const int64_t H = s.hidden, E = s.num_experts, k = s.top_k;
    for (int64_t T : {2, 7, 64, 513}) {
      SCOPED_TRACE(describe(s) + " T" + std::to_string(T));
      const Ids mode = ids_for(s);
      Inputs in = make_inputs(l, T, mode, rng);
      std::vector<int64_t> poisoned = {T / 2};
      in.set_hidden(s, T / 2, 3, NAN);
      if (T > 2) {
        poisoned.push_back(T - 1);
        in.set_hidden(s, T - 1, H - 1, INFINITY);
        in.set_hidden(s, T - 1, 0, -INFINITY);
      }
      if (mode == Ids::kRandom && T > 2) {
        poisoned.push_back(0);
        in.device_weights[k - 1] = in.weights[k - 1] = NAN;
      }
      if (mode == Ids::kRouted && T > 4) {
        std::fill(in.logits.begin() + E, in.logits.begin() + 2 * E, NAN);  // token 1
        in.logits[2 * E + 1] = NAN;                                        // token 2
        const float* bias = s.routing.correction_bias ? l.local.routing_bias.data() : nullptr;
        ASSERT_TRUE(routing::route_host(s.routing, T, E, k, in.logits.data(), bias, in.ids.data(),
                                        in.weights.data())
                        .ok());
      }
      const std::vector<float> ref = reference_out(l, in);
      DeviceRun run(l, in, nullptr);
      l.engine->forward(run.args);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expect_close_except(s, run.result(), ref, poisoned);
      EXPECT_TRUE(l.engine->poll_errors().ok());
    }
  }
}

// Host-side refusals: no GPU needed (checked before any CUDA call).
TEST(Sm90EngineLimits, RefusesFormatsOtherThanBf16AndFp16) {
  MoeSpec s = engine_spec(8, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU);
  s.weights.format = WeightFormat::kFP8PerTensor;
  const MoeWeights w = quant::make_random_weights(s, 1);
  try {
    make_sm90_engine(s, w, 0);
    ADD_FAILURE() << "fp8 weights were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  MoeSpec f = engine_spec(8, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU);
  f.act_dtype = DType::kFloat32;
  f.weights.format = WeightFormat::kFP32;
  try {
    make_sm90_engine(f, quant::make_random_weights(f, 1), 0);
    ADD_FAILURE() << "fp32 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  // Past the kernels' limits: 1024 experts, top-40, hidden not a multiple of 8.
  const MoeSpec too_big[] = {
      engine_spec(1024, 2, 16, 8, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU),
      engine_spec(64, 40, 16, 8, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU),
      engine_spec(8, 2, 20, 8, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU)};
  for (const MoeSpec& b : too_big) {
    try {
      make_sm90_engine(b, quant::make_random_weights(b, 1), 0);
      ADD_FAILURE() << describe(b) << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << describe(b) << ": " << e.what();
    }
  }
}

// The small cases compute-sanitizer runs (memcheck, racecheck): routed and caller ids, a bad id,
// and decode on 64 experts (the GEMV path, FC2 in k slices or not).
class Sm90EngineSanitizer : public GpuTest {};

TEST_F(Sm90EngineSanitizer, SmallCase) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9009);
  MoeSpec s = engine_spec(8, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU);
  s.max_tokens = 64;
  s.fc1_bias = s.fc2_bias = true;
  Layer l = make_layer(s, rng());
  check_forward(l, 64, Ids::kRouted, rng);
  check_forward(l, 3, Ids::kRouted, rng);
  MoeSpec e = s;
  e.routing.method = RoutingMethod::kExternal;
  check_bad_ids(e, 64, rng);
  // Decode on many experts: both GEMMs take the GEMV.
  MoeSpec d = engine_spec(64, 2, 256, 128, RoutingMethod::kTopKSoftmax, ActivationKind::kSwiGLU);
  d.max_tokens = 4;
  d.fc1_bias = d.fc2_bias = true;  // at one token: the sliced kernel and its finalize
  Layer dl = make_layer(d, rng());
  check_forward(dl, 1, Ids::kRouted, rng);
  check_forward(dl, 3, Ids::kRouted, rng);
  // Decode chained with FC2 in two k slices (Sm90Options::fc2_k_slices): its partials.
  Sm90Options two_slices;
  two_slices.fc2_k_slices = 2;
  Layer kl = make_layer(d, rng(), two_slices);
  check_forward(kl, 3, Ids::kRouted, rng);
  // Prefill (~128 rows per expert): the cooperative CUTLASS tiles (the cases above run the
  // GEMVs and swap-AB tiles only).
  MoeSpec p = s;
  p.max_tokens = 512;
  Layer pl = make_layer(p, rng());
  check_forward(pl, 512, Ids::kRouted, rng);
  // The routing weight on the experts' input: the kernel that scales the gathered rows.
  MoeSpec w = s;
  w.routing.weight_placement = RouterWeightPlacement::kInput;
  Layer wl = make_layer(w, rng());
  check_forward(wl, 64, Ids::kRouted, rng);
  check_forward(wl, 3, Ids::kRouted, rng);
}

// Tokens x hidden past 2^31 elements (support/large_batch.cuh): FC1 reads its rows by index
// (gather_in_fc1) and from the rows the permute gathered, in turn.
TEST_F(Sm90EngineTest, TokensTimesHiddenPast2To31Elements) {
  MoeSpec s =
      engine_spec(8, 1, kLargeBatchHidden, 256, RoutingMethod::kExternal, ActivationKind::kSwiGLU);
  check_tokens_times_hidden_past_2_to_31(
      s, {"FC1 reads its rows by index", "FC1 reads the gathered rows"},
      [](const MoeSpec& spec, const MoeWeights& w, int variant) {
        Sm90Options options;
        options.gather_in_fc1 = variant == 0;
        return make_sm90_engine(spec, w, 0, options);
      });
}

}  // namespace
}  // namespace moekit::pipeline
