// The Hopper (sm_90a) FP8 engine: built by the registry's cuda.sm90.cutlass.fp8_block128 and
// cuda.sm90.cutlass.fp8 implementations after the resolver accepted the spec.
//
// What it runs (anything else throws Error(kUnsupported) naming the value, before allocating):
// bf16 activations in and out with kFP8Block128 weights (e4m3, one fp32 scale per 128x128 block,
// the checkpoints' weight_scale_inv) or kFP8PerTensor weights (e4m3, one weight scale and one
// static input scale per expert and matrix, or per-token activation scales where the spec says
// WeightQuant::dynamic_activations); every activation, gate/up layout, bias, routing
// method and routing weight placement of the reference; local experts <= 512, top_k <= 32;
// hidden and local intermediate multiples of 128.
//
// Inside the forward the activations are quantized to e4m3 the way quant::prepare_activations
// rounds them for the CPU reference: kFP8Block128 per token per 128 columns (scale
// max(amax, 1e-10) / 448, the eps of vLLM's and SGLang's per_token_group_quant_fp8, so that an
// all-zero group gets codes 0 and no NaN), kFP8PerTensor with the expert's static input scale
// or, dynamic, one scale per token (max(amax / 448, 1 / (448 * 512)), as vLLM);
// round to nearest even, saturating at +-448. Once as the rows are gathered in expert order
// (FC1's input), once behind the activation (FC2's input). FC1 and FC2 are FP8 grouped GEMMs
// with fp32 accumulation promoted per 128-deep k block (CUTLASS's sm90 blockwise-scaled
// ptr-array kernel); a per-tensor layer runs the same kernel with its scales spread over the
// blocks at load. FC1's output is stored as bf16, as the reference rounds it.
//
// forward() enqueues on args.stream only (no allocation, host sync or copy to the host), so it
// can be captured in a CUDA graph, also as the engine's first call. Caller-supplied ids that are
// out of range or repeated within a token are dropped on the device and reported by
// poll_errors().
#pragma once
#include <memory>

#include "moekit/registry.hpp"

namespace moekit::pipeline {

// Test hooks: they change the timing, not the result.
struct Sm90Fp8Options {
  // Fill the quantized rows and their scales (FC1's input, and FC2's output that shares their
  // memory), FC1's output and the quantized activations (FC2's input) with NaN bytes (0xff;
  // e4m3 0xff is NaN too) before each forward, so that a read of an element the forward has not
  // written shows in the output.
  bool poison = false;
};

std::unique_ptr<Engine> make_sm90_fp8_engine(const MoeSpec& spec, const MoeWeights& weights,
                                             int device, const Sm90Fp8Options& options = {});

}  // namespace moekit::pipeline
