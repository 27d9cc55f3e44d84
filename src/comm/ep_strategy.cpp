// The expert-parallel strategies' capabilities as data, their eligibility, and the choice.
#include <algorithm>
#include <sstream>

#include "comm/dispatch.hpp"
#include "moekit/ep.hpp"

namespace moekit {

const char* to_string(EpStrategy s) {
  switch (s) {
    case EpStrategy::kAllToAllLowLatency:
      return "all_to_all_low_latency";
    case EpStrategy::kAllToAll:
      return "all_to_all";
    case EpStrategy::kAllGatherReduceScatter:
      return "all_gather_reduce_scatter";
  }
  return "?";
}

std::optional<EpStrategy> ep_strategy_from_string(std::string_view s) {
  for (EpStrategy e : {EpStrategy::kAllToAllLowLatency, EpStrategy::kAllToAll,
                       EpStrategy::kAllGatherReduceScatter}) {
    if (s == to_string(e)) return e;
  }
  return std::nullopt;
}

const char* to_string(EpRejectReason r) {
  switch (r) {
    case EpRejectReason::kTransport:
      return "transport";
    case EpRejectReason::kBuild:
      return "build";
    case EpRejectReason::kWorldSize:
      return "world_size";
    case EpRejectReason::kTokens:
      return "tokens";
    case EpRejectReason::kTensorParallel:
      return "tensor_parallel";
  }
  return "?";
}

// Every strategy's device kernels (dispatch_kernels.cu) are built with CUDA.
#ifdef MOEKIT_WITH_CUDA
constexpr bool kDeviceKernels = true;
#else
constexpr bool kDeviceKernels = false;
#endif

const std::vector<EpStrategyCapability>& ep_strategies() {
  static const std::vector<EpStrategyCapability> table = [] {
    std::vector<EpStrategyCapability> t;
    EpStrategyCapability ll;
    ll.strategy = EpStrategy::kAllToAllLowLatency;
    ll.device = kDeviceKernels;
    // Masked receive buffers of lossless capacity: local experts x (max tokens x ranks) rows.
    // 256 tokens per rank keeps DeepSeek-V3 over 8 ranks near 1 GiB per GPU.
    ll.needs_graph_capture = true;
    ll.max_tokens_per_rank = 256;
    ll.max_world_size = comm::kMaxDispatchRanks;  // the segment bases in shared memory
    t.push_back(ll);
    EpStrategyCapability a2a;
    a2a.strategy = EpStrategy::kAllToAll;
    a2a.host = true;
    a2a.device = kDeviceKernels;
    // One NCCL send / receive pair per peer in one group; past an NVLink domain's 64 GPUs the
    // group's per-peer connections cost more than gathering.
    a2a.max_world_size = 64;
    t.push_back(a2a);
    EpStrategyCapability ag;
    ag.strategy = EpStrategy::kAllGatherReduceScatter;
    ag.host = true;
    ag.device = kDeviceKernels;
    ag.tensor_parallel = true;
    t.push_back(ag);
    return t;
  }();
  return table;
}

std::optional<EpRejection> ep_reject(const EpStrategyCapability& cap, const EpContext& ctx) {
  const std::string name = to_string(cap.strategy);
  if (cap.needs_graph_capture && !ctx.transport_graph_capturable)
    return EpRejection{EpRejectReason::kTransport,
                       name + " needs a CUDA-graph capturable transport (NCCL); this one is not"};
  const bool built = ctx.device == Device::kHost ? cap.host : cap.device;
  if (!built)
    return EpRejection{EpRejectReason::kBuild,
                       name + " has no " + (ctx.device == Device::kHost ? "host" : "device") +
                           " dispatch / combine in this build"};
  if (cap.max_world_size > 0 && ctx.world_size > cap.max_world_size)
    return EpRejection{EpRejectReason::kWorldSize,
                       name + " runs on at most " + std::to_string(cap.max_world_size) +
                           " ranks, not " + std::to_string(ctx.world_size)};
  if (cap.max_tokens_per_rank > 0 && ctx.max_tokens > cap.max_tokens_per_rank)
    return EpRejection{EpRejectReason::kTokens,
                       name + " holds at most " + std::to_string(cap.max_tokens_per_rank) +
                           " tokens per rank, not max_tokens " + std::to_string(ctx.max_tokens)};
  if (ctx.tp_size > 1 && !cap.tensor_parallel)
    return EpRejection{EpRejectReason::kTensorParallel,
                       name + " sends each row to one rank per EP group; tp_size " +
                           std::to_string(ctx.tp_size) + " needs every TP rank to see it"};
  return std::nullopt;
}

EpSelection select_ep_strategy(const EpContext& ctx, const std::string& request) {
  std::optional<EpStrategy> forced;
  if (request != "auto") {
    forced = ep_strategy_from_string(request);
    if (!forced)
      throw Error(ErrorCode::kNotFound,
                  "unknown EP strategy '" + request +
                      "' (auto, all_to_all_low_latency, all_to_all, all_gather_reduce_scatter)");
  }
  EpSelection sel;
  sel.request = request;
  for (const EpStrategyCapability& cap : ep_strategies()) {
    EpCandidate c;
    c.strategy = cap.strategy;
    c.rejection = ep_reject(cap, ctx);
    c.eligible = !c.rejection.has_value();
    if (c.eligible && !sel.chosen && (!forced || *forced == cap.strategy)) {
      c.chosen = true;
      sel.chosen = cap.strategy;
    }
    sel.candidates.push_back(std::move(c));
  }
  return sel;
}

std::string EpSelection::table() const {
  std::ostringstream o;
  o << "ep strategy request: " << request << "\n";
  for (const EpCandidate& c : candidates) {
    std::string name = to_string(c.strategy);
    name.resize(std::max<size_t>(name.size(), 26), ' ');
    o << "  " << name << "  " << (c.chosen ? "CHOSEN  " : c.eligible ? "eligible" : "rejected");
    if (c.rejection) o << "  " << to_string(c.rejection->reason) << ": " << c.rejection->sentence;
    o << "\n";
  }
  o << "chosen: " << (chosen ? to_string(*chosen) : "none") << "\n";
  return o.str();
}

}  // namespace moekit
