// Reorders a checkpoint's FC1 rows (gate/up in its GateUpLayout) into the sm90 engine's blocked
// order (activation_math.hpp: blocked_gate_row / blocked_up_row) at upload, so the device only
// ever sees one gated order. Host C++20.
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/types.hpp"

namespace moekit::activation {

// For each of the 2 * intermediate engine rows r, the checkpoint row it takes:
// engine_row[r] = checkpoint_row[result[r]]. Throws Error(kInvalidArgument) naming the value
// when intermediate is not a positive multiple of kGateUpBlock (8) or `layout` is unknown.
std::vector<int64_t> blocked_fc1_source_rows(GateUpLayout layout, int64_t intermediate);

// Copies row source_rows[r] of `src` to row r of `dst`, `row_bytes` each (weights: H * elem
// size; bias: 4). `src` must hold every row named and `dst` source_rows.size() rows; they must
// not overlap. Throws Error(kInvalidArgument) when row_bytes is negative.
void gather_rows(const std::vector<int64_t>& source_rows, const void* src, void* dst,
                 int64_t row_bytes);

}  // namespace moekit::activation
