// Size checks, TP/EP sharding and validation of expert weights (layouts: types.hpp).
#include "moekit/weights.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "common/checked.hpp"
#include "common/weights_slice.hpp"
#include "moekit/status.hpp"

namespace moekit {
namespace {

bool is_int_format(WeightFormat f) {
  return f == WeightFormat::kInt8Group || f == WeightFormat::kInt4Group;
}
bool has_byte_scales(WeightFormat f) {
  return f == WeightFormat::kMXFP4 || f == WeightFormat::kMXFP8 || f == WeightFormat::kNVFP4;
}
bool has_e8m0_scales(WeightFormat f) {
  return f == WeightFormat::kMXFP4 || f == WeightFormat::kMXFP8;
}
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }  // no a + b - 1 to overflow

bool known_format(WeightFormat f) {
  const int v = static_cast<int>(f);
  return v >= static_cast<int>(WeightFormat::kBF16) && v <= static_cast<int>(WeightFormat::kMXFP8);
}

// "int4_group [experts 2, rows 4, cols 256, group 128]" for error messages.
std::string describe(const QuantizedTensor& t) {
  std::string s = std::string(to_string(t.format)) + " [experts " + std::to_string(t.experts) +
                  ", rows " + std::to_string(t.rows) + ", cols " + std::to_string(t.cols);
  if (t.group_size != 0) s += ", group " + std::to_string(t.group_size);
  return s + "]";
}

// Columns covered by one scale, after check_sizes (0 = none / per tensor).
int64_t group_of(const QuantizedTensor& t) { return format_scale_group(t.format, t.group_size); }

[[noreturn]] void fail(const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, msg); }

}  // namespace

int64_t QuantizedTensor::expert_value_bytes() const {
  return rows * (cols * format_value_bits(format) / 8);
}

int64_t expert_matrix_bytes(const WeightQuant& quant, int64_t rows, int64_t cols) {
  const WeightFormat f = quant.format;
  const int64_t values = rows * (cols * format_value_bits(f) / 8);
  const int64_t g = format_scale_group(f, quant.group_size);
  const int64_t groups = g > 0 ? rows * (cols / g) : 0;  // per-row groups along cols
  switch (f) {
    case WeightFormat::kFP8PerTensor:
      return values + (quant.dynamic_activations ? 4 : 2 * 4);  // weight_scale (+ input_scale)
    case WeightFormat::kFP8Block128:
      return values + 4 * ceil_div(rows, 128) * ceil_div(cols, 128);
    case WeightFormat::kInt8Group:
    case WeightFormat::kInt4Group:
      return values + 4 * groups + (quant.zero_points ? groups : 0) +
             (quant.pre_quant_scale ? 4 * cols : 0);
    case WeightFormat::kMXFP4:
    case WeightFormat::kMXFP8:
      return values + groups;
    case WeightFormat::kNVFP4:
      return values + groups + 4;  // e4m3 block scales and the global scale
    default:
      return values;  // bf16, fp16, fp32: no scales
  }
}

