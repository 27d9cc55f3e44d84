// Decoding and encoding of every WeightFormat on the host (layouts: include/moekit/types.hpp).
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/spec.hpp"
#include "moekit/weights.hpp"

namespace moekit::quant {

// Dequantizes expert e of t into out [t.rows * t.cols] fp32, bit-exactly.
void dequantize_expert(const QuantizedTensor& t, int64_t e, float* out);

// Rounds activations x [rows, cols] (the input of projection t, expert e) the way the format's
// kernels see them: AWQ pre-quant product x * pre_quant_scale rounded to act_dtype for int
// formats with one, and quantize-dequantize for W8A8 formats (kFP8PerTensor static scale,
// kFP8Block128 per token per 128, kMXFP8 per token per 32). Other formats: unchanged.
void prepare_activations(const QuantizedTensor& t, int64_t e, float* x, int64_t rows,
                         DType act_dtype);

// Encodes fp32 weights w [experts, rows, cols] into format q.format (computing scales from the
// data: absmax per block/group, zero points when q.zero_points). For kFP8PerTensor input_scale
// is set from `act_absmax` / 448 (one per expert). pre_quant_scale, when asked for, is drawn
// deterministically from `seed` in [0.5, 2], and the stored weights are w / pre_quant_scale
// (per column), so that dequantized W times (x * pre_quant_scale) approximates w x.
// Scales: fp8 amax/448; int symmetric amax/(2^(b-1)-1) with codes clamped to the signed range,
// with zero points (max(w,0) - min(w,0)) / (2^b - 1) and z = rne(-min/s); MXFP4 / MXFP8 the
// e8m0 power of two >= amax/6 (/448); NVFP4 global amax/(448*6), block e4m3(amax/6/global).
// Throws Error(kInvalidArgument) for shapes the format cannot hold.
QuantizedTensor quantize(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols,
                         const float* w, float act_absmax = 4.0f, uint64_t seed = 1);

// Random weights for a spec (normal(0, 1/sqrt(fan_in)) values, then quantize()), with biases
// (normal(0, 0.1)) and routing bias (normal(0, 0.1), all E experts) when the spec asks for them;
// kFP8PerTensor input scales are 4/448. Same seed, same weights, on every machine (own
// splitmix64 + Box-Muller, no C library transcendentals). For a sharded spec the result is
// exactly shard_weights() of the unsharded spec's random weights (scales computed before the
// cut), so TP/EP ranks together hold the unsharded layer. Costs about 10 ns per element per
// core (a Qwen3-30B-A3B layer, 604M elements, takes a few seconds on 2 cores).
MoeWeights make_random_weights(const MoeSpec& spec, uint64_t seed);

// Rounds a value to act dtype (bf16 / fp16 / fp32), as a kernel reading it would see it.
float round_to(DType t, float x);

}  // namespace moekit::quant
