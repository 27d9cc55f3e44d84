// The Hopper (sm_90a) W4A16 / W8A16 engine: built by the registry's cuda.sm90.cutlass.int4_group
// and cuda.sm90.cutlass.int8_group implementations after the resolver accepted the spec.
//
// What it runs (anything else throws Error(kUnsupported) naming the value, before allocating):
// bf16 or fp16 activations in and out with kInt4Group or kInt8Group weights (fp32 group scales
// along K, groups of 32, 64 or 128, with or without zero points and the AWQ pre-quant scale); every
// activation, gate/up layout, bias, routing method and routing weight placement of the
// reference; local experts <= 512, top_k <= 32; hidden and local intermediate multiples of 64.
//
// At load the weights are laid out once for the kernels (pipeline/sm90_int_layout.hpp: the
// packed codes as the checkpoint packs them, signed, FC1's rows in the blocked gate/up order;
// scales and zero terms transposed to [K / group, N] fp32) and uploaded; no dequantized copy
// exists. The forward: route, count, permute and gather (the BF16 engine's) -> the routing
// weights on the input where the spec places them there -> FC1's AWQ pre-quant scale on the
// gathered rows (x * s per column, rounded to the activation type, as the reference) -> FC1
// (gemm/int_grouped_gemm.hpp: the tensor-core GEMV at a few rows per expert, CUTLASS's
// mixed-input grouped GEMM above; for groups of 32 the streaming GEMV at every row count; bias
// added in fp32 before FC1's one rounding) -> the
// activation (rounded) -> FC2's pre-quant scale -> FC2 -> finalize (FC2's bias, the weighted sum
// over top-k).
//
// forward() enqueues on args.stream only (no allocation, host sync or copy to the host), so it
// can be captured in a CUDA graph, also as the engine's first call. Caller-supplied ids that are
// out of range or repeated within a token are dropped on the device and reported by
// poll_errors().
#pragma once
#include <memory>
#include <string>

#include "moekit/registry.hpp"

namespace moekit::pipeline {

// Test hooks: they change the timing, not the result.
struct Sm90IntOptions {
  // Fill the gathered rows (which FC2's output shares), FC1's output, the activations and the
  // GEMMs' fp32 staging with NaN bytes (0xff) before each forward, so that a read of an element
  // the forward has not written shows in the output.
  bool poison = false;
  // A GEMM tactic name for both GEMMs at every token count (empty: the engine's pick), so that a
  // test runs the GEMV and the CUTLASS kernels at the same sizes.
  std::string force_tactic;
};

std::unique_ptr<Engine> make_sm90_int_engine(const MoeSpec& spec, const MoeWeights& weights,
                                             int device, const Sm90IntOptions& options = {});

}  // namespace moekit::pipeline
