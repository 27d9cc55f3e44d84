// `moekit run --ep-size N` (without --ep-rank): this process is one rank of an expert-parallel
// run started by torchrun or mpirun.
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
// (unique id over MOEKIT_RENDEZVOUS_PORT, default MASTER_PORT + 1, 120 s timeout), draws this
// rank's expert shard (seed) and its own tokens (seed + rank), and runs one EpLayer forward.
EpRunResult run_expert_parallel(const MoeSpec& spec, const LayerOptions& options, uint64_t seed,
                                int64_t tokens, bool check);

}  // namespace moekit::cli
