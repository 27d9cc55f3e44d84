// Expert parallelism as a capability of the layer: communication strategies declared as data,
// chosen with a report (or forced, and refused with a reason before anything is allocated),
// checked for consistency across ranks, and composed with any local implementation:
// dispatch -> local experts (a MoeLayer) -> combine.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/comm.hpp"
#include "moekit/layer.hpp"

namespace moekit {

enum class EpStrategy : int {
  // Fixed capacity per expert, masked layout, no host sync, CUDA-graph capturable (decode).
  kAllToAllLowLatency = 1,
  // Each token's row goes once to every rank holding one of its experts; results come back
  // to the token's rank and are summed there (prefill).
  kAllToAll = 2,
  // Every rank gathers every token, computes its experts' share of all of them, and a
  // reduce-scatter sums each token's shares on its rank. The fallback: it runs wherever the
  // others cannot (TP inside EP groups included), moving world_size times the rows.
  kAllGatherReduceScatter = 3,
};
// "all_to_all_low_latency", "all_to_all", "all_gather_reduce_scatter".
const char* to_string(EpStrategy s);
std::optional<EpStrategy> ep_strategy_from_string(std::string_view s);

// Why a strategy cannot run (closed list; tests assert on these).
enum class EpRejectReason : int {
  kTransport = 1,       // the communicator cannot run it (e.g. no CUDA-graph capture)
  kBuild = 2,           // this build lacks its kernels for the layer's device
  kWorldSize = 3,       // more ranks than it supports
  kTokens = 4,          // max_tokens per rank past its capacity bound
  kTensorParallel = 5,  // tp_size > 1 (TP ranks inside an EP group)
};
const char* to_string(EpRejectReason r);

// What a strategy supports, as data (ep_strategies(), highest priority first).
struct EpStrategyCapability {
  EpStrategy strategy = EpStrategy::kAllGatherReduceScatter;
  bool host = false;                 // runs with host implementations over the host transport
  bool device = false;               // its device kernels are built (GPU implementations over NCCL)
  bool needs_graph_capture = false;  // needs a CUDA-graph capturable transport
  bool tensor_parallel = false;      // handles tp_size > 1
  int max_world_size = 0;            // 0: no limit
  int64_t max_tokens_per_rank = 0;   // 0: no limit
};
const std::vector<EpStrategyCapability>& ep_strategies();

// What the choice reads: nothing else (no device queries, no environment variables).
struct EpContext {
  int world_size = 1;
  int tp_size = 1;
  Device device = Device::kHost;  // where the local implementation runs
  bool transport_graph_capturable = false;
  int64_t max_tokens = 0;  // per rank
};

struct EpRejection {
  EpRejectReason reason;
  std::string sentence;  // with the values
};
struct EpCandidate {
  EpStrategy strategy;
  bool eligible = false, chosen = false;
  std::optional<EpRejection> rejection;
};
struct EpSelection {
  std::string request;                  // "auto" or a strategy name
  std::optional<EpStrategy> chosen;     // none: nothing eligible (or the forced one is not)
  std::vector<EpCandidate> candidates;  // every strategy, in priority order
  bool ok() const { return chosen.has_value(); }
  std::string table() const;  // human-readable report
};

// The strategy's eligibility in `ctx`: the first failing rule in the order of EpRejectReason.
std::optional<EpRejection> ep_reject(const EpStrategyCapability& cap, const EpContext& ctx);
// "auto": the highest-priority eligible strategy. A strategy name: that one, or not ok with its
// rejection in candidates. An unknown name throws Error(kNotFound) naming it.
EpSelection select_ep_strategy(const EpContext& ctx, const std::string& request);

// What this rank's last forward did. Times are the host clock around each stage on the host
// path (it runs them synchronously); on the device path CUDA events between the stages where
// EpLayerOptions::time_stages asks for them (else, and inside a CUDA-graph capture, 0). Bytes are
// those that crossed to or from other ranks, every collective's payload counted (counts, rows, ids,
// weights, results), what a rank keeps for itself not counted; the fixed-size forms (the
// low-latency one, the all-gather on the device, padded to max_tokens; on the host to the
// largest rank's tokens) count their segments, padding included.
struct EpForwardStats {
  double dispatch_ms = 0, experts_ms = 0, combine_ms = 0;
  int64_t rows_computed = 0;  // rows the local experts ran (received, or gathered with padding)
  int64_t bytes_sent = 0, bytes_received = 0;
};

struct EpLayerOptions {
  std::string backend = "auto";   // the local layer's implementation (LayerOptions::backend)
  std::string strategy = "auto";  // "auto" or an EpStrategy name
  int device_index = 0;           // GPU of a device local layer (the communicator's)
  const Environment* environment = nullptr;  // null: Environment::detected()
  // Device path: record events between dispatch, experts and combine, and wait for the last
  // one at the end of forward() to fill EpForwardStats' times (outside a CUDA-graph capture;
  // the benchmark's mode). Off: forward() adds no wait of its own.
  bool time_stages = false;
};

// One rank's share of an expert-parallel layer. Every rank of the communicator's world builds
// one, and calls forward() the same number of times (each with its own tokens, 0 included).
class EpLayer {
 public:
  // spec: the whole layer, ep_size * tp_size == comm->world_size() (comm::spec_for_rank places
  // this rank; ep_rank / tp_rank are taken from comm->rank()). weights: this rank's shard
  // (shard_weights(comm::spec_for_rank(spec, rank, world), full)), routing_bias global.
  //
  // Collective. Before allocating anything every rank validates the spec and layout, chooses
  // the strategy and resolves the local implementation; then all ranks exchange their verdict,
  // strategy, implementation id, spec and environment fingerprint once. A failure on any rank,
  // or any difference, throws on every rank: the failing rank its own Error, the others
  // Error(kComm) naming the rank and its sentence (kComm also names a differing field with both
  // values). A forced strategy that is not eligible is Error(kUnsupported) with its reason; a
  // GPU implementation with options.device_index other than the communicator's GPU is
  // Error(kInvalidArgument). A rank whose local layer or device buffers then fail to build
  // (weights, GPU memory) makes every rank throw the same way, and what was built is released.
  static std::unique_ptr<EpLayer> create(const MoeSpec& spec, const MoeWeights& weights,
                                         std::shared_ptr<comm::Communicator> comm,
                                         const EpLayerOptions& options = {});

