// The device layout of microscaling weights (sm90_mx_layout.hpp).
#include "pipeline/sm90_mx_layout.hpp"

#include <cstring>
#include <string>

#include "pipeline/layout_rows.hpp"

namespace moekit::pipeline {

bool is_mx_format(WeightFormat f) {
  return f == WeightFormat::kMXFP4 || f == WeightFormat::kNVFP4 || f == WeightFormat::kMXFP8;
}

Status mx_check_matrix(WeightFormat f, int64_t rows, int64_t cols, const char* what) {
  const std::string name = std::string(what) + " (" + to_string(f) + ")";
  if (!is_mx_format(f))
    return Status(
        ErrorCode::kUnsupported,
        name + ": the mx layout takes mxfp4, nvfp4 or mxfp8 weights, not " + to_string(f));
  if (cols % 32 != 0)
    return Status(ErrorCode::kUnsupported,
                  name + ": cols (K) " + std::to_string(cols) +
                      " must be a multiple of 32: a GEMV lane's 16-byte chunk holds 32 e2m1 or "
                      "16 e4m3 values, and MX blocks are 32 wide");
  if (rows % 8 != 0)
    return Status(ErrorCode::kUnsupported,
                  name + ": rows " + std::to_string(rows) +
                      " must be a multiple of 8 (the outputs' 16-byte rows)");
  return {};
}

int64_t mx_expert_value_bytes(const QuantizedTensor& t) {
  return t.rows * t.cols * format_value_bits(t.format) / 8;
}

int64_t mx_expert_scale_bytes(const QuantizedTensor& t) {
  return t.rows * (t.cols / format_scale_group(t.format, t.group_size));
}

void mx_expert_layout(const QuantizedTensor& t, int64_t e, const std::vector<int64_t>* row_order,
                      uint8_t* values, uint8_t* scales) {
  throw_if_error(mx_check_matrix(t.format, t.rows, t.cols, "mx_expert_layout"));
  t.check_sizes("mx_expert_layout");
  check_layout_expert(t, e, row_order, "mx_expert_layout");
  const int64_t rows = t.rows;
  if (values == nullptr || scales == nullptr)
    throw Error(ErrorCode::kInvalidArgument, "mx_expert_layout: a destination buffer is null");
  const bool e8m0 = t.format != WeightFormat::kNVFP4;
  const int64_t row_bytes = t.cols * format_value_bits(t.format) / 8;
  const int64_t row_scales = t.cols / format_scale_group(t.format, t.group_size);
  const uint8_t* src = t.values.data() + e * t.expert_value_bytes();
  const uint8_t* src_scales = t.scale_bytes.data() + e * rows * row_scales;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t from = layout_source_row(row_order, r, rows, "mx_expert_layout");
    const uint8_t* s = src_scales + from * row_scales;
    if (e8m0)
      for (int64_t b = 0; b < row_scales; ++b)
        if (s[b] == 0xff)
          throw Error(ErrorCode::kInvalidArgument,
                      "mx_expert_layout: the e8m0 scale of expert " + std::to_string(e) + " row " +
                          std::to_string(from) + " block " + std::to_string(b) + " is 0xff (NaN)");
    std::memcpy(values + r * row_bytes, src + from * row_bytes,
                static_cast<std::size_t>(row_bytes));
    std::memcpy(scales + r * row_scales, s, static_cast<std::size_t>(row_scales));
  }
}

}  // namespace moekit::pipeline