void QuantizedTensor::check_sizes(const char* what) const {
  const std::string name(what);
  if (!known_format(format))
    fail(name + ": weight format id " + std::to_string(static_cast<int>(format)) +
         " is not a known format");
  if (experts < 0 || rows < 0 || cols < 0)
    fail(name + ": shape [experts " + std::to_string(experts) + ", rows " + std::to_string(rows) +
         ", cols " + std::to_string(cols) + "] has a negative extent");
  if (format_value_bits(format) == 4 && cols % 2 != 0)
    fail(name + ": cols " + std::to_string(cols) + " is odd, but " + to_string(format) +
         " packs two elements per byte in each row");
  if (is_int_format(format)) {
    if (group_size <= 0)
      fail(name + ": group_size " + std::to_string(group_size) + " must be positive for " +
           to_string(format));
  } else if (group_size != format_scale_group(format, group_size)) {
    fail(name + ": group_size " + std::to_string(group_size) + ", but " + to_string(format) +
         " uses " + std::to_string(format_scale_group(format, group_size)));
  }
  const int64_t g = group_of(*this);
  if (g > 0 && format != WeightFormat::kFP8Block128 && cols % g != 0)
    fail(name + ": cols " + std::to_string(cols) + " is not a multiple of the group size " +
         std::to_string(g) + " of " + to_string(format));

  // Extents come from files: every count below is a checked product, so none wraps around.
  auto count = [&](const char* buffer, std::initializer_list<int64_t> factors) {
    const std::optional<int64_t> n = checked_product(factors);
    if (!n)
      fail(name + ": the " + buffer + " element count " + factors_text(factors) +
           " overflows 64-bit arithmetic");
    return *n;
  };
  const int64_t row_bytes = count("values", {cols, format_value_bits(format)}) / 8;
  const int64_t n_values = count("values", {experts, rows, row_bytes});
  const int64_t per_group = g > 0 ? count("scales", {experts, rows, cols / g}) : 0;
  auto expect = [&](const char* buffer, std::size_t have, int64_t need, bool optional) {
    if (static_cast<int64_t>(have) == need || (optional && have == 0)) return;
    std::string needs = std::to_string(need);
    if (optional) needs = "0 (none) or " + needs;
    fail(name + ": " + buffer + " has " + std::to_string(have) + " elements, but " +
         describe(*this) + " needs " + needs);
  };
  expect("values", values.size(), n_values, false);
  int64_t n_scales = 0;
  if (format == WeightFormat::kFP8Block128)
    n_scales = count("scales", {experts, ceil_div(rows, 128), ceil_div(cols, 128)});
  else if (is_int_format(format))
    n_scales = per_group;
  expect("scales", scales.size(), n_scales, false);
  expect("scale_bytes", scale_bytes.size(), has_byte_scales(format) ? per_group : 0, false);
  const bool is_int = is_int_format(format);
  expect("zeros", zeros.size(), is_int ? per_group : 0, is_int);
  expect("weight_scale", weight_scale.size(), format == WeightFormat::kFP8PerTensor ? experts : 0,
         false);
  expect("global_scale", global_scale.size(), format == WeightFormat::kNVFP4 ? experts : 0, false);
  // Absent for per-tensor weights whose activations are quantized per token
  // (WeightQuant::dynamic_activations; check_weights holds it to the spec).
  expect("input_scale", input_scale.size(), format == WeightFormat::kFP8PerTensor ? experts : 0,
         format == WeightFormat::kFP8PerTensor);
  expect("pre_quant_scale", pre_quant_scale.size(),
         is_int ? count("pre_quant_scale", {experts, cols}) : 0, is_int);
}

