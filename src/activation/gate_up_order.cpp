// gate_up_order.hpp: checkpoint FC1 row order -> the engine's blocked gated order.
#include "activation/gate_up_order.hpp"

#include <cstring>
#include <string>

#include "activation/activation_math.hpp"
#include "moekit/status.hpp"

namespace moekit::activation {

std::vector<int64_t> blocked_fc1_source_rows(GateUpLayout layout, int64_t intermediate) {
  if (intermediate <= 0 || intermediate % kGateUpBlock != 0)
    throw Error(ErrorCode::kInvalidArgument,
                "intermediate " + std::to_string(intermediate) + " is not a positive multiple of " +
                    std::to_string(kGateUpBlock) + " (the blocked gate/up order needs one)");
  if (layout != GateUpLayout::kHalves && layout != GateUpLayout::kInterleaved)
    throw Error(ErrorCode::kInvalidArgument, "gate/up layout " +
                                                 std::to_string(static_cast<int>(layout)) +
                                                 " is neither halves nor interleaved");
  std::vector<int64_t> rows(static_cast<std::size_t>(2 * intermediate));
  for (int64_t j = 0; j < intermediate; ++j) {
    const bool halves = layout == GateUpLayout::kHalves;
    rows[static_cast<std::size_t>(blocked_gate_row(j))] = halves ? j : 2 * j;
    rows[static_cast<std::size_t>(blocked_up_row(j))] = halves ? intermediate + j : 2 * j + 1;
  }
  return rows;
}

void gather_rows(const std::vector<int64_t>& source_rows, const void* src, void* dst,
                 int64_t row_bytes) {
  if (row_bytes < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "row_bytes " + std::to_string(row_bytes) + " is negative");
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const auto n = static_cast<std::size_t>(row_bytes);
  for (std::size_t r = 0; r < source_rows.size(); ++r)
    std::memcpy(d + r * n, s + static_cast<std::size_t>(source_rows[r]) * n, n);
}

}  // namespace moekit::activation
