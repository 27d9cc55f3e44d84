// The expert-parallel layer over the host transport, worlds of 1, 2, 4 and 8 ranks simulated
// with threads: each rank's output equals the single-rank layer's for its tokens (the CPU
// reference both ways; the EP sums run in another order: per rank, then over ranks), and the
// build is collective: a forced ineligible strategy, a layout or weights refused on one rank,
// or differing environments fail on every rank before anything is allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "common/host_activations.hpp"
#include "moekit/ep.hpp"
#include "quant/quant.hpp"
#include "registry/registry_internal.hpp"
#include "support/specs.hpp"

namespace moekit {
namespace {

struct Batch {
  std::vector<int64_t> tokens_of;  // per rank
  int64_t total = 0;
  std::vector<uint8_t> hidden;  // [total, H] act_dtype
  std::vector<float> logits;    // [total, E]
};

Batch make_batch(const MoeSpec& s, int world, uint32_t seed) {
  Batch b;
  for (int r = 0; r < world; ++r) b.tokens_of.push_back(r == 1 ? 0 : 3 + (5 * r + 2) % 7);
  for (int64_t t : b.tokens_of) b.total += t;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> h(b.total * s.hidden);
  for (auto& x : h) x = nd(rng);
  b.hidden.resize(h.size() * dtype_size(s.act_dtype));
  f32_to_view(h.data(), host_view(b.hidden.data(), s.act_dtype, {b.total, s.hidden}));
  b.logits.resize(b.total * s.num_experts);
  for (auto& x : b.logits) x = nd(rng);
  return b;
}

// The single-rank layer's output for the whole batch, as fp32.
std::vector<float> whole_layer(const MoeSpec& s, const MoeWeights& full, Batch& b) {
  const Environment env = Environment::cpu_only();
  LayerOptions o;
  o.backend = "reference";
  o.environment = &env;
  MoeSpec one = s;
  one.ep_size = one.tp_size = 1;
  one.ep_rank = one.tp_rank = 0;
  one.max_tokens = std::max<int64_t>(b.total, 1);
  auto layer = MoeLayer::create(one, full, o);
  std::vector<uint8_t> out(b.hidden.size());
  ForwardArgs a;
  a.hidden = host_view(b.hidden.data(), s.act_dtype, {b.total, s.hidden});
  a.router_logits = host_view(b.logits.data(), DType::kFloat32, {b.total, s.num_experts});
  a.output = host_view(out.data(), s.act_dtype, {b.total, s.hidden});
  layer->forward(a);
  std::vector<float> f(b.total * s.hidden);
  view_to_f32(a.output, f.data());
  return f;
}

// A rank that fails alone leaves the others waiting: 10 s, not a hung test.
std::vector<std::shared_ptr<comm::Communicator>> shared_world(int n) {
  comm::HostWorldOptions o;
  o.timeout = std::chrono::seconds(10);
  std::vector<std::shared_ptr<comm::Communicator>> out;
  for (auto& c : comm::make_host_world(n, o)) out.emplace_back(std::move(c));
  return out;
}

// Runs every rank's EP layer on its slice of the batch; returns the outputs as fp32 and each
// rank's chosen strategy.
std::vector<float> ep_layer(const MoeSpec& s, const MoeWeights& full, Batch& b, int world,
                            const std::string& strategy, std::vector<EpStrategy>* chosen,
                            std::vector<EpForwardStats>* stats = nullptr) {
  std::vector<EpForwardStats> own_stats;
  if (stats == nullptr) stats = &own_stats;
  stats->assign(world, EpForwardStats{});
  const Environment env = Environment::cpu_only();
  auto comms = shared_world(world);
  std::vector<float> got(b.total * s.hidden, NAN);
  chosen->assign(world, EpStrategy::kAllToAllLowLatency);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        EpLayerOptions o;
        o.backend = "reference";
        o.strategy = strategy;
        o.environment = &env;
        const MoeWeights local = shard_weights(comm::spec_for_rank(s, r, world), full);
        auto layer = EpLayer::create(s, local, comms[r], o);
        (*chosen)[r] = layer->strategy();
        int64_t first = 0;
        for (int q = 0; q < r; ++q) first += b.tokens_of[q];
        const int64_t T = b.tokens_of[r];
        const size_t esz = dtype_size(s.act_dtype);
        std::vector<uint8_t> out(T * s.hidden * esz);
        ForwardArgs a;
        a.hidden = host_view(b.hidden.data() + first * s.hidden * esz, s.act_dtype, {T, s.hidden});
        a.router_logits =
            host_view(b.logits.data() + first * s.num_experts, DType::kFloat32, {T, s.num_experts});
        a.output = host_view(out.data(), s.act_dtype, {T, s.hidden});
        layer->forward(a);
        layer->forward(a);  // twice: the buffers are reused
        (*stats)[r] = layer->last_forward_stats();
        view_to_f32(a.output, got.data() + first * s.hidden);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return got;
}

// The unsharded layer's weights (make_random_weights of a sharded spec gives one shard).
MoeWeights full_weights(MoeSpec s, uint64_t seed) {
  s.ep_size = s.tp_size = 1;
  s.ep_rank = s.tp_rank = 0;
  return quant::make_random_weights(s, seed);
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Case {
  std::string name;
  MoeSpec spec;
  double tol;  // fp32: the sums' order only; bf16 / fp16: each rank's partial rounded once more
};

std::vector<Case> cases() {
  MoeSpec base = test::small_fp32_spec(16, 4, 64, 32);
  base.max_tokens = 16;
  std::vector<Case> c;
  c.push_back({"fp32_softmax", base, 1e-5});
  MoeSpec ds = base;
  ds.act_dtype = DType::kBFloat16;
  ds.weights.format = WeightFormat::kBF16;
  test::set_deepseek_v3_routing(ds, 4, 2);
  ds.fc1_bias = ds.fc2_bias = true;
  c.push_back({"bf16_deepseek_biases", ds, 1e-2});
  MoeSpec in = base;
  in.act_dtype = DType::kFloat16;
  in.weights.format = WeightFormat::kFP16;
  in.routing.method = RoutingMethod::kLlama4;
  in.routing.weight_placement = RouterWeightPlacement::kInput;
  c.push_back({"fp16_weight_on_input", in, 2e-3});
  return c;
}

TEST(EpLayer, EveryWorldSizeAndStrategyEqualsTheSingleRankLayer) {
  uint32_t seed = 41;
  for (const Case& c : cases()) {
    const MoeWeights full = quant::make_random_weights(c.spec, seed);
    for (int world : {1, 2, 4, 8}) {
      MoeSpec s = c.spec;
      s.ep_size = world;
      Batch b = make_batch(s, world, seed++);
      const std::vector<float> want = whole_layer(s, full, b);
      for (const std::string strategy : {"auto", "all_to_all", "all_gather_reduce_scatter"}) {
        SCOPED_TRACE(c.name + " world " + std::to_string(world) + " " + strategy);
        std::vector<EpStrategy> chosen;
        const std::vector<float> got = ep_layer(s, full, b, world, strategy, &chosen);
        const EpStrategy expected =
            strategy == "auto" ? EpStrategy::kAllToAll : *ep_strategy_from_string(strategy);
        for (EpStrategy e : chosen) EXPECT_EQ(e, expected);
        EXPECT_LT(rel_err(got, want), c.tol);
      }
    }
  }
}

TEST(EpLayer, BytesMovedBalanceAcrossRanks) {
  MoeSpec s = cases()[0].spec;
  const MoeWeights full = full_weights(s, 5);
  for (int world : {1, 2, 4}) {
    s.ep_size = world;
    Batch b = make_batch(s, world, 5);
    for (const std::string strategy : {"all_to_all", "all_gather_reduce_scatter"}) {
      SCOPED_TRACE(strategy + " world " + std::to_string(world));
      std::vector<EpStrategy> chosen;
      std::vector<EpForwardStats> stats;
      ep_layer(s, full, b, world, strategy, &chosen, &stats);
      int64_t sent = 0, received = 0, rows = 0;
      for (const EpForwardStats& st : stats) {
        sent += st.bytes_sent;
        received += st.bytes_received;
        rows += st.rows_computed;
        EXPECT_GE(st.dispatch_ms, 0.0);
      }
      EXPECT_EQ(sent, received);  // what leaves one rank arrives at another
      if (world == 1) EXPECT_EQ(sent, 0);
      if (strategy == "all_to_all") {
        // Each token's row runs once per rank holding one of its experts: between 1 and k times.
        EXPECT_GE(rows, b.total);
        EXPECT_LE(rows, b.total * s.top_k);
      }
    }
  }
}

TEST(EpLayer, TensorParallelInsideEpGroupsFallsBackToAllGather) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 2;
  s.tp_size = 2;
  const MoeWeights full = full_weights(s, 7);
  Batch b = make_batch(s, 4, 7);
  const std::vector<float> want = whole_layer(s, full, b);
  std::vector<EpStrategy> chosen;
  const std::vector<float> got = ep_layer(s, full, b, 4, "auto", &chosen);
  for (EpStrategy e : chosen) EXPECT_EQ(e, EpStrategy::kAllGatherReduceScatter);
  EXPECT_LT(rel_err(got, want), 1e-5);
}

// Builds one EP layer per rank with per-rank changes; returns each rank's error code.
std::vector<ErrorCode> build_all(
    int world, const MoeSpec& spec, const MoeWeights& full,
    const std::function<void(int, MoeWeights&, EpLayerOptions&, Environment&)>& change) {
  auto comms = shared_world(world);
  std::vector<ErrorCode> codes(world, ErrorCode::kOk);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Environment env = Environment::cpu_only();
      EpLayerOptions o;
      o.backend = "reference";
      o.environment = &env;
      try {
        MoeSpec placed = spec;
        if (static_cast<int64_t>(spec.ep_size) * spec.tp_size == world)
          placed = comm::spec_for_rank(spec, r, world);
        MoeWeights w = shard_weights(placed, full);
        change(r, w, o, env);
        EpLayer::create(spec, w, comms[r], o);
      } catch (const Error& e) {
        codes[r] = e.code();
      }
    });
  }
  for (auto& t : threads) t.join();
  return codes;
}

