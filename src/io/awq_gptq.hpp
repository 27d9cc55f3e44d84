// AWQ and GPTQ checkpoints: their int4 / int8 projections unpacked into moekit's canonical
// kInt4Group / kInt8Group layout. The layouts and the quantizers' sources they follow are in
// include/moekit/io.hpp ("AWQ and GPTQ checkpoints"); read_quantization_config is defined here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/model_family.hpp"
#include "io/packing.hpp"
#include "moekit/io.hpp"
#include "moekit/spec.hpp"

namespace moekit::io {

// How a checkpoint packs its projections: its quantization config, checked against the spec.
struct PackedLayout {
  bool awq = false;     // AutoAWQ's GEMM layout; else GPTQ's
  int bits = 4;         // 4 or 8 (AWQ: 4)
  int group = 128;      // in features per scale; the spec's group size
  int zero_offset = 0;  // added to each stored zero point (GPTQ's "gptq" format: 1)
};

// Whether `spec` on `family` is read from AWQ / GPTQ packs (int formats on a kPerExpert family).
bool reads_packed_ints(const ModelFamily& family, const MoeSpec& spec);

// The layout `quant` describes for the (valid) `spec`. `fc1_tensor` / `fc2_tensor` name a
// projection whose in features are hidden / intermediate, for messages. Errors:
// kInvalidArgument (no quant_method), kBadFile (a group size that does not divide K, or is not
// positive), kUnsupported (quant_method other than awq / gptq; bits other than 4 / 8, AWQ other
// than 4; group size -1 or not 32 / 64 / 128; AWQ version other than gemm; GPTQ checkpoint format
// other than gptq / gptq_v2), kFormatMismatch (bits or group size other than the spec's).
PackedLayout packed_layout(const QuantizationConfig& quant, const MoeSpec& spec,
                           const std::string& fc1_tensor, const std::string& fc2_tensor);

// One projection [rows = out features, cols = in features] in moekit's canonical buffers.
struct UnpackedProjection {
  std::vector<uint8_t> values;  // rows x row_bytes(cols)
  std::vector<float> scales;    // rows x cols/group
  std::vector<uint8_t> zeros;   // rows x cols/group; empty without the spec's zero points
  MatRef ref(int64_t rows, int64_t cols) const;
};

// Reads the projection whose tensors start with `prefix` ("...experts.3.w1."): qweight, qzeros,
// scales and (GPTQ, optional) g_idx, checked and unpacked into `out`. Errors (file and tensor
// named): kBadFile (a tensor missing, of another dtype or shape; a zero point past 2^bits - 1),
// kUnsupported (a g_idx that is not k / group), kFormatMismatch (a zero point other than
// 2^(bits-1) where the spec has no zero points).
void unpack_projection(const TensorIndex& idx, const PackedLayout& layout, const Packing& pk,
                       const std::string& prefix, int64_t rows, int64_t cols,
                       UnpackedProjection& out);

// One expert's AWQ pre-quant scales (`pre_quant_scale` beside each projection, [K] floats):
// gate's, which up's must equal (Error(kUnsupported) naming both: they share FC1's), into
// fc1[0, hidden); down's columns [offset, offset + count) into fc2[0, count).
void load_pre_quant_scales(const TensorIndex& idx, const std::string& gate_prefix,
                           const std::string& up_prefix, const std::string& down_prefix,
                           int64_t hidden, int64_t inter, int64_t offset, int64_t count, float* fc1,
                           float* fc2);

}  // namespace moekit::io
