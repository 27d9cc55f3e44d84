// What the load-time layouts of packed weights (sm90_int_layout.hpp, sm90_mx_layout.hpp) check
// alike: the expert index, and the row order that takes FC1's rows into the engine's order.
// Host C++17.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/status.hpp"
#include "moekit/weights.hpp"

namespace moekit::pipeline {

// Throws Error(kInvalidArgument), prefixed by `what`, for an expert e outside [0, t.experts) or
// a row_order (when given) of other than t.rows entries.
inline void check_layout_expert(const QuantizedTensor& t, int64_t e,
                                const std::vector<int64_t>* row_order, const char* what) {
  if (e < 0 || e >= t.experts)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": expert " + std::to_string(e) +
                                                 " is outside [0, " + std::to_string(t.experts) +
                                                 ")");
  if (row_order != nullptr && static_cast<int64_t>(row_order->size()) != t.rows)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": row_order holds " +
                                                 std::to_string(row_order->size()) +
                                                 " rows, expected " + std::to_string(t.rows));
}

// The checkpoint row that engine row r takes: row_order[r], or r without an order. Throws
// Error(kInvalidArgument) naming the entry when it is outside [0, rows).
inline int64_t layout_source_row(const std::vector<int64_t>* row_order, int64_t r, int64_t rows,
                                 const char* what) {
  const int64_t from = row_order ? (*row_order)[static_cast<std::size_t>(r)] : r;
  if (from < 0 || from >= rows)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": row_order[" +
                                                 std::to_string(r) + "] = " + std::to_string(from) +
                                                 " is outside [0, " + std::to_string(rows) + ")");
  return from;
}

}  // namespace moekit::pipeline
