// EpLayer's device path over NCCL against the CPU reference of the whole layer: a world of one
// GPU (ncclCommInitAll over device 0: NCCL then sends to itself), and, where at least two GPUs
// are visible, one rank per GPU (a thread each) with uneven tokens (one rank has none). Every
// strategy (both all-to-all forms and the all-gather fallback, forced by name), caller ids and
// routing on the device; bad caller ids dropped and reported by poll_errors(); the fixed-size
// forms replayed from a CUDA graph; every token on the same experts (each local expert takes
// every row a rank can receive); TP inside EP groups (two ranks per EP group: the all-gather,
// two GPUs or more); a device_index other than the communicator's GPU refused. Outputs are
// poisoned first and inputs fresh random; the all-gather's fp32 sums come in NCCL's order, so
// every strategy is held to the same tolerance against the reference, not bit for bit. Skips
// without a GPU or without NCCL in the build (and, for several ranks, with fewer GPUs). A host
// file, as the NCCL communicator's test is: CUDA builds only, and outside the compute-sanitizer
// step's suites (tests/*/*_test.cu), which check the dispatch kernels themselves
// (dispatch_kernels_test.cu) but not NCCL.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "moekit/ep.hpp"
#include "support/engine_check.hpp"
#ifdef MOEKIT_WITH_NCCL
#include <nccl.h>
#endif