namespace detail {

std::vector<int64_t> fc1_row_map(bool gated, GateUpLayout layout, int64_t intermediate,
                                 int64_t offset, int64_t count) {
  std::vector<int64_t> rows;
  if (!gated) {
    rows.resize(count);
    std::iota(rows.begin(), rows.end(), offset);
  } else if (layout == GateUpLayout::kInterleaved) {
    rows.resize(2 * count);
    std::iota(rows.begin(), rows.end(), 2 * offset);
  } else {
    rows.resize(2 * count);
    std::iota(rows.begin(), rows.begin() + count, offset);
    std::iota(rows.begin() + count, rows.end(), intermediate + offset);
  }
  return rows;
}

QuantizedTensor slice_tensor(const QuantizedTensor& t, const char* what, int64_t e0, int64_t ne,
                             const std::vector<int64_t>& rows, int64_t c0, int64_t nc) {
  t.check_sizes(what);
  const std::string name(what);
  const auto nr = static_cast<int64_t>(rows.size());
  if (e0 < 0 || ne < 0 || e0 + ne > t.experts)
    fail(name + ": experts [" + std::to_string(e0) + ", " + std::to_string(e0 + ne) +
         ") are outside the tensor's " + std::to_string(t.experts) + " experts");
  if (c0 < 0 || nc < 0 || c0 + nc > t.cols)
    fail(name + ": columns [" + std::to_string(c0) + ", " + std::to_string(c0 + nc) +
         ") are outside the tensor's " + std::to_string(t.cols) + " columns");
  for (int64_t r : rows)
    if (r < 0 || r >= t.rows)
      fail(name + ": row " + std::to_string(r) + " is outside the tensor's " +
           std::to_string(t.rows) + " rows");
  const int64_t g = group_of(t);
  const int bits = format_value_bits(t.format);
  if (g > 0 && c0 % g != 0)
    fail(name + ": the column slice starting at " + std::to_string(c0) +
         " splits a scale group of " + std::to_string(g) + " columns of " + to_string(t.format));
  if (bits == 4 && (c0 % 2 != 0 || nc % 2 != 0))
    fail(name + ": the column slice [" + std::to_string(c0) + ", " + std::to_string(c0 + nc) +
         ") splits a byte of packed 4-bit elements");

  QuantizedTensor o;
  o.format = t.format;
  o.experts = ne;
  o.rows = nr;
  o.cols = nc;
  o.group_size = t.group_size;

  const int64_t src_row_bytes = t.cols * bits / 8, dst_row_bytes = nc * bits / 8;
  o.values.resize(static_cast<std::size_t>(ne * nr * dst_row_bytes));
  for (int64_t e = 0; e < ne; ++e)
    for (int64_t r = 0; r < nr; ++r)
      std::memcpy(o.values.data() + (e * nr + r) * dst_row_bytes,
                  t.values.data() + ((e0 + e) * t.rows + rows[r]) * src_row_bytes + c0 * bits / 8,
                  static_cast<std::size_t>(dst_row_bytes));

  // Per-row group tables [E, rows, cols/g]: int scales and zeros, e8m0/e4m3 scale bytes.
  auto cut_groups = [&](const auto& src, auto& dst) {
    if (src.empty() || g == 0) return;
    const int64_t sg = t.cols / g, dg = nc / g, first = c0 / g;
    dst.resize(static_cast<std::size_t>(ne * nr * dg));
    for (int64_t e = 0; e < ne; ++e)
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t j = 0; j < dg; ++j)
          dst[(e * nr + r) * dg + j] = src[((e0 + e) * t.rows + rows[r]) * sg + first + j];
  };
  if (t.format == WeightFormat::kFP8Block128) {
    // Every local 128-row block must come from one full 128-row block, so one scale fits it.
    const int64_t sbr = (t.rows + 127) / 128, sbc = (t.cols + 127) / 128;
    const int64_t dbr = (nr + 127) / 128, dbc = (nc + 127) / 128;
    std::vector<int64_t> block_of(dbr);
    for (int64_t b = 0; b < dbr; ++b) {
      block_of[b] = rows[b * 128] / 128;
      for (int64_t r = b * 128; r < std::min(nr, (b + 1) * 128); ++r)
        if (rows[r] / 128 != block_of[b])
          fail(name + ": local rows " + std::to_string(b * 128) + ".." + std::to_string(r) +
               " come from different 128-row scale blocks of fp8_block128 (full rows " +
               std::to_string(rows[b * 128]) + " and " + std::to_string(rows[r]) + ")");
    }
    o.scales.resize(static_cast<std::size_t>(ne * dbr * dbc));
    for (int64_t e = 0; e < ne; ++e)
      for (int64_t b = 0; b < dbr; ++b)
        for (int64_t j = 0; j < dbc; ++j)
          o.scales[(e * dbr + b) * dbc + j] =
              t.scales[((e0 + e) * sbr + block_of[b]) * sbc + c0 / 128 + j];
  } else {
    cut_groups(t.scales, o.scales);
  }
  cut_groups(t.scale_bytes, o.scale_bytes);
  cut_groups(t.zeros, o.zeros);
  auto cut_experts = [&](const std::vector<float>& src, std::vector<float>& dst) {
    if (!src.empty()) dst.assign(src.begin() + e0, src.begin() + e0 + ne);
  };
  cut_experts(t.weight_scale, o.weight_scale);
  cut_experts(t.global_scale, o.global_scale);
  cut_experts(t.input_scale, o.input_scale);
  if (!t.pre_quant_scale.empty()) {
    o.pre_quant_scale.resize(static_cast<std::size_t>(ne * nc));
    for (int64_t e = 0; e < ne; ++e)
      std::memcpy(o.pre_quant_scale.data() + e * nc,
                  t.pre_quant_scale.data() + (e0 + e) * t.cols + c0,
                  static_cast<std::size_t>(nc) * sizeof(float));
  }
  return o;
}

std::vector<float> slice_table(const std::vector<float>& t, int64_t width, int64_t e0, int64_t ne,
                               const std::vector<int64_t>& idx) {
  if (t.empty()) return {};
  const auto n = static_cast<int64_t>(idx.size());
  std::vector<float> o(static_cast<std::size_t>(ne * n));
  for (int64_t e = 0; e < ne; ++e)
    for (int64_t i = 0; i < n; ++i) o[e * n + i] = t[(e0 + e) * width + idx[i]];
  return o;
}

}  // namespace detail

