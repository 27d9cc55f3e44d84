#include "cli_ep.hpp"

#include <chrono>

#include "common/host_activations.hpp"
#include "moekit/ep.hpp"
#include "quant/quant.hpp"

namespace moekit::cli {
namespace {

struct EpRank {
  comm::LaunchEnv launch;
  MoeSpec rank_spec;
  std::shared_ptr<comm::Communicator> comm;
  std::unique_ptr<EpLayer> layer;
};

// The launcher's environment, the NCCL communicator and this rank's EpLayer (random shard).
// command: "run" or "bench", for the launcher hint.
EpRank make_ep_rank(const MoeSpec& spec, const LayerOptions& options, const std::string& strategy,
                    uint64_t seed, bool time_stages, const char* command) {
  if (strategy != "auto" && !ep_strategy_from_string(strategy))
    throw Error(ErrorCode::kInvalidArgument,
                "--ep-strategy '" + strategy +
                    "' is not auto, all_to_all_low_latency, all_to_all or "
                    "all_gather_reduce_scatter");
  const Environment& env = options.environment ? *options.environment : Environment::detected();
  EpRank r;
  r.launch = comm::parse_launch_env(comm::process_env(), static_cast<int>(env.gpus.size()));
  try {
    r.rank_spec = comm::spec_for_rank(spec, r.launch.rank, r.launch.world_size);
  } catch (const Error& e) {
    if (r.launch.launcher != comm::Launcher::kNone || e.code() != ErrorCode::kInvalidArgument)
      throw;
    throw Error(e.code(), std::string(e.what()) +
                              ": start one process per rank, e.g. torchrun --no-python "
                              "--nproc-per-node " +
                              std::to_string(spec.ep_size * spec.tp_size) + " moekit " + command +
                              " --ep-size " + std::to_string(spec.ep_size) + " ...");
  }
  r.comm = comm::create_nccl(r.launch, r.launch.comm_timeout);
  EpLayerOptions o;
  o.backend = options.backend;
  o.strategy = strategy;
  o.device_index = r.launch.local_rank;
  o.environment = &env;
  o.time_stages = time_stages;
  r.layer = EpLayer::create(spec, quant::make_random_weights(r.rank_spec, seed), r.comm, o);
  return r;
}

bool on_device(const EpLayer& layer) {
  return layer.local_layer().implementation().device() == Device::kCuda;
}

}  // namespace

double EpBenchRow::link_bytes_per_s() const {
  const double s = (dispatch_us + combine_us) * 1e-6;
  return s > 0 ? static_cast<double>(bytes_sent + bytes_received) / s : 0.0;
}

EpRunResult run_expert_parallel(const MoeSpec& spec, const LayerOptions& options,
                                const std::string& strategy, uint64_t seed, int64_t tokens,
                                bool check) {
  EpRank r = make_ep_rank(spec, options, strategy, seed, /*time_stages=*/false, "run");
  EpLayer& layer = *r.layer;
  EpRunResult out;
  out.rank = r.launch.rank;
  out.world_size = r.launch.world_size;
  out.strategy = to_string(layer.strategy());
  const HostInputs in = random_inputs(r.rank_spec, tokens, seed + 1 + r.launch.rank);
  if (on_device(layer)) {
    out.run = run_ep_layer_on_device(layer, in);
  } else {
    std::vector<uint8_t> output(in.hidden.size());
    ForwardArgs a;
    a.hidden =
        host_view(const_cast<uint8_t*>(in.hidden.data()), spec.act_dtype, {tokens, spec.hidden});
    a.router_logits = host_view(const_cast<float*>(in.router_logits.data()), DType::kFloat32,
                                {tokens, spec.num_experts});
    a.topk_ids =
        host_view(const_cast<int32_t*>(in.topk_ids.data()), DType::kInt32, {tokens, spec.top_k});
    a.topk_weights = host_view(const_cast<float*>(in.topk_weights.data()), DType::kFloat32,
                               {tokens, spec.top_k});
    a.output = host_view(output.data(), spec.act_dtype, {tokens, spec.hidden});
    const auto start = std::chrono::steady_clock::now();
    layer.forward(a);
    out.run.milliseconds =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    out.run.output.resize(tokens * spec.hidden);
    view_to_f32(a.output, out.run.output.data());
  }
  out.stats = layer.last_forward_stats();
  if (check) {
    MoeSpec whole = spec;
    whole.ep_size = whole.tp_size = 1;
    LayerOptions ro = options;
    ro.backend = "reference";
    auto ref_layer = MoeLayer::create(whole, quant::make_random_weights(whole, seed), ro);
    out.reference = run_layer(*ref_layer, in).output;
  }
  layer.release();
  throw_if_error(r.comm->release());
  return out;
}

std::vector<EpBenchRow> bench_expert_parallel(const MoeSpec& spec, const LayerOptions& options,
                                              const std::string& strategy, uint64_t seed,
                                              const std::vector<int64_t>& tokens, int reps) {
  EpRank r = make_ep_rank(spec, options, strategy, seed, /*time_stages=*/true, "bench");
  if (!on_device(*r.layer))
    throw Error(ErrorCode::kUnsupported,
                "moekit bench --ep-size times GPU ranks; this rank's experts run in " +
                    r.layer->local_layer().implementation().id() + " on the host");
  std::vector<EpBenchRow> rows;
  for (int64_t t : tokens) {
    const HostInputs in = random_inputs(r.rank_spec, t, seed + t + 1 + r.launch.rank);
    EpBenchRow row = time_ep_layer_on_device(*r.layer, in, reps);
    row.rank = r.launch.rank;
    row.world_size = r.launch.world_size;
    row.strategy = to_string(r.layer->strategy());
    row.tokens = t;
    rows.push_back(row);
  }
  r.layer->release();
  throw_if_error(r.comm->release());
  return rows;
}

}  // namespace moekit::cli