namespace moekit {
namespace {

#ifdef MOEKIT_WITH_NCCL

using devtest::DeviceBuffer;

class EpLayerDevice : public devtest::GpuTest {
 protected:
  // ncclCommInitAll over GPUs 0 .. n-1; skips where fewer are visible.
  bool init_world(int n) {
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < n) {
      skip_reason_ = "expert parallelism over " + std::to_string(n) + " ranks needs " +
                     std::to_string(n) + " visible GPUs; " + std::to_string(visible) + " visible";
      return false;
    }
    comms_.assign(n, nullptr);
    std::vector<int> devices(n);
    for (int i = 0; i < n; ++i) devices[i] = i;
    EXPECT_EQ(ncclCommInitAll(comms_.data(), n, devices.data()), ncclSuccess);
    return true;
  }
  // One rank per visible GPU: at most 8, a multiple of `multiple_of`, at least `fewest` (skips
  // where fewer are visible).
  bool init_visible_world(int fewest, int multiple_of = 1) {
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
    return init_world(std::max(fewest, std::min(visible, 8) / multiple_of * multiple_of));
  }
  void TearDown() override {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  std::vector<ncclComm_t> comms_;
  std::string skip_reason_;
};

MoeSpec ep_spec(RoutingMethod m, int world) {
  MoeSpec s = devtest::engine_spec(16, 4, 256, 128, m, ActivationKind::kSwiGLU);
  s.max_tokens = 64;
  s.ep_size = world;
  return s;
}

const char* const kStrategies[] = {"all_to_all", "all_to_all_low_latency",
                                   "all_gather_reduce_scatter"};

// The whole layer's weights (ep_size and tp_size 1) and the batch of every rank.
devtest::Layer whole_layer(const MoeSpec& s, uint64_t seed) {
  MoeSpec one = s;
  one.ep_size = one.tp_size = 1;
  return devtest::make_engine_layer(
      one, seed, [](const MoeSpec&, const MoeWeights&) { return std::unique_ptr<Engine>(); });
}

// One rank's slice of the batch on its GPU, the output poisoned.
struct RankInputs {
  DeviceBuffer hidden, logits, ids, weights, out;
  ForwardArgs args;
  RankInputs(const MoeSpec& s, const devtest::Inputs& in, int64_t first, int64_t T, int device,
             cudaStream_t stream) {
    const int64_t H = s.hidden, E = s.num_experts, k = s.top_k;
    auto slice = [&](const auto& v, int64_t width) {
      using V = typename std::decay_t<decltype(v)>::value_type;
      return std::vector<V>(v.begin() + first * width, v.begin() + (first + T) * width);
    };
    hidden = devtest::to_device(slice(in.hidden_bits, H));
    out = DeviceBuffer(static_cast<size_t>(T * H) * 2);
    out.poison();
    args.hidden = cuda_view(hidden.ptr, s.act_dtype, {T, H}, device);
    args.output = cuda_view(out.ptr, s.act_dtype, {T, H}, device);
    if (s.routing.method == RoutingMethod::kExternal) {
      ids = devtest::to_device(slice(in.device_ids, k));
      weights = devtest::to_device(slice(in.device_weights, k));
      args.topk_ids = cuda_view(ids.ptr, DType::kInt32, {T, k}, device);
      args.topk_weights = cuda_view(weights.ptr, DType::kFloat32, {T, k}, device);
    } else {
      logits = devtest::to_device(slice(in.logits, E));
      args.router_logits = cuda_view(logits.ptr, DType::kFloat32, {T, E}, device);
    }
    args.stream = stream;
  }
};

enum class Run { kEager, kGraph };

// Every rank's EpLayer on its tokens (rank r on GPU r, tokens_of[r] consecutive tokens); returns
// the outputs in token order and the errors each rank polled.
std::vector<uint16_t> run_world(std::vector<ncclComm_t>& comms, const MoeSpec& s,
                                const devtest::Layer& whole, const devtest::Inputs& in,
                                const std::vector<int64_t>& tokens_of, const std::string& strategy,
                                Run mode, std::vector<Status>* polled = nullptr) {
  const int n = static_cast<int>(comms.size());
  std::vector<uint16_t> out(in.hidden_bits.size(), 0xffff);
  std::vector<Status> statuses(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        cudaStream_t stream = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        std::shared_ptr<comm::Communicator> comm = comm::wrap_nccl(comms[r], r);
        EpLayerOptions o;
        o.strategy = strategy;
        o.device_index = r;
        const MoeWeights shard = shard_weights(comm::spec_for_rank(s, r, n), whole.local);
        auto layer = EpLayer::create(s, shard, comm, o);
        EXPECT_EQ(std::string(to_string(layer->strategy())), strategy);
        int64_t first = 0;
        for (int q = 0; q < r; ++q) first += tokens_of[q];
        const int64_t T = tokens_of[r];
        RankInputs ri(s, in, first, T, r, stream);
        layer->forward(ri.args);  // eager first: what a graph is captured after
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        if (mode == Run::kGraph) {
          cudaGraph_t graph = nullptr;
          cudaGraphExec_t exec = nullptr;
          ri.out.poison();
          ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
          layer->forward(ri.args);
          ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
          ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
          ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
        }
        statuses[r] = layer->poll_errors();
        const auto got = devtest::to_host<uint16_t>(ri.out.ptr, static_cast<size_t>(T * s.hidden));
        std::copy(got.begin(), got.end(), out.begin() + first * s.hidden);
        layer->release();
        layer->release();                                            // twice: harmless
        EXPECT_EQ(comm->state(), comm::Communicator::State::kLive);  // the caller's
        cudaStreamDestroy(stream);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  if (polled != nullptr) *polled = statuses;
  return out;
}

int64_t total_of(const std::vector<int64_t>& tokens_of) {
  int64_t total = 0;
  for (int64_t t : tokens_of) total += t;
  return total;
}

std::vector<int64_t> uneven_tokens(int n) {
  std::vector<int64_t> t;
  for (int r = 0; r < n; ++r) t.push_back(n > 1 && r == 1 ? 0 : (13 * r + 37) % 64 + 1);
  return t;
}

void check_world(std::vector<ncclComm_t>& comms, uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  std::mt19937_64 rng(seed);
  for (RoutingMethod m : {RoutingMethod::kExternal, RoutingMethod::kSoftmaxTopK}) {
    const MoeSpec s = ep_spec(m, n);
    const devtest::Layer whole = whole_layer(s, rng());
    const std::vector<int64_t> tokens_of = uneven_tokens(n);
    const int64_t total = total_of(tokens_of);
    for (const char* strategy : kStrategies) {
      SCOPED_TRACE(testing::Message()
                   << "world " << n << ", " << strategy << ", " << devtest::describe(s));
      const devtest::Inputs in = devtest::make_inputs(whole, total, devtest::ids_for(s), rng);
      std::vector<Status> polled;
      const auto out = run_world(comms, s, whole, in, tokens_of, strategy, Run::kEager, &polled);
      devtest::expect_close(s, out, devtest::reference_out(whole, in), devtest::tolerance(s));
      for (int r = 0; r < n; ++r) EXPECT_TRUE(polled[r].ok()) << polled[r].message();
    }
  }
}

TEST_F(EpLayerDevice, OneGpuWorldEqualsTheReference) {
  if (!init_world(1)) GTEST_SKIP() << skip_reason_;
  check_world(comms_, devtest::base_seed() + 10);
}

TEST_F(EpLayerDevice, OneRankPerGpuEqualsTheReference) {
  if (!init_visible_world(2)) GTEST_SKIP() << skip_reason_;
  check_world(comms_, devtest::base_seed() + 11);
}

TEST_F(EpLayerDevice, FixedSizeFormsReplayFromACudaGraph) {
  if (!init_visible_world(1)) GTEST_SKIP() << skip_reason_;
  const int n = static_cast<int>(comms_.size());
  std::mt19937_64 rng(devtest::base_seed() + 12);
  const MoeSpec s = ep_spec(RoutingMethod::kSoftmaxTopK, n);
  const devtest::Layer whole = whole_layer(s, rng());
  const std::vector<int64_t> tokens_of = uneven_tokens(n);
  const int64_t total = total_of(tokens_of);
  for (const char* strategy : {"all_to_all_low_latency", "all_gather_reduce_scatter"}) {
    SCOPED_TRACE(strategy);
    const devtest::Inputs in = devtest::make_inputs(whole, total, devtest::Ids::kRouted, rng);
    const auto out = run_world(comms_, s, whole, in, tokens_of, strategy, Run::kGraph);
    devtest::expect_close(s, out, devtest::reference_out(whole, in), devtest::tolerance(s));
  }
}

// Every token of every rank, max_tokens on each, picks the same k experts: each of them gets
// every row a rank can receive (the masked layout's lossless capacity), which the local layer
// runs whole; nothing is dropped.
TEST_F(EpLayerDevice, EveryTokenOnTheSameExpertsIsComputedWhole) {
  if (!init_visible_world(1)) GTEST_SKIP() << skip_reason_;
  const int n = static_cast<int>(comms_.size());
  std::mt19937_64 rng(devtest::base_seed() + 15);
  const MoeSpec s = ep_spec(RoutingMethod::kExternal, n);
  const devtest::Layer whole = whole_layer(s, rng());
  const std::vector<int64_t> tokens_of(n, s.max_tokens);
  for (const char* strategy : kStrategies) {
    SCOPED_TRACE(strategy);
    const devtest::Inputs in =
        devtest::make_inputs(whole, n * s.max_tokens, devtest::Ids::kSameForAll, rng);
    std::vector<Status> polled;
    const auto out = run_world(comms_, s, whole, in, tokens_of, strategy, Run::kEager, &polled);
    devtest::expect_close(s, out, devtest::reference_out(whole, in), devtest::tolerance(s));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(polled[r].ok()) << polled[r].message();
  }
}

// Two TP ranks per EP group (ranks 2g and 2g + 1 hold EP shard g, half the intermediate each;
// FC2's bias on TP rank 0 only): the all-gather runs every gathered token on every rank and the
// reduce-scatter sums experts and TP halves alike. auto chooses it (the all-to-all forms refuse
// TP with kTensorParallel: ep_strategy_test).
TEST_F(EpLayerDevice, TensorParallelInsideEpGroupsEqualsTheReference) {
  if (!init_visible_world(2, /*multiple_of=*/2)) GTEST_SKIP() << skip_reason_;
  const int n = static_cast<int>(comms_.size());
  std::mt19937_64 rng(devtest::base_seed() + 16);
  for (RoutingMethod m : {RoutingMethod::kExternal, RoutingMethod::kSoftmaxTopK}) {
    MoeSpec s = devtest::engine_spec(16, 4, 256, 256, m, ActivationKind::kSwiGLU);
    s.max_tokens = 64;
    s.fc1_bias = s.fc2_bias = true;
    s.tp_size = 2;
    s.ep_size = n / 2;
    SCOPED_TRACE(devtest::describe(s));
    const devtest::Layer whole = whole_layer(s, rng());
    const std::vector<int64_t> tokens_of = uneven_tokens(n);
    const int64_t total = total_of(tokens_of);
    const devtest::Inputs in = devtest::make_inputs(whole, total, devtest::ids_for(s), rng);
    std::vector<Status> polled;
    const auto out = run_world(comms_, s, whole, in, tokens_of, "all_gather_reduce_scatter",
                               Run::kEager, &polled);
    devtest::expect_close(s, out, devtest::reference_out(whole, in), devtest::tolerance(s));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(polled[r].ok()) << polled[r].message();
  }
}

TEST_F(EpLayerDevice, BadCallerIdsAreDroppedAndReported) {
  if (!init_world(1)) GTEST_SKIP() << skip_reason_;
  std::mt19937_64 rng(devtest::base_seed() + 13);
  const MoeSpec s = ep_spec(RoutingMethod::kExternal, 1);
  const devtest::Layer whole = whole_layer(s, rng());
  const int64_t T = 9, k = s.top_k, E = s.num_experts;
  for (const char* strategy : kStrategies) {
    SCOPED_TRACE(strategy);
    devtest::Inputs in = devtest::make_inputs(whole, T, devtest::Ids::kRandom, rng);
    in.device_ids[2 * k + 1] = static_cast<int32_t>(E);  // the first bad one: token 2, slot 1
    in.device_ids[5 * k + 0] = -3;
    devtest::drop_slot_in_reference(in, k, 2, 1);
    devtest::drop_slot_in_reference(in, k, 5, 0);
    std::vector<Status> polled;
    const auto out = run_world(comms_, s, whole, in, {T}, strategy, Run::kEager, &polled);
    devtest::expect_close(s, out, devtest::reference_out(whole, in), devtest::tolerance(s));
    EXPECT_EQ(polled[0].code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(polled[0].message().find("[2, 1]"), std::string::npos) << polled[0].message();
    EXPECT_NE(polled[0].message().find(std::to_string(E)), std::string::npos)
        << polled[0].message();
  }
}

TEST_F(EpLayerDevice, BadViewsAreRefused) {
  if (!init_world(1)) GTEST_SKIP() << skip_reason_;
  std::mt19937_64 rng(devtest::base_seed() + 14);
  const MoeSpec s = ep_spec(RoutingMethod::kSoftmaxTopK, 1);
  const devtest::Layer whole = whole_layer(s, rng());
  const devtest::Inputs in = devtest::make_inputs(whole, 4, devtest::Ids::kRouted, rng);
  std::shared_ptr<comm::Communicator> comm = comm::wrap_nccl(comms_[0], 0);
  auto layer = EpLayer::create(s, whole.local, comm, {});
  RankInputs ri(s, in, 0, 4, 0, nullptr);
  auto code = [&](const ForwardArgs& a) {
    try {
      layer->forward(a);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kOk;
  };
  std::vector<uint16_t> host(4 * s.hidden);
  ForwardArgs a = ri.args;
  a.hidden = host_view(host.data(), s.act_dtype, {4, s.hidden});  // host memory
  EXPECT_EQ(code(a), ErrorCode::kInvalidArgument);
  a = ri.args;
  a.router_logits.shape[1] = s.num_experts - 1;
  EXPECT_EQ(code(a), ErrorCode::kInvalidArgument);
  a = ri.args;
  a.output.dtype = DType::kFloat16;
  EXPECT_EQ(code(a), ErrorCode::kInvalidArgument);
  a = ri.args;
  a.hidden.shape[0] = a.output.shape[0] = a.router_logits.shape[0] = s.max_tokens + 1;
  EXPECT_EQ(code(a), ErrorCode::kInvalidArgument);  // past max_tokens
  EXPECT_EQ(code(ri.args), ErrorCode::kOk);         // the views as they were still run
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(layer->poll_errors().ok());
}

TEST_F(EpLayerDevice, ADeviceIndexOtherThanTheCommunicatorsIsRefused) {
  if (!init_world(1)) GTEST_SKIP() << skip_reason_;
  const MoeSpec s = ep_spec(RoutingMethod::kSoftmaxTopK, 1);
  const devtest::Layer whole = whole_layer(s, 5);
  std::shared_ptr<comm::Communicator> comm = comm::wrap_nccl(comms_[0], 0);
  EpLayerOptions o;
  o.device_index = 1;
  try {
    EpLayer::create(s, whole.local, comm, o);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("device_index 1"), std::string::npos) << e.what();
  }
}

#else

TEST(EpLayerDevice, NeedsNccl) { GTEST_SKIP() << "this build of moekit has no NCCL"; }

#endif

}  // namespace
}  // namespace moekit
