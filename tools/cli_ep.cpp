#include "cli_ep.hpp"

#include <chrono>

#include "common/host_activations.hpp"
#include "moekit/ep.hpp"
#include "quant/quant.hpp"

namespace moekit::cli {

EpRunResult run_expert_parallel(const MoeSpec& spec, const LayerOptions& options, uint64_t seed,
                                int64_t tokens, bool check) {
  const Environment& env = options.environment ? *options.environment : Environment::detected();
  const comm::LaunchEnv launch =
      comm::parse_launch_env(comm::process_env(), static_cast<int>(env.gpus.size()));
  MoeSpec rank_spec;
  try {
    rank_spec = comm::spec_for_rank(spec, launch.rank, launch.world_size);
  } catch (const Error& e) {
    if (launch.launcher != comm::Launcher::kNone || e.code() != ErrorCode::kInvalidArgument) throw;
    throw Error(e.code(), std::string(e.what()) +
                              ": start one process per rank, e.g. torchrun "
                              "--nproc-per-node " +
                              std::to_string(spec.ep_size * spec.tp_size) +
                              " moekit run --ep-size " + std::to_string(spec.ep_size) + " ...");
  }
  std::shared_ptr<comm::Communicator> comm = comm::create_nccl(launch, std::chrono::seconds(120));
  EpLayerOptions o;
  o.backend = options.backend;
  o.device_index = launch.local_rank;
  o.environment = &env;
  auto layer = EpLayer::create(spec, quant::make_random_weights(rank_spec, seed), comm, o);

  EpRunResult out;
  out.rank = launch.rank;
  out.world_size = launch.world_size;
  out.strategy = to_string(layer->strategy());
  const HostInputs in = random_inputs(rank_spec, tokens, seed + 1 + launch.rank);
  std::vector<uint8_t> output(in.hidden.size());
  ForwardArgs a;
  a.hidden =
      host_view(const_cast<uint8_t*>(in.hidden.data()), spec.act_dtype, {tokens, spec.hidden});
  a.router_logits = host_view(const_cast<float*>(in.router_logits.data()), DType::kFloat32,
                              {tokens, spec.num_experts});
  a.topk_ids =
      host_view(const_cast<int32_t*>(in.topk_ids.data()), DType::kInt32, {tokens, spec.top_k});
  a.topk_weights =
      host_view(const_cast<float*>(in.topk_weights.data()), DType::kFloat32, {tokens, spec.top_k});
  a.output = host_view(output.data(), spec.act_dtype, {tokens, spec.hidden});
  const auto start = std::chrono::steady_clock::now();
  layer->forward(a);
  out.run.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  out.stats = layer->last_forward_stats();
  out.run.output.resize(tokens * spec.hidden);
  view_to_f32(a.output, out.run.output.data());
  if (check) {
    MoeSpec whole = spec;
    whole.ep_size = whole.tp_size = 1;
    LayerOptions ro = options;
    ro.backend = "reference";
    auto ref_layer = MoeLayer::create(whole, quant::make_random_weights(whole, seed), ro);
    out.reference = run_layer(*ref_layer, in).output;
  }
  layer->release();
  throw_if_error(comm->release());
  return out;
}

}  // namespace moekit::cli