TEST(EpLayer, ForcedIneligibleStrategyFailsOnEveryRankBeforeAllocation) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 2;
  const MoeWeights full = full_weights(s, 3);
  const uint64_t before = registry::engines_created();
  const auto codes = build_all(2, s, full, [](int, MoeWeights&, EpLayerOptions& o, Environment&) {
    o.strategy = "all_to_all_low_latency";
  });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kUnsupported, ErrorCode::kUnsupported}));
  EXPECT_EQ(registry::engines_created(), before);
}

TEST(EpLayer, DifferingEnvironmentsFailOnEveryRank) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 2;
  const MoeWeights full = full_weights(s, 3);
  const uint64_t before = registry::engines_created();
  const auto codes =
      build_all(2, s, full, [](int r, MoeWeights&, EpLayerOptions&, Environment& env) {
        if (r == 1) env.library_version = "0.0.1-other";
      });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kComm, ErrorCode::kComm}));
  EXPECT_EQ(registry::engines_created(), before);
}

TEST(EpLayer, DifferingStrategiesFailOnEveryRank) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 2;
  const MoeWeights full = full_weights(s, 3);
  const auto codes = build_all(2, s, full, [](int r, MoeWeights&, EpLayerOptions& o, Environment&) {
    if (r == 1) o.strategy = "all_gather_reduce_scatter";
  });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kComm, ErrorCode::kComm}));
}

