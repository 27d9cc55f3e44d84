// The sm90 int engine's device layout of int group weights (sm90_int_layout.hpp).
#include "pipeline/sm90_int_layout.hpp"

#include <cstring>
#include <string>

#include "moekit/status.hpp"
#include "pipeline/layout_rows.hpp"

namespace moekit::pipeline {

int int_group_bits(WeightFormat f) {
  if (f == WeightFormat::kInt4Group) return 4;
  if (f == WeightFormat::kInt8Group) return 8;
  throw Error(ErrorCode::kUnsupported, std::string("the int group layout takes int4_group or "
                                                   "int8_group weights, not ") +
                                           to_string(f));
}

int64_t int_expert_value_bytes(const QuantizedTensor& t) {
  return t.rows * t.cols * int_group_bits(t.format) / 8;
}

int64_t int_expert_group_entries(const QuantizedTensor& t) {
  return t.group_size > 0 ? t.rows * (t.cols / t.group_size) : 0;
}

void int_expert_layout(const QuantizedTensor& t, int64_t e, const std::vector<int64_t>* row_order,
                       uint8_t* values, float* scales, float* zero_terms) {
  const int bits = int_group_bits(t.format);
  t.check_sizes("int_expert_layout");
  check_layout_expert(t, e, row_order, "int_expert_layout");
  const int64_t rows = t.rows, g = t.group_size;
  if (g <= 0 || t.cols % g != 0)
    throw Error(ErrorCode::kInvalidArgument, "int_expert_layout: group size " + std::to_string(g) +
                                                 " does not divide cols " + std::to_string(t.cols));
  const bool zero = !t.zeros.empty();
  if (zero && zero_terms == nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                "int_expert_layout: the weights have zero points but no zero_terms buffer");
  const int64_t groups = t.cols / g, row_bytes = t.cols * bits / 8;
  // Re-centring an unsigned code to a signed one: flip the top bit of every code.
  const uint8_t flip = bits == 4 ? 0x88 : 0x80;
  const int mid = bits == 4 ? 8 : 128;
  const uint8_t* src = t.values.data() + e * t.expert_value_bytes();
  const std::size_t table = static_cast<std::size_t>(e * rows * groups);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t from = layout_source_row(row_order, r, rows, "int_expert_layout");
    uint8_t* out = values + r * row_bytes;
    std::memcpy(out, src + from * row_bytes, static_cast<std::size_t>(row_bytes));
    if (zero)
      for (int64_t b = 0; b < row_bytes; ++b) out[b] ^= flip;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const std::size_t at = table + static_cast<std::size_t>(from * groups + gi);
      const float s = t.scales[at];
      scales[gi * rows + r] = s;
      if (zero) zero_terms[gi * rows + r] = -static_cast<float>(int{t.zeros[at]} - mid) * s;
    }
  }
}

}  // namespace moekit::pipeline
