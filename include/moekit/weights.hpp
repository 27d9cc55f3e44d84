// Host-side storage of one layer's expert weights in any WeightFormat (layouts: types.hpp).
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/spec.hpp"
#include "moekit/types.hpp"

namespace moekit {

// One projection for all (local) experts: logical [experts, rows, cols], rows = out features.
struct QuantizedTensor {
  WeightFormat format = WeightFormat::kBF16;
  int64_t experts = 0, rows = 0, cols = 0;
  int group_size = 0;                // columns per scale (0 = none / per tensor)
  std::vector<uint8_t> values;       // packed elements, expert-major, row-major
  std::vector<float> scales;         // fp32 scales: kFP8Block128, kInt8Group, kInt4Group
  std::vector<uint8_t> scale_bytes;  // raw 8-bit scales: e8m0 (kMXFP4, kMXFP8), e4m3 (kNVFP4)
  std::vector<uint8_t> zeros;        // zero points (int formats, optional)
  std::vector<float> weight_scale;   // [experts]: kFP8PerTensor weight scale
  std::vector<float> global_scale;   // [experts]: kNVFP4 global scale (ModelOpt weight_scale_2)
  std::vector<float> input_scale;    // [experts]: kFP8PerTensor static activation scale
  // [experts, cols]: AWQ smoothing (int formats, optional). It MULTIPLIES the activations,
  // y = W (x * pre_quant_scale), as in ModelOpt / TensorRT-LLM checkpoints (types.hpp).
  std::vector<float> pre_quant_scale;

  // Bytes of `values` for one expert.
  int64_t expert_value_bytes() const;
  // Throws Error(kInvalidArgument) naming `what` when a buffer has the wrong size for the shape.
  void check_sizes(const char* what) const;
};

// One layer's experts. fc1 is [E, fc1_rows, H] (gate and up fused, as GateUpLayout says);
// fc2 is [E, H, I]. Biases are fp32: fc1_bias [E, fc1_rows], fc2_bias [E, H] (empty = none).
// For a sharded spec these are the LOCAL shards (local experts, local intermediate):
// shard_weights() cuts them from the full set.
struct MoeWeights {
  QuantizedTensor fc1;
  QuantizedTensor fc2;
  std::vector<float> fc1_bias;
  std::vector<float> fc2_bias;
  std::vector<float>
      routing_bias;  // [E global] DeepSeek-V3 e_score_correction_bias (selection only)
};

// Bytes that one expert's [rows, cols] projection occupies in `quant`'s format (layouts:
// types.hpp), everything a kernel reads to use it: the values, their scales (fp32 or 8-bit),
// zero points and AWQ pre-quant scale where `quant` has them, and the per-expert fp32 scalars
// (kFP8PerTensor weight and input scale, kNVFP4 global scale). E.g. kFP8Block128: rows * cols
// + 4 * ceil(rows/128) * ceil(cols/128). The extents are a valid spec's (no product overflows).
int64_t expert_matrix_bytes(const WeightQuant& quant, int64_t rows, int64_t cols);

// The local shard of `full` (weights of the unsharded spec) for spec's tp_rank / ep_rank.
MoeWeights shard_weights(const MoeSpec& spec, const MoeWeights& full);

// Checks that `w` matches the local problem of `spec` (formats, shapes, buffer sizes, biases,
// zero points and pre-quant scales as the spec's options say) and that no e8m0 scale (kMXFP4,
// kMXFP8) is NaN (0xff); throws Error(kFormatMismatch) naming both formats, or
// kInvalidArgument naming the field (for a NaN scale: tensor, expert, row and group).
void check_weights(const MoeSpec& spec, const MoeWeights& w);

}  // namespace moekit