MoeWeights shard_weights(const MoeSpec& spec, const MoeWeights& full) {
  MoeSpec unsharded = spec;
  unsharded.tp_size = 1;
  unsharded.tp_rank = 0;
  unsharded.ep_size = 1;
  unsharded.ep_rank = 0;
  check_weights(unsharded, full);
  const LocalProblem lp = derive_local(spec);

  const auto fc1_rows =
      detail::fc1_row_map(activation_is_gated(spec.activation.kind), spec.gate_up_layout,
                          spec.intermediate, lp.intermediate_offset, lp.intermediate);
  std::vector<int64_t> hidden_rows(static_cast<std::size_t>(spec.hidden));
  std::iota(hidden_rows.begin(), hidden_rows.end(), int64_t{0});

  MoeWeights out;
  out.fc1 = detail::slice_tensor(full.fc1, "fc1", lp.first_expert, lp.num_experts, fc1_rows, 0,
                                 spec.hidden);
  out.fc2 = detail::slice_tensor(full.fc2, "fc2", lp.first_expert, lp.num_experts, hidden_rows,
                                 lp.intermediate_offset, lp.intermediate);
  out.fc1_bias =
      detail::slice_table(full.fc1_bias, full.fc1.rows, lp.first_expert, lp.num_experts, fc1_rows);
  // The FC2 bias stays whole on every TP rank; derive_local() says which rank adds it.
  out.fc2_bias =
      detail::slice_table(full.fc2_bias, spec.hidden, lp.first_expert, lp.num_experts, hidden_rows);
  out.routing_bias = full.routing_bias;
  check_weights(spec, out);
  return out;
}

void check_weights(const MoeSpec& spec, const MoeWeights& w) {
  const LocalProblem lp = derive_local(spec);
  const WeightFormat want = spec.weights.format;
  auto check_tensor = [&](const QuantizedTensor& t, const char* name, int64_t rows, int64_t cols) {
    if (t.format != want)
      throw Error(ErrorCode::kFormatMismatch, std::string(name) + " weights are stored as " +
                                                  to_string(t.format) + " but the spec asks for " +
                                                  to_string(want));
    auto expect = [&](const char* field, int64_t have, int64_t need) {
      if (have != need)
        fail(std::string(name) + "." + field + " is " + std::to_string(have) +
             " but the local problem needs " + std::to_string(need));
    };
    expect("experts", t.experts, lp.num_experts);
    expect("rows", t.rows, rows);
    expect("cols", t.cols, cols);
    if (is_int_format(want)) {
      expect("group_size", t.group_size, spec.weights.group_size);
      if (t.zeros.empty() == spec.weights.zero_points)
        fail(std::string(name) + ".zeros is " + (t.zeros.empty() ? "missing" : "present") +
             " but the spec says zero_points " + (spec.weights.zero_points ? "true" : "false"));
      if (t.pre_quant_scale.empty() == spec.weights.pre_quant_scale)
        fail(std::string(name) + ".pre_quant_scale is " +
             (t.pre_quant_scale.empty() ? "missing" : "present") + " but the spec says " +
             "pre_quant_scale " + (spec.weights.pre_quant_scale ? "true" : "false"));
    }
    if (want == WeightFormat::kFP8PerTensor &&
        t.input_scale.empty() != spec.weights.dynamic_activations)
      fail(std::string(name) + ".input_scale is " +
           (t.input_scale.empty() ? "missing" : "present") +
           " but the spec says dynamic_activations " +
           (spec.weights.dynamic_activations ? "true" : "false"));
    t.check_sizes(name);
    if (has_e8m0_scales(want)) {
      // A NaN scale would turn its whole group into NaN: refused (types.hpp).
      const auto it = std::find(t.scale_bytes.begin(), t.scale_bytes.end(), uint8_t{0xff});
      if (it != t.scale_bytes.end()) {
        const int64_t k = it - t.scale_bytes.begin(), groups = t.cols / group_of(t);
        fail(std::string(name) + ".scale_bytes holds the e8m0 NaN scale 0xff at expert " +
             std::to_string(k / (t.rows * groups)) + ", row " +
             std::to_string(k / groups % t.rows) + ", group " + std::to_string(k % groups));
      }
    }
  };
  check_tensor(w.fc1, "fc1", lp.fc1_rows, lp.hidden);
  check_tensor(w.fc2, "fc2", lp.hidden, lp.intermediate);

  auto expect_size = [&](const char* field, std::size_t have, int64_t need) {
    if (static_cast<int64_t>(have) != need)
      fail(std::string(field) + " has " + std::to_string(have) + " elements but the " +
           (need == 0 ? "spec asks for none" : "local problem needs " + std::to_string(need)));
  };
  expect_size("fc1_bias", w.fc1_bias.size(), spec.fc1_bias ? lp.num_experts * lp.fc1_rows : 0);
  expect_size("fc2_bias", w.fc2_bias.size(), spec.fc2_bias ? lp.num_experts * lp.hidden : 0);
  expect_size("routing_bias", w.routing_bias.size(),
              spec.routing.correction_bias ? lp.num_experts_global : 0);
}

}  // namespace moekit
