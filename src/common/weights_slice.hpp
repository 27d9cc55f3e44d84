// Cutting experts, rows and columns out of quantized tensors (TP/EP sharding), shared by
// shard_weights() and quant::make_random_weights().
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/weights.hpp"

namespace moekit::detail {

// Rows of the unsharded FC1 [fc1_rows, H] that form the local FC1 for the intermediate slice
// [offset, offset + count) of `intermediate`, in local order (layouts: GateUpLayout).
std::vector<int64_t> fc1_row_map(bool gated, GateUpLayout layout, int64_t intermediate,
                                 int64_t offset, int64_t count);

// Experts [e0, e0 + ne), the listed rows (full row index of each local row) and columns
// [c0, c0 + nc) of t, with their scales, zeros and per-expert / per-column factors.
// Throws Error(kInvalidArgument) naming `what` when the cut splits a scale group or block.
QuantizedTensor slice_tensor(const QuantizedTensor& t, const char* what, int64_t e0, int64_t ne,
                             const std::vector<int64_t>& rows, int64_t c0, int64_t nc);

// Rows `idx` of experts [e0, e0 + ne) of an fp32 [experts, width] table (biases).
std::vector<float> slice_table(const std::vector<float>& t, int64_t width, int64_t e0, int64_t ne,
                               const std::vector<int64_t>& idx);

}  // namespace moekit::detail