  // Collective. hidden [T, H], output [T, H] act_dtype; routing as ForwardArgs (router_logits
  // [T, E] fp32, or kExternal topk_ids / topk_weights [T, k]). T <= spec.max_tokens on every rank.
  // output is the whole layer's output for this rank's tokens. The all-to-all forms send the
  // partial outputs back to the token's rank in act_dtype, summed there in fp32, rank by rank,
  // then rounded once; all_gather_reduce_scatter sums them in fp32 with the reduce-scatter (on
  // the device in NCCL's order, not rank by rank) and rounds once. Views live where the local
  // implementation runs: host implementations over the host transport, or device ones over
  // NCCL on the communicator's GPU (every strategy either way; builds without CUDA reject the
  // device ones with kBuild). On the device forward() enqueues on args.stream: all_to_all waits
  // once for the row counts (the host sizes the receive); all_to_all_low_latency and
  // all_gather_reduce_scatter move fixed sizes (max_tokens rows per rank), never wait and can be
  // captured in a CUDA graph. Bad caller ids on the device are dropped, never read or written
  // out of bounds, and reported by poll_errors(). Throws Error naming the value; a collective
  // failure is Error(kComm). A peer that dies or stalls never hangs this rank: the row-count wait
  // ends in Error(kComm) after the communicator's timeout, and NCCL collectives nobody waits for
  // are watched by the communicator (comm.hpp), which aborts one moekit created. Collectives
  // captured in a CUDA graph are not watched: after a replay, Communicator::wait(stream) is the
  // bounded way to wait for it.
  void forward(const ForwardArgs& args);

  // Device-side errors of earlier forwards (a caller's expert id outside [0, E) was dropped):
  // waits for the device, then ok or the first one, naming token, slot and value
  // (kInvalidArgument), then the local layer's (it names rows among those this rank received:
  // a slot some rank dropped arrives as id -1, a repeated expert as it was). Host path: ok
  // (forward() threw instead). First of all, a communicator broken by a dead or stalled peer:
  // kComm with its reason (the forwards since it broke are not to be trusted).
  Status poll_errors();

  // Releases the local layer and the buffers; the communicator stays the caller's. Twice is
  // harmless. forward() after release throws Error(kInvalidArgument).
  void release();
  bool released() const { return local_ == nullptr; }

  const MoeSpec& spec() const { return spec_; }  // this rank's (ep_rank / tp_rank set)
  const EpSelection& selection() const { return selection_; }
  EpStrategy strategy() const { return *selection_.chosen; }
  const MoeLayer& local_layer() const { return *local_; }
  const EpForwardStats& last_forward_stats() const { return stats_; }

 private:
  EpLayer() = default;
  void forward_all_to_all(int64_t tokens, const void* hidden, const int32_t* ids,
                          const float* weights, const TensorView& output);
  void forward_all_gather(int64_t tokens, const void* hidden, const int32_t* ids,
                          const float* weights, const TensorView& output);
  void local_forward(int64_t rows, const void* hidden, const int32_t* ids, const float* weights,
                     float* out);
  // The device path (ep_layer_device_cuda.cpp; without CUDA it is never built).
  struct DeviceState;
  struct DeviceStateDeleter {
    void operator()(DeviceState* s) const;
  };
  void create_host_buffers();
  void create_device_state(int device_index);
  void forward_device(const ForwardArgs& args);
  Status poll_device_errors();

  MoeSpec spec_;        // this rank's
  MoeSpec local_spec_;  // the local layer's: kExternal routing, max_tokens for every received row
  EpSelection selection_;
  std::vector<float> routing_bias_;
  std::shared_ptr<comm::Communicator> comm_;
  std::unique_ptr<MoeLayer> local_;
  EpForwardStats stats_;
  bool time_stages_ = false;
  // Host buffers sized at create() from max_tokens x world size.
  std::vector<uint8_t> send_rows_, recv_rows_, partial_rows_;
  std::vector<int32_t> ids_, send_ids_, recv_ids_;
  std::vector<float> weights_, send_weights_, recv_weights_, partial_f32_, returned_f32_, out_f32_;
  // Device buffers, sized the same way, when the local implementation runs on a GPU.
  std::unique_ptr<DeviceState, DeviceStateDeleter> device_;
};

}  // namespace moekit
