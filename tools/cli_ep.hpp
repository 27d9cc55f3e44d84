// `moekit run --ep-size N` and `moekit bench --ep-size N` (without --ep-rank): this process is
// one rank of an expert-parallel run started by torchrun or mpirun.
#pragma once
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "moekit/ep.hpp"

namespace moekit::cli {

struct EpRunResult {
  int rank = 0, world_size = 1;
  std::string strategy;          // the EP strategy all ranks run
  RunResult run;                 // this rank's tokens' output
  EpForwardStats stats;          // the stages' times and the bytes moved
  std::vector<float> reference;  // with check: the single-rank CPU reference on the same tokens
};

// Reads and validates the launcher's environment (Error kInvalidArgument naming the variable, or
// the world size against ep_size x tp_size), creates the NCCL communicator on LOCAL_RANK's GPU
// (unique id over MOEKIT_RENDEZVOUS_PORT, default MASTER_PORT + 1; MOEKIT_COMM_TIMEOUT_MS,
// default two minutes, bounds it and every wait on the peers), draws this
// rank's expert shard (seed) and its own tokens (seed + rank), and runs one EpLayer forward
// (after a warm-up one where the layer runs on the GPU, its time then from CUDA events).
// `strategy`: "auto" or an EpStrategy name (EpLayerOptions::strategy); an unknown name is
// Error(kInvalidArgument) naming it, before the launcher's environment is read.
EpRunResult run_expert_parallel(const MoeSpec& spec, const LayerOptions& options,
                                const std::string& strategy, uint64_t seed, int64_t tokens,
                                bool check);

// One row of `moekit bench --ep-size N`: this rank's medians over the timed forwards.
struct EpBenchRow {
  int rank = 0, world_size = 1;
  std::string strategy;
  int64_t tokens = 0;
  double dispatch_us = 0, experts_us = 0, combine_us = 0, total_us = 0;
  int64_t bytes_sent = 0, bytes_received = 0;  // EpForwardStats' (the same every forward)
  // This rank's bytes across the links (sent + received) over dispatch + combine time.
  double link_bytes_per_s() const;
};

// The same set-up as run_expert_parallel with EpLayerOptions::time_stages, the layer built once
// for the largest count (spec.max_tokens); per token count a warm-up forward, then `reps` timed
// ones on the GPU (every rank the same number: the forwards are collective).
std::vector<EpBenchRow> bench_expert_parallel(const MoeSpec& spec, const LayerOptions& options,
                                              const std::string& strategy, uint64_t seed,
                                              const std::vector<int64_t>& tokens, int reps);

// The device halves (cli_cuda.cpp; a build without CUDA throws kUnsupported): one warm-up and
// one timed forward of `layer` on `in`, output copied back; `reps` forwards, the medians of
// their stage times (EpLayerOptions::time_stages) and of the whole forward (events around it).
RunResult run_ep_layer_on_device(EpLayer& layer, const HostInputs& in);
EpBenchRow time_ep_layer_on_device(EpLayer& layer, const HostInputs& in, int reps);

}  // namespace moekit::cli