TEST(EpLayer, ALayoutThatDoesNotFitTheWorldFailsOnEveryRank) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 4;  // in a world of 2
  const MoeWeights full = full_weights(s, 3);
  const auto codes = build_all(2, s, full, [](int, MoeWeights&, EpLayerOptions&, Environment&) {});
  EXPECT_EQ(codes,
            (std::vector<ErrorCode>{ErrorCode::kInvalidArgument, ErrorCode::kInvalidArgument}));
}

TEST(EpLayer, WeightsRefusedOnOneRankFailEveryRank) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 2;
  const MoeWeights full = full_weights(s, 3);
  const uint64_t before = registry::engines_created();
  const auto codes = build_all(2, s, full, [](int r, MoeWeights& w, EpLayerOptions&, Environment&) {
    if (r == 1) w.fc2_bias.assign(5, 0.0f);  // the spec has no FC2 bias
  });
  EXPECT_EQ(codes[0], ErrorCode::kComm);
  EXPECT_EQ(codes[1], ErrorCode::kInvalidArgument);
  EXPECT_EQ(registry::engines_created(), before);
}

// A world of one rank: the reference behind an EP layer.
std::unique_ptr<EpLayer> one_rank_layer(const MoeSpec& s, const MoeWeights& full,
                                        std::shared_ptr<comm::Communicator> comm) {
  static const Environment env = Environment::cpu_only();
  EpLayerOptions o;
  o.backend = "reference";
  o.environment = &env;
  return EpLayer::create(s, full, std::move(comm), o);
}

