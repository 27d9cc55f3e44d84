// The Hopper (sm_90a) BF16/FP16 engine: built by the registry's cuda.sm90.cutlass.* implementations
// after the resolver accepted the spec; prepares the weights on `device` and sizes the workspace.
//
// What it runs (anything else throws Error(kUnsupported) naming the value, before allocating):
// act_dtype bf16 with kBF16 weights or fp16 with kFP16 weights; every activation, gate/up
// layout, bias, routing method and routing weight placement of the reference; experts <= 512
// (global and local), top_k
// <= 32, DeepSeek-V3 n_group <= 32; hidden and local intermediate multiples of 8.
// forward() enqueues on args.stream only (no allocation, host sync or copy to the host), so it
// can be captured in a CUDA graph, also as the engine's first call. Caller-supplied ids that are
// out of range or repeated within a token are dropped on the device and reported by
// poll_errors() (the first one since the last poll: token, slot, value).
#pragma once
#include <memory>

#include "moekit/registry.hpp"

namespace moekit::pipeline {

// Choices that change how the forward runs, not what it computes (for tests and A/B runs).
struct Sm90Options {
  // From two tokens on, FC1 and FC2 in one kernel where both run the TMA GEMV
  // (GroupedGemm::launch_chained); off: two launches, as at one token.
  bool chain_decode = true;
  // From two to GroupedGemm::kMaxTokenRows tokens, chained, FC1 reads the tokens' own rows
  // (gemm::TokenRows) and the permute gathers none, where GroupedGemm::token_rows_pay; off: FC1
  // reads the gathered rows.
  bool token_rows = true;
  // At one token with a gated activation, FC1 and FC2 in one kernel in slices of the
  // intermediate, each slice's FC2 product added up by the finalize (GroupedGemm::launch_sliced,
  // on GroupedGemm::sliced_tactic); off: the two GEMMs as above.
  bool slice_one_token = true;
  // Past the single-block permute, FC1 reads the tokens' rows by index (the permute gathers
  // none) where its tactic has a gathering variant that pays (GroupedGemm::gathering_tactic);
  // off: FC1 reads the rows the permute gathered.
  bool gather_in_fc1 = true;
  // Chained, up to GroupedGemm::kMaxTokenRows tokens: FC2's items split along k into this many
  // slices (gemm::KSlices), their fp32 sums added up by the finalize; 1: none; 0: where
  // GroupedGemm::chained_k_slices says it pays.
  int fc2_k_slices = 0;
  // Test hooks: fill the gathered rows (which FC2's output shares) or FC1's activated output
  // (and the sliced kernel's partial sums) with NaN before each forward, so that a read of an
  // element the forward has not written yet shows in the output. They add a memset each and change
  // the timing.
  bool poison_gathered_rows = false;
  bool poison_activations = false;
  // And the permute's slots (rows, weights, experts: -1 rows, NaN weights), which the finalize
  // reads before its PDL wait.
  bool poison_slots = false;
};

std::unique_ptr<Engine> make_sm90_engine(const MoeSpec& spec, const MoeWeights& weights, int device,
                                         const Sm90Options& options = {});

}  // namespace moekit::pipeline
