// MoeLayer: built through the resolver, refuses before allocating, fixes its formats, and
// validates every view of forward().
#include "moekit/layer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/numeric.hpp"
#include "moekit/status.hpp"
#include "reference/reference.hpp"
#include "registry/registry_fixtures.hpp"
#include "registry/registry_internal.hpp"
#include "routing/routing.hpp"

namespace moekit::registry::test {
namespace {

MoeSpec layer_spec(WeightFormat f = WeightFormat::kBF16, DType act = DType::kBFloat16) {
  MoeSpec s = small_spec(f, act);
  s.hidden = 64;
  s.intermediate = 32;
  s.max_tokens = 16;
  return s;
}

// Stores fp32 values in `format` (bf16 / fp16 / fp32 only).
std::vector<uint8_t> encode(WeightFormat format, const std::vector<float>& v) {
  std::vector<uint8_t> out;
  if (format == WeightFormat::kFP32) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  out.resize(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h =
        format == WeightFormat::kBF16 ? numeric::float_to_bf16(v[i]) : numeric::float_to_fp16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

std::vector<float> randoms(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

MoeWeights random_weights(const MoeSpec& spec, WeightFormat format, std::mt19937& rng) {
  const LocalProblem lp = derive_local(spec);
  auto tensor = [&](int64_t rows, int64_t cols) {
    QuantizedTensor t;
    t.format = format;
    t.experts = lp.num_experts;
    t.rows = rows;
    t.cols = cols;
    t.values = encode(format, randoms(rng, static_cast<size_t>(lp.num_experts * rows * cols),
                                      1.0f / std::sqrt(static_cast<float>(cols))));
    return t;
  };
  MoeWeights w;
  w.fc1 = tensor(lp.fc1_rows, lp.hidden);
  w.fc2 = tensor(lp.hidden, lp.intermediate);
  return w;
}

struct Buffers {
  std::vector<uint16_t> hidden, output;  // bf16 / fp16 bits
  std::vector<float> logits;
};

Buffers random_inputs(const MoeSpec& s, int64_t tokens, std::mt19937& rng) {
  Buffers b;
  std::vector<float> h = randoms(rng, static_cast<size_t>(tokens * s.hidden), 1.0f);
  b.hidden.resize(h.size());
  for (size_t i = 0; i < h.size(); ++i) b.hidden[i] = numeric::float_to_bf16(h[i]);
  b.output.assign(h.size(), 0x7fc1);  // poison: a bf16 NaN
  b.logits = randoms(rng, static_cast<size_t>(tokens * s.num_experts), 2.0f);
  return b;
}

ForwardArgs args_for(const MoeSpec& s, int64_t tokens, Buffers& b) {
  ForwardArgs a;
  a.hidden = host_view(b.hidden.data(), s.act_dtype, {tokens, s.hidden});
  a.output = host_view(b.output.data(), s.act_dtype, {tokens, s.hidden});
  a.router_logits = host_view(b.logits.data(), DType::kFloat32, {tokens, s.num_experts});
  return a;
}

template <class F>
ErrorCode code_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

LayerOptions cpu_options(const Environment& env, const std::string& backend = "auto") {
  LayerOptions o;
  o.backend = backend;
  o.environment = &env;
  return o;
}

TEST(MoeLayer, AutoOnCpuRunsTheReferenceExactly) {
  std::mt19937 rng(1234);
  const MoeSpec s = layer_spec();
  const MoeWeights w = random_weights(s, WeightFormat::kBF16, rng);
  const Environment env = Environment::cpu_only();
  auto layer = MoeLayer::create(s, w, cpu_options(env));
  ASSERT_EQ(layer->implementation().id(), "cpu.reference");
  EXPECT_EQ(layer->implementation().device(), Device::kHost);
  EXPECT_GT(layer->workspace_bytes(), 0u);
  EXPECT_TRUE(layer->resolution().ok());

  const int64_t tokens = 7;
  Buffers b = random_inputs(s, tokens, rng);
  layer->forward(args_for(s, tokens, b));

  // The same computation, spelled out: route, reference forward, round to bf16.
  std::vector<float> h(b.hidden.size()), out(b.hidden.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = numeric::bf16_to_float(b.hidden[i]);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * s.top_k));
  std::vector<float> rw(ids.size());
  ASSERT_TRUE(routing::route_host(s.routing, tokens, s.num_experts, s.top_k, b.logits.data(),
                                  nullptr, ids.data(), rw.data())
                  .ok());
  ASSERT_TRUE(reference::forward(s, w, tokens, h.data(), ids.data(), rw.data(), out.data()).ok());
  int nonzero = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(b.output[i], numeric::float_to_bf16(out[i])) << "element " << i;
    nonzero += out[i] != 0.0f;
  }
  EXPECT_GT(nonzero, 0);
}

TEST(MoeLayer, ExternalRoutingTakesCallerWeightsAsFinalAndChecksIds) {
  std::mt19937 rng(99);
  MoeSpec s = layer_spec(WeightFormat::kFP32, DType::kFloat32);
  s.routing.method = RoutingMethod::kExternal;
  s.routing.routed_scaling_factor = 2.5f;
  const MoeWeights w = random_weights(s, WeightFormat::kFP32, rng);
  const Environment env = Environment::cpu_only();
  auto layer = MoeLayer::create(s, w, cpu_options(env, "reference"));

  const int64_t tokens = 3;
  std::vector<float> hidden = randoms(rng, static_cast<size_t>(tokens * s.hidden), 1.0f);
  std::vector<float> output(hidden.size(), std::nanf(""));
  std::vector<int32_t> ids = {0, 5, 7, 1, 2, 3};
  std::vector<float> rw = {0.7f, 0.3f, 0.5f, 0.5f, 0.9f, 0.1f};
  ForwardArgs a;
  a.hidden = host_view(hidden.data(), DType::kFloat32, {tokens, s.hidden});
  a.output = host_view(output.data(), DType::kFloat32, {tokens, s.hidden});
  a.topk_ids = host_view(ids.data(), DType::kInt32, {tokens, s.top_k});
  a.topk_weights = host_view(rw.data(), DType::kFloat32, {tokens, s.top_k});
  layer->forward(a);

  // routed_scaling_factor is the router's: the caller's weights already carry it.
  std::vector<float> expect(output.size());
  ASSERT_TRUE(
      reference::forward(s, w, tokens, hidden.data(), ids.data(), rw.data(), expect.data()).ok());
  for (size_t i = 0; i < expect.size(); ++i) ASSERT_EQ(output[i], expect[i]) << i;

  ids[4] = 8;  // experts are 0..7
  std::string msg;
  EXPECT_EQ(code_of([&] { layer->forward(a); }, &msg), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find('8'), std::string::npos) << msg;
  ids[4] = -1;
  EXPECT_EQ(code_of([&] { layer->forward(a); }), ErrorCode::kInvalidArgument);
}

TEST(MoeLayer, ForwardValidatesViews) {
  std::mt19937 rng(7);
  const MoeSpec s = layer_spec();
  const Environment env = Environment::cpu_only();
  auto layer = MoeLayer::create(s, random_weights(s, WeightFormat::kBF16, rng), cpu_options(env));
  const int64_t tokens = 4;
  Buffers b = random_inputs(s, tokens, rng);
  std::string msg;

  ForwardArgs a = args_for(s, tokens, b);
  a.hidden.dtype = DType::kFloat16;
  EXPECT_EQ(code_of([&] { layer->forward(a); }, &msg), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("fp16"), std::string::npos) << msg;

  a = args_for(s, tokens, b);
  a.output.shape = {tokens, s.hidden - 1};
  EXPECT_EQ(code_of([&] { layer->forward(a); }, &msg), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find(std::to_string(s.hidden - 1)), std::string::npos) << msg;

  a = args_for(s, tokens, b);
  a.router_logits.shape = {tokens, s.num_experts + 1};
  EXPECT_EQ(code_of([&] { layer->forward(a); }), ErrorCode::kInvalidArgument);

  a = args_for(s, tokens, b);
  a.router_logits.dtype = DType::kBFloat16;
  EXPECT_EQ(code_of([&] { layer->forward(a); }), ErrorCode::kInvalidArgument);

  a = args_for(s, tokens, b);
  a.hidden.shape = {s.hidden};
  EXPECT_EQ(code_of([&] { layer->forward(a); }), ErrorCode::kInvalidArgument);

  a = args_for(s, tokens, b);
  a.output.device = Device::kCuda;
  EXPECT_EQ(code_of([&] { layer->forward(a); }, &msg), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("output"), std::string::npos) << msg;

  a = args_for(s, tokens, b);
  a.hidden.data = nullptr;
  EXPECT_EQ(code_of([&] { layer->forward(a); }), ErrorCode::kInvalidArgument);

  // More tokens than the workspace was sized for.
  const int64_t too_many = s.max_tokens + 1;
  Buffers big = random_inputs(s, too_many, rng);
  EXPECT_EQ(code_of([&] { layer->forward(args_for(s, too_many, big)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find(std::to_string(too_many)), std::string::npos) << msg;

  // Zero tokens is a valid, empty batch.
  Buffers none;
  EXPECT_EQ(code_of([&] { layer->forward(args_for(s, 0, none)); }), ErrorCode::kOk);
}

TEST(MoeLayer, FormatsAreFixedAtBuild) {
  std::mt19937 rng(5);
  const MoeSpec s = layer_spec(WeightFormat::kBF16, DType::kBFloat16);
  const MoeWeights fp16 = random_weights(s, WeightFormat::kFP16, rng);
  const Environment env = Environment::cpu_only();
  const uint64_t before = engines_created();
  std::string msg;
  EXPECT_EQ(code_of([&] { MoeLayer::create(s, fp16, cpu_options(env)); }, &msg),
            ErrorCode::kFormatMismatch);
  EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp16"), std::string::npos) << msg;
  EXPECT_EQ(engines_created(), before) << "refused before any engine was built";
}

TEST(MoeLayer, ForcedIneligibleRequestFailsBeforeAllocation) {
  std::mt19937 rng(11);
  MoeSpec s = layer_spec();
  s.hidden = 68;  // not a multiple of 8: the Hopper kernels cannot take it
  const MoeWeights w = random_weights(s, WeightFormat::kBF16, rng);
  const Environment gpu = h200_env();
  const Environment cpu = Environment::cpu_only();
  const uint64_t before = engines_created();
  std::string msg;

  EXPECT_EQ(code_of([&] { MoeLayer::create(s, w, cpu_options(gpu, "cutlass")); }, &msg),
            ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("alignment"), std::string::npos) << "the message carries the report: " << msg;
  EXPECT_NE(msg.find("68"), std::string::npos) << msg;

  EXPECT_EQ(code_of(
                [&] {
                  MoeLayer::create(layer_spec(),
                                   random_weights(layer_spec(), WeightFormat::kBF16, rng),
                                   cpu_options(cpu, "cuda.sm90.cutlass.bf16"));
                },
                &msg),
            ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("cuda.sm90.cutlass.bf16"), std::string::npos) << msg;

  EXPECT_EQ(code_of([&] { MoeLayer::create(s, w, cpu_options(gpu, "tensorrt")); }),
            ErrorCode::kNotFound);
  MoeSpec invalid = s;
  invalid.num_experts = 0;
  EXPECT_EQ(code_of([&] { MoeLayer::create(invalid, w, cpu_options(gpu)); }),
            ErrorCode::kInvalidSpec);
  LayerOptions far = cpu_options(gpu);
  far.device_index = 3;
  EXPECT_EQ(code_of([&] { MoeLayer::create(s, w, far); }, &msg), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find('3'), std::string::npos) << msg;

  EXPECT_EQ(engines_created(), before) << "no engine, weights or workspace were created";

  // The same layer with auto falls back to the reference, which builds one engine.
  auto layer = MoeLayer::create(s, w, cpu_options(gpu));
  EXPECT_EQ(layer->implementation().id(), "cpu.reference");
  EXPECT_EQ(engines_created(), before + 1);
}

TEST(MoeLayer, ResolvesBeforeLookingAtTheWeights) {
  // No weights at all: an ineligible request is refused by the resolver (kUnsupported), before
  // the weights are checked (which would be kFormatMismatch / kInvalidArgument).
  const MoeSpec s = layer_spec();
  const uint64_t before = engines_created();
  std::string msg;
  EXPECT_EQ(code_of(
                [&] {
                  MoeLayer::create(s, MoeWeights{},
                                   cpu_options(Environment::cpu_only(), "cutlass"));
                },
                &msg),
            ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("cutlass"), std::string::npos) << msg;
  EXPECT_EQ(engines_created(), before);
}

TEST(MoeLayer, EmptyBatchIsValid) {
  std::mt19937 rng(5);
  const MoeSpec s = layer_spec();
  auto layer = MoeLayer::create(s, random_weights(s, WeightFormat::kBF16, rng),
                                cpu_options(Environment::cpu_only()));
  Buffers b = random_inputs(s, 0, rng);
  ForwardArgs a = args_for(s, 0, b);
  EXPECT_EQ(a.hidden.shape, (std::vector<int64_t>{0, s.hidden}));
  EXPECT_NO_THROW(layer->forward(a));
  // Null data is fine where there is nothing to read or write.
  a.hidden.data = nullptr;
  a.output.data = nullptr;
  a.router_logits.data = nullptr;
  EXPECT_NO_THROW(layer->forward(a));
}

TEST(MoeLayer, ChosenOnTheRequestedDevice) {
  // Device 1 is a Hopper, device 0 is not: the layer on device 1 may take the Hopper kernels,
  // the one on device 0 may not. Resolution only; no engine is built.
  std::mt19937 rng(3);
  Environment env = h200_env();
  env.gpus.insert(env.gpus.begin(), h200());
  env.gpus[0].name = "NVIDIA A100";
  env.gpus[0].sm = 80;
  const MoeSpec s = layer_spec();
  const MoeWeights w = random_weights(s, WeightFormat::kBF16, rng);
  const uint64_t before = engines_created();
  LayerOptions o = cpu_options(env, "cutlass");
  o.device_index = 0;
  std::string msg;
  EXPECT_EQ(code_of([&] { MoeLayer::create(s, w, o); }, &msg), ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("A100"), std::string::npos) << msg;
  EXPECT_EQ(engines_created(), before);
#ifndef MOEKIT_WITH_CUDA
  // In a CUDA-less build the (hand-made) environment lets resolution pass, and the engine stub
  // refuses: the table's entry is there, the engine is not.
  o.device_index = 1;
  EXPECT_EQ(code_of([&] { MoeLayer::create(s, w, o); }), ErrorCode::kUnsupported);
#endif
}

// ---- One forward at a time per layer (built and run under ThreadSanitizer too) -----------------

// Holds the first forward that reaches the engine until the test releases it; later forwards
// pass through. Installed as registry::forward_entered_hook before any thread starts.
struct ForwardGate {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false, released = false;
};
ForwardGate* gate = nullptr;

void hold_first_forward() {
  std::unique_lock lock(gate->mutex);
  if (gate->entered) return;
  gate->entered = true;
  gate->changed.notify_all();
  gate->changed.wait(lock, [] { return gate->released; });
}

// The output a fresh layer of the same weights gives for `b` (no concurrency involved).
std::vector<uint16_t> output_alone(const MoeSpec& s, const MoeWeights& w, const Environment& env,
                                   int64_t tokens, Buffers b) {
  auto layer = MoeLayer::create(s, w, cpu_options(env, "reference"));
  layer->forward(args_for(s, tokens, b));
  return b.output;
}

TEST(MoeLayerConcurrency, SecondForwardWhileOneRunsIsRefusedAndTheFirstStaysExact) {
  std::mt19937 rng(2024);
  const MoeSpec s = layer_spec();
  const MoeWeights w = random_weights(s, WeightFormat::kBF16, rng);
  const Environment env = Environment::cpu_only();
  auto layer = MoeLayer::create(s, w, cpu_options(env, "reference"));
  const int64_t tokens = 9;
  Buffers first = random_inputs(s, tokens, rng), second = random_inputs(s, tokens, rng);
  const std::vector<uint16_t> first_expected = output_alone(s, w, env, tokens, first);
  const std::vector<uint16_t> second_expected = output_alone(s, w, env, tokens, second);
  const std::vector<uint16_t> poison = second.output;

  ForwardGate g;
  gate = &g;
  forward_entered_hook = hold_first_forward;
  ErrorCode first_code = ErrorCode::kInternal;
  std::thread running(
      [&] { first_code = code_of([&] { layer->forward(args_for(s, tokens, first)); }); });
  {
    std::unique_lock lock(g.mutex);
    g.changed.wait(lock, [&] { return g.entered; });
  }
  // The first forward is inside the engine: this one must be refused and write nothing.
  const ErrorCode refused = code_of([&] { layer->forward(args_for(s, tokens, second)); });
  {
    std::lock_guard lock(g.mutex);
    g.released = true;
  }
  g.changed.notify_all();
  running.join();
  forward_entered_hook = nullptr;
  gate = nullptr;

  EXPECT_EQ(refused, ErrorCode::kInvalidArgument);
  EXPECT_EQ(second.output, poison);
  EXPECT_EQ(first_code, ErrorCode::kOk);
  EXPECT_EQ(first.output, first_expected);
  // The layer is free again once the first forward returned.
  layer->forward(args_for(s, tokens, second));
  EXPECT_EQ(second.output, second_expected);
}

// One thread's work in the tests below: an input, the output a layer alone gives for it.
struct ThreadCase {
  Buffers input;
  std::vector<uint16_t> expected;
};

// `count` cases of a full batch on layers built from s and w.
std::vector<ThreadCase> thread_cases(const MoeSpec& s, const MoeWeights& w, const Environment& env,
                                     int count, std::mt19937& rng) {
  std::vector<ThreadCase> cases;
  for (int t = 0; t < count; ++t) {
    Buffers b = random_inputs(s, s.max_tokens, rng);
    std::vector<uint16_t> expected = output_alone(s, w, env, s.max_tokens, b);
    cases.push_back({std::move(b), std::move(expected)});
  }
  return cases;
}

struct Outcome {
  ErrorCode code;
  bool exact;  // the output equals the case's expected output
};

// Each thread t runs its case `forwards` times on layer_of(t), the threads released together,
// and hands each forward's outcome to record (from its own thread).
template <class LayerOf, class Record>
void run_threads(const MoeSpec& s, const std::vector<ThreadCase>& cases, int forwards,
                 LayerOf layer_of, Record record) {
  std::latch start(static_cast<std::ptrdiff_t>(cases.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < cases.size(); ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < forwards; ++i) {
        Buffers b = cases[t].input;
        const ErrorCode code = code_of([&] { layer_of(t).forward(args_for(s, s.max_tokens, b)); });
        record(Outcome{code, code == ErrorCode::kOk && b.output == cases[t].expected});
      }
    });
  for (std::thread& t : threads) t.join();
}

// Without a gate the threads overlap or not as the scheduler decides: every forward either
// computes the exact result or is refused, never a mix of the two threads' scratch.
TEST(MoeLayerConcurrency, ThreadsSharingALayerGetExactResultsOrTheRefusal) {
  std::mt19937 rng(77);
  const MoeSpec s = layer_spec();
  const MoeWeights w = random_weights(s, WeightFormat::kBF16, rng);
  const Environment env = Environment::cpu_only();
  auto layer = MoeLayer::create(s, w, cpu_options(env, "reference"));
  const std::vector<ThreadCase> cases = thread_cases(s, w, env, 2, rng);
  std::atomic<int> wrong{0}, other_code{0}, done{0};
  run_threads(
      s, cases, 20, [&](size_t) -> MoeLayer& { return *layer; },
      [&](Outcome o) {
        if (o.code == ErrorCode::kOk) {
          ++done;
          wrong += !o.exact;
        } else {
          other_code += o.code != ErrorCode::kInvalidArgument;
        }
      });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(other_code.load(), 0);
  EXPECT_GT(done.load(), 0);  // a refusal means another forward was running
}

TEST(MoeLayerConcurrency, OneLayerPerThreadRunsTogether) {
  std::mt19937 rng(5);
  const MoeSpec s = layer_spec();
  const MoeWeights w = random_weights(s, WeightFormat::kBF16, rng);
  const Environment env = Environment::cpu_only();
  const std::vector<ThreadCase> cases = thread_cases(s, w, env, 2, rng);
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (size_t t = 0; t < cases.size(); ++t)
    layers.push_back(MoeLayer::create(s, w, cpu_options(env, "reference")));
  std::atomic<int> failed{0};
  run_threads(
      s, cases, 5, [&](size_t t) -> MoeLayer& { return *layers[t]; },
      [&](Outcome o) { failed += o.code != ErrorCode::kOk || !o.exact; });
  EXPECT_EQ(failed.load(), 0);
}

}  // namespace
}  // namespace moekit::registry::test