TEST(EpLayer, UnknownNamesAndAMissingCommunicatorAreRefused) {
  MoeSpec s = cases()[0].spec;
  s.ep_size = 2;
  const MoeWeights full = full_weights(s, 3);
  auto codes = build_all(
      2, s, full, [](int, MoeWeights&, EpLayerOptions& o, Environment&) { o.strategy = "ring"; });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kNotFound, ErrorCode::kNotFound}));
  codes = build_all(2, s, full, [](int r, MoeWeights&, EpLayerOptions& o, Environment&) {
    if (r == 0) o.backend = "no.such.implementation";
  });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kNotFound, ErrorCode::kComm}));
  try {
    EpLayer::create(cases()[0].spec, full_weights(cases()[0].spec, 3), nullptr);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(EpLayer, ReleaseTwiceIsHarmlessAndTheCommunicatorStaysTheCallers) {
  MoeSpec s = cases()[0].spec;
  const MoeWeights full = full_weights(s, 3);
  auto comms = shared_world(1);
  auto layer = one_rank_layer(s, full, comms[0]);
  layer->release();
  layer->release();
  EXPECT_TRUE(layer->released());
  std::vector<uint8_t> h(s.hidden * 4), out(s.hidden * 4);
  std::vector<float> logits(s.num_experts);
  ForwardArgs a;
  a.hidden = host_view(h.data(), s.act_dtype, {1, s.hidden});
  a.router_logits = host_view(logits.data(), DType::kFloat32, {1, s.num_experts});
  a.output = host_view(out.data(), s.act_dtype, {1, s.hidden});
  try {
    layer->forward(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(comms[0]->state(), comm::Communicator::State::kLive);
}

TEST(EpLayer, ForwardValidatesItsViews) {
  MoeSpec s = cases()[0].spec;
  const MoeWeights full = full_weights(s, 3);
  auto comms = shared_world(1);
  auto layer = one_rank_layer(s, full, comms[0]);
  const int64_t T = s.max_tokens + 1;
  std::vector<float> h(T * s.hidden), out(T * s.hidden), logits(T * s.num_experts);
  ForwardArgs a;
  a.hidden = host_view(h.data(), s.act_dtype, {T, s.hidden});
  a.router_logits = host_view(logits.data(), DType::kFloat32, {T, s.num_experts});
  a.output = host_view(out.data(), s.act_dtype, {T, s.hidden});
  auto code = [&] {
    try {
      layer->forward(a);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kOk;
  };
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);  // tokens past max_tokens
  a.hidden.shape[0] = a.output.shape[0] = a.router_logits.shape[0] = 2;
  EXPECT_EQ(code(), ErrorCode::kOk);
  a.router_logits.shape[1] = 3;
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);
  a.router_logits.shape[1] = s.num_experts;
  a.output.dtype = DType::kBFloat16;
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);
  a.output.dtype = s.act_dtype;
  a.hidden.device = Device::kCuda;  // GPU views for host experts
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);
  a.hidden.device = Device::kHost;
  EXPECT_EQ(code(), ErrorCode::kOk);
  // The host path reports bad ids from forward() itself: nothing is left for poll_errors().
  EXPECT_TRUE(layer->poll_errors().ok());
  layer->release();
  EXPECT_EQ(layer->poll_errors().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace moekit
