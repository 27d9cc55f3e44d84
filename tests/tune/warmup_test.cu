// MoeLayer::warmup and tuned layers on the GPU: after warm-up, a forward at every token bucket
// is captured in a CUDA graph (global capture mode: any allocation, synchronization or lazy
// initialization inside the capture fails it), replayed, and equal to the eager forward and
// close to the CPU reference; the same with a tuning file that forces other tactics, whose
// unknown names are reported and never run. Skips without an sm_90 GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "moekit/tune.hpp"
#include "quant/quant.hpp"
#include "support/command.hpp"
#include "support/gpu.hpp"

namespace moekit {
namespace {

class TuneWarmupTest : public devtest::GpuTest {};

MoeSpec bf16_spec() {
  MoeSpec s = find_preset("qwen3-30b-a3b").spec;
  s.num_experts = 32;
  s.hidden = 512;
  s.intermediate = 256;
  s.max_tokens = 100;  // buckets 1, 2, 4, ..., 64, 100
  return s;
}

MoeSpec fp8_spec() {
  MoeSpec s = find_preset("deepseek-v3").spec;
  s.num_experts = 32;
  s.routing.n_group = 4;
  s.routing.topk_group = 2;
  s.hidden = 512;
  s.intermediate = 256;
  s.max_tokens = 40;
  s.weights = WeightQuant{};
  s.weights.format = WeightFormat::kFP8Block128;
  return s;
}

// Host inputs of T tokens and their device copies, as ForwardArgs for `layer`.
struct Batch {
  std::vector<uint16_t> hidden;  // bf16 bits
  std::vector<float> logits;
  devtest::DeviceBuffer d_hidden, d_logits, d_out;
  ForwardArgs args;
  Batch(const MoeSpec& s, int64_t T, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    hidden.resize(static_cast<std::size_t>(T * s.hidden));
    for (auto& h : hidden) h = devtest::to_bits(DType::kBFloat16, u(rng));
    logits.resize(static_cast<std::size_t>(T * s.num_experts));
    for (auto& l : logits) l = 3.0f * u(rng);
    d_hidden = devtest::to_device(hidden);
    d_logits = devtest::to_device(logits);
    d_out = devtest::DeviceBuffer(hidden.size() * 2);
    args.hidden = cuda_view(d_hidden.ptr, DType::kBFloat16, {T, s.hidden});
    args.router_logits = cuda_view(d_logits.ptr, DType::kFloat32, {T, s.num_experts});
    args.output = cuda_view(d_out.ptr, DType::kBFloat16, {T, s.hidden});
  }
  std::vector<uint16_t> output() const {
    return devtest::to_host<uint16_t>(d_out.ptr, hidden.size());
  }
};

// The CPU reference's output for the batch, as float.
std::vector<float> reference(const MoeSpec& s, const MoeWeights& w, Batch& b, int64_t T) {
  LayerOptions o;
  o.backend = "reference";
  o.environment = nullptr;
  auto ref = MoeLayer::create(s, w, o);
  std::vector<uint16_t> out(b.hidden.size());
  ForwardArgs a;
  a.hidden = host_view(b.hidden.data(), DType::kBFloat16, {T, s.hidden});
  a.router_logits = host_view(b.logits.data(), DType::kFloat32, {T, s.num_experts});
  a.output = host_view(out.data(), DType::kBFloat16, {T, s.hidden});
  ref->forward(a);
  std::vector<float> f(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) f[i] = devtest::from_bits(DType::kBFloat16, out[i]);
  return f;
}

double relative_error(const std::vector<uint16_t>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = devtest::from_bits(DType::kBFloat16, got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// warmup(), then at every bucket: capture one forward (global mode), replay it, compare with an
// eager forward (bit for bit) and the CPU reference.
void capture_every_bucket(MoeLayer& layer, const MoeWeights& w, std::mt19937_64& rng) {
  const MoeSpec& s = layer.spec();
  layer.warmup();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const int64_t T : tuning_buckets(s.max_tokens)) {
    SCOPED_TRACE(layer.implementation().id() + " T" + std::to_string(T));
    Batch b(s, T, rng);
    b.args.stream = stream;
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    layer.forward(b.args);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<uint16_t> replayed = b.output();
    ASSERT_EQ(cudaMemset(b.d_out.ptr, 0xff, b.d_out.bytes), cudaSuccess);
    layer.forward(b.args);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(b.output() == replayed) << "graph replay differs from eager";
    EXPECT_LT(relative_error(replayed, reference(s, w, b, T)), 2e-2);
    EXPECT_TRUE(layer.poll_errors().ok());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST_F(TuneWarmupTest, CaptureAfterWarmupAtEveryBucket) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x7a1e);
  for (const MoeSpec& s : {bf16_spec(), fp8_spec()}) {
    const MoeWeights w = quant::make_random_weights(s, rng());
    auto layer = MoeLayer::create(s, w, LayerOptions{"cutlass"});
    EXPECT_FALSE(layer->tactics(Gemm::kFc1).empty());
    EXPECT_FALSE(layer->tactics(Gemm::kFc2).empty());
    capture_every_bucket(*layer, w, rng);
  }
}

// The warm-up's own inputs for caller-supplied ids ((t + j) mod E): valid ids, on an EP rank too,
// so that nothing is reported afterwards.
TEST_F(TuneWarmupTest, WarmupWithCallerIdsOnAnEpRankReportsNothing) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x7a20);
  MoeSpec s = bf16_spec();
  s.routing = RoutingParams{};
  s.routing.method = RoutingMethod::kExternal;
  s.ep_size = 2;
  s.ep_rank = 1;
  for (const MoeSpec& spec : {s, [&] {
                                MoeSpec f = fp8_spec();
                                f.routing = s.routing;
                                return f;
                              }()}) {
    auto layer =
        MoeLayer::create(spec, quant::make_random_weights(spec, rng()), LayerOptions{"cutlass"});
    layer->warmup();
    EXPECT_TRUE(layer->poll_errors().ok()) << layer->poll_errors().message();
  }
}

// A tuning file naming, at every bucket, the last tactic the engine built for each GEMM (not
// what it picks everywhere), and one entry naming a tactic that does not exist.
TEST_F(TuneWarmupTest, TunedTacticsRunAndCaptureAndUnknownOnesFallBack) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x7a1f);
  for (const MoeSpec& s : {bf16_spec(), fp8_spec()}) {
    const MoeWeights w = quant::make_random_weights(s, rng());
    auto plain = MoeLayer::create(s, w, LayerOptions{"cutlass"});
    const std::string impl = plain->implementation().id();
    TuningCache cache;
    cache.fingerprint = Environment::detected().fingerprint();
    cache.moekit_version = "test";
    cache.moekit_commit = "test";
    for (const Gemm g : {Gemm::kFc1, Gemm::kFc2})
      for (const int64_t bucket : tuning_buckets(s.max_tokens)) {
        TuningEntry e;
        e.key = TuningKey::of(s, impl, g, bucket);
        e.tactic = plain->tactics(g).back();
        e.time_us = 1.0;
        cache.put(e);
      }
    TuningEntry ghost;
    ghost.key = TuningKey::of(s, impl, Gemm::kFc2, tuning_buckets(s.max_tokens).back());
    ghost.tactic = "sm90.no.such.tactic";
    ghost.time_us = 1.0;
    cache.put(ghost);  // replaces that bucket's FC2 entry
    const std::string path = testcmd::test_dir("tune") + "/warmup_" + impl + ".json";
    cache.save(path);
    LayerOptions o{"cutlass"};
    o.tuning_file = path;
    auto tuned = MoeLayer::create(s, w, o);
    const TuningOutcome& t = tuned->resolution().tuning;
    EXPECT_EQ(t.chosen.size(), 2 * tuning_buckets(s.max_tokens).size() - 1);
    ASSERT_EQ(t.problems.size(), 1u);
    EXPECT_NE(t.problems[0].reason.find("sm90.no.such.tactic"), std::string::npos);
    EXPECT_NE(tuned->resolution().table().find(plain->tactics(Gemm::kFc1).back()),
              std::string::npos);
    capture_every_bucket(*tuned, w, rng);
  }
}

