// What EpLayer's host path (ep_layer.cpp) and device path (ep_layer_device_cuda.cpp) share.
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/ep.hpp"

namespace moekit::ep_internal {

// counts[i] * bytes for each i.
std::vector<int64_t> scaled(const std::vector<int64_t>& counts, int64_t bytes);

// The all-to-all forms' bytes across the rank boundary: the counts (8 bytes per peer, where
// with_counts), then rows, ids and weights out, results back (rows the other way). send_rows[d]
// rows went to rank d, recv_rows[s] came from rank s; what `self` keeps is not counted.
void count_all_to_all_bytes(const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows, int64_t row_bytes, int64_t top_k,
                            int self, bool with_counts, EpForwardStats* stats);

}  // namespace moekit::ep_internal
