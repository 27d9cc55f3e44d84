// The Hopper (sm_90a) microscaling engine: built by the registry's cuda.sm90.mx.mxfp4,
// cuda.sm90.mx.nvfp4 and cuda.sm90.mx.mxfp8 implementations after the resolver accepted the spec.
//
// What it runs (anything else throws Error(kUnsupported) naming the value, before allocating):
// bf16 or fp16 activations in and out with kMXFP4 (e2m1, an e8m0 scale per 32), kNVFP4 (e2m1,
// an e4m3 scale per 16 and an fp32 global scale per expert) or kMXFP8 (e4m3, an e8m0 scale per
// 32) weights; every activation (gpt-oss's clamped SwiGLU included), gate/up layout, bias,
// routing method and routing weight placement of the reference; local experts <= 512, top_k <=
// 32; hidden and local intermediate multiples of 32 (pipeline/sm90_mx_layout.hpp).
//
// At load the weights are uploaded as the checkpoint holds them (values and 8-bit scales,
// row-major; FC1's rows in the blocked gate/up order for gated kinds: sm90_mx_layout.hpp); no
// dequantized copy exists. The forward (pipeline/weight_only_engine.hpp): route, count, permute
// and gather (the BF16 engine's) -> the routing weights on the input where the spec places
// them there -> FC1 (gemm/mx_grouped_gemm.hpp: the streaming GEMV, values and scales decoded
// in registers; bias added in fp32 before FC1's one rounding) -> the activation (rounded) ->
// FC2 -> finalize (FC2's bias, the weighted sum over top-k).
// The GEMV runs at every token count: it streams an expert's weights once per 8 of its rows, so
// prefill reads them many times over (docs/performance.md, microscaling); the tensor-core
// kernel that converts per 16 or 32 columns is still to be written (docs/architecture.md).
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
struct Sm90MxOptions {
  // Fill the gathered rows (which FC2's output shares), FC1's output and the activations with
  // NaN bytes (0xff) before each forward, so that a read of an element the forward has not
  // written shows in the output.
  bool poison = false;
  // A GEMM tactic name for both GEMMs at every token count (empty: the engine's pick).
  std::string force_tactic;
};

std::unique_ptr<Engine> make_sm90_mx_engine(const MoeSpec& spec, const MoeWeights& weights,
                                            int device, const Sm90MxOptions& options = {});

}  // namespace moekit::pipeline