// Where the engine says a choice of tactics does not apply (its fused decode paths), any choice
// gives the built-in forward bit for bit and there is no built-in tactic to name; where it does,
// the tuner measures, and the engine names its own pick (builtin_tactic), one of its tactics,
// which forced gives the built-in forward bit for bit. The BF16 engine has fused buckets at
// decode sizes and not at 100 tokens; the FP8 engine has none.
TEST_F(TuneWarmupTest, TacticsApplyWhereAChoiceChangesTheForward) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x7a20);
  for (const MoeSpec& s : {bf16_spec(), fp8_spec()}) {
    const MoeWeights w = quant::make_random_weights(s, rng());
    auto layer = MoeLayer::create(s, w, LayerOptions{"cutlass"});
    const bool bf16 = s.weights.format == WeightFormat::kBF16;
    SCOPED_TRACE(layer->implementation().id());
    int fused = 0;
    for (const int64_t T : tuning_buckets(s.max_tokens)) {
      const bool fc1 = layer->tactics_apply(Gemm::kFc1, T);
      EXPECT_EQ(fc1, layer->tactics_apply(Gemm::kFc2, T)) << "T " << T;
      if (fc1) {
        for (const Gemm g : {Gemm::kFc1, Gemm::kFc2}) {
          const std::vector<std::string> names = layer->tactics(g);
          const std::string picked = layer->builtin_tactic(g, T);
          EXPECT_NE(std::find(names.begin(), names.end(), picked), names.end())
              << to_string(g) << " T " << T << ": built-in \"" << picked << "\"";
        }
        continue;
      }
      EXPECT_TRUE(layer->builtin_tactic(Gemm::kFc1, T).empty()) << "T " << T;
      ++fused;
      SCOPED_TRACE("T " + std::to_string(T));
      Batch b(s, T, rng);
      layer->set_tactics(TacticChoices{});
      layer->forward(b.args);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> built_in = b.output();
      for (const Gemm g : {Gemm::kFc1, Gemm::kFc2})
        for (const std::string& tactic : {layer->tactics(g).front(), layer->tactics(g).back()}) {
          layer->set_tactics(TacticChoices{{TacticChoice{g, T, tactic}}});
          ASSERT_EQ(cudaMemset(b.d_out.ptr, 0xff, b.d_out.bytes), cudaSuccess);
          layer->forward(b.args);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_TRUE(b.output() == built_in) << tactic;
        }
    }
    layer->set_tactics(TacticChoices{});
    EXPECT_TRUE(layer->tactics_apply(Gemm::kFc1, s.max_tokens));
    {  // The built-in picks forced by name run the built-in forward.
      const int64_t T = s.max_tokens;
      Batch b(s, T, rng);
      layer->forward(b.args);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> built_in = b.output();
      layer->set_tactics(
          TacticChoices{{TacticChoice{Gemm::kFc1, T, layer->builtin_tactic(Gemm::kFc1, T)},
                         TacticChoice{Gemm::kFc2, T, layer->builtin_tactic(Gemm::kFc2, T)}}});
      ASSERT_EQ(cudaMemset(b.d_out.ptr, 0xff, b.d_out.bytes), cudaSuccess);
      layer->forward(b.args);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(b.output() == built_in);
      layer->set_tactics(TacticChoices{});
    }
    if (bf16) {
      EXPECT_GT(fused, 0) << "no decode bucket runs a fused path";
    } else {
      EXPECT_EQ(fused, 0);
    }
    EXPECT_TRUE(layer->poll_errors().ok());
  }
}

}  // namespace
}  // namespace moekit
