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
// kernels see them: AWQ pre-quant division for int formats with pre_quant_scale, and
// quantize-dequantize for W8A8 formats (kFP8PerTensor static scale, kFP8Block128 per token per
// 128, kMXFP8 per token per 32). Other formats: unchanged.
void prepare_activations(const QuantizedTensor& t, int64_t e, float* x, int64_t rows);

// Encodes fp32 weights w [experts, rows, cols] into format q.format (computing scales from the
// data: absmax per block/group, zero points when q.zero_points). For kFP8PerTensor input_scale
// is set from `act_absmax` / 448 (one per expert). pre_quant_scale, when asked for, is drawn
// deterministically from `seed` in [0.5, 2].
QuantizedTensor quantize(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols,
                         const float* w, float act_absmax = 4.0f, uint64_t seed = 1);

// Random weights for a spec (normal(0, 1/sqrt(fan_in)) values, then quantize()), with biases
// and routing bias when the spec asks for them. Same seed, same weights, on every machine.
MoeWeights make_random_weights(const MoeSpec& spec, uint64_t seed);

// Rounds a value to act dtype (bf16 / fp16 / fp32), as a kernel reading it would see it.
float round_to(DType t, float x);

}  // namespace moekit::quant
