// Row copying of packed projections; see packing.hpp.
#include "io/packing.hpp"

#include <algorithm>
#include <cstring>

#include "common/numeric.hpp"
#include "moekit/status.hpp"

namespace moekit::io {

Packing packing_of(const WeightQuant& q) {
  using F = WeightFormat;
  Packing pk;
  pk.format = q.format;
  pk.value_bits = format_value_bits(q.format);
  switch (q.format) {
    case F::kBF16:
    case F::kFP16:
    case F::kFP32:
      break;
    case F::kFP8PerTensor:
      pk.weight_scale = true;
      pk.input_scale = !q.dynamic_activations;  // per-token scales: the file holds none
      break;
    case F::kFP8Block128:
      pk.group = format_scale_group(q.format, q.group_size);
      pk.row_block = format_row_block(q.format);
      pk.scale_size = 4;
      break;
    case F::kInt8Group:
    case F::kInt4Group:
      pk.group = format_scale_group(q.format, q.group_size);
      pk.scale_size = 4;
      pk.zeros = q.zero_points;
      pk.pre_quant = q.pre_quant_scale;
      break;
    case F::kMXFP4:
    case F::kMXFP8:
      pk.group = format_scale_group(q.format, q.group_size);
      pk.scale_size = 1;
      break;
    case F::kNVFP4:
      pk.group = format_scale_group(q.format, q.group_size);
      pk.scale_size = 1;
      pk.global_scale = true;
      break;
    default:
      throw Error(ErrorCode::kInvalidArgument, "weight format id " +
                                                   std::to_string(static_cast<int>(q.format)) +
                                                   " is not a known format");
  }
  return pk;
}

StDtype value_dtype(const WeightQuant& q) {
  using F = WeightFormat;
  switch (q.format) {
    case F::kBF16:
      return StDtype::kBF16;
    case F::kFP16:
      return StDtype::kF16;
    case F::kFP32:
      return StDtype::kF32;
    case F::kFP8PerTensor:
    case F::kFP8Block128:
    case F::kMXFP8:
      return StDtype::kF8E4M3;
    case F::kInt8Group:
      return q.zero_points ? StDtype::kU8 : StDtype::kI8;
    default:
      return StDtype::kU8;  // 4-bit formats: two values per byte
  }
}

StDtype scale_dtype(WeightFormat f) {
  switch (f) {
    case WeightFormat::kNVFP4:
      return StDtype::kF8E4M3;
    case WeightFormat::kMXFP4:
    case WeightFormat::kMXFP8:
      return StDtype::kU8;  // e8m0, stored as U8 like gpt-oss does
    default:
      return StDtype::kF32;
  }
}

std::vector<StDtype> scale_dtypes_read(WeightFormat f) {
  if (scale_dtype(f) == StDtype::kU8) return {StDtype::kU8, StDtype::kF8E8M0};
  return {scale_dtype(f)};
}

MatRef expert_ref(const Packing& pk, const QuantizedTensor& t, int64_t e) {
  MatRef m;
  m.rows = t.rows;
  m.cols = t.cols;
  m.values = t.values.data() + e * t.rows * pk.row_bytes(t.cols);
  const int64_t ns = pk.scale_rows(t.rows) * pk.scale_cols(t.cols);
  if (pk.scale_size == 4) m.scales = reinterpret_cast<const uint8_t*>(t.scales.data() + e * ns);
  if (pk.scale_size == 1) m.scales = t.scale_bytes.data() + e * ns;
  if (pk.zeros) m.zeros = t.zeros.data() + e * t.rows * pk.scale_cols(t.cols);
  return m;
}

MatOut expert_out(const Packing& pk, QuantizedTensor& t, int64_t e) {
  const MatRef r = expert_ref(pk, t, e);
  return MatOut{const_cast<uint8_t*>(r.values), const_cast<uint8_t*>(r.scales),
                const_cast<uint8_t*>(r.zeros), r.rows, r.cols};
}

QuantizedTensor alloc_tensor(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols) {
  const Packing pk = packing_of(q);
  QuantizedTensor t;
  t.format = q.format;
  t.experts = experts;
  t.rows = rows;
  t.cols = cols;
  t.group_size = pk.group;
  t.values.resize(static_cast<std::size_t>(experts * rows * pk.row_bytes(cols)));
  const auto ns = static_cast<std::size_t>(experts * pk.scale_rows(rows) * pk.scale_cols(cols));
  if (pk.scale_size == 4) t.scales.resize(ns);
  if (pk.scale_size == 1) t.scale_bytes.resize(ns);
  if (pk.zeros) t.zeros.resize(static_cast<std::size_t>(experts * rows * pk.scale_cols(cols)));
  if (pk.weight_scale) t.weight_scale.resize(static_cast<std::size_t>(experts));
  if (pk.global_scale) t.global_scale.resize(static_cast<std::size_t>(experts));
  if (pk.input_scale) t.input_scale.resize(static_cast<std::size_t>(experts));
  if (pk.pre_quant) t.pre_quant_scale.resize(static_cast<std::size_t>(experts * cols));
  return t;
}

void copy_rows(const Packing& pk, const MatRef& src, int64_t src_row, const MatOut& dst,
               int64_t dst_row, int64_t count, int64_t col0, const std::string& what) {
  const int64_t sb = pk.row_bytes(src.cols), db = pk.row_bytes(dst.cols);
  const int64_t byte0 = col0 * pk.value_bits / 8;
  for (int64_t r = 0; r < count; ++r) {
    std::memcpy(dst.values + (dst_row + r) * db, src.values + (src_row + r) * sb + byte0,
                static_cast<std::size_t>(db));
  }
  if (pk.group == 0) return;
  const int64_t ssc = pk.scale_cols(src.cols), dsc = pk.scale_cols(dst.cols);
  const int64_t sc0 = col0 / pk.group;
  if (pk.zeros) {
    for (int64_t r = 0; r < count; ++r) {
      std::memcpy(dst.zeros + (dst_row + r) * dsc, src.zeros + (src_row + r) * ssc + sc0,
                  static_cast<std::size_t>(dsc));
    }
  }
  if (pk.scale_size == 0) return;
  const int64_t rb = pk.row_block;
  if (rb > 1) {
    // A scale covers rb rows: the run must consist of whole blocks on both sides (a partial
    // last block only where both matrices end).
    const bool ends = src_row + count == src.rows && dst_row + count == dst.rows;
    if (src_row % rb != 0 || dst_row % rb != 0 || (count % rb != 0 && !ends)) {
      throw Error(ErrorCode::kUnsupported,
                  what + ": rows [" + std::to_string(src_row) + ", " +
                      std::to_string(src_row + count) + ") would go to rows [" +
                      std::to_string(dst_row) + ", " + std::to_string(dst_row + count) +
                      "), which cut the " + to_string(pk.format) + " format's " +
                      std::to_string(rb) + "-row scale blocks");
    }
  }
  const int64_t es = pk.scale_size;
  const int64_t nblocks = (count + rb - 1) / rb;
  for (int64_t b = 0; b < nblocks; ++b) {
    std::memcpy(dst.scales + ((dst_row / rb + b) * dsc) * es,
                src.scales + ((src_row / rb + b) * ssc + sc0) * es,
                static_cast<std::size_t>(dsc * es));
  }
}

std::vector<Run> make_runs(int64_t dst_rows,
                           const std::function<std::pair<int, int64_t>(int64_t)>& src_of) {
  std::vector<Run> runs;
  for (int64_t r = 0; r < dst_rows; ++r) {
    const auto [s, row] = src_of(r);
    if (!runs.empty()) {
      Run& b = runs.back();
      if (b.src == s && b.src_row + b.count == row && b.dst_row + b.count == r) {
        ++b.count;
        continue;
      }
    }
    runs.push_back(Run{s, row, r, 1});
  }
  return runs;
}

int64_t fused_row(bool gated, GateUpLayout layout, int64_t inter, int p, int64_t i) {
  if (!gated) return i;
  return layout == GateUpLayout::kInterleaved ? 2 * i + p : p * inter + i;
}

std::pair<int, int64_t> fused_part(bool gated, GateUpLayout layout, int64_t inter, int64_t r) {
  if (!gated) return {0, r};
  if (layout == GateUpLayout::kInterleaved) return {static_cast<int>(r % 2), r / 2};
  return {r < inter ? 0 : 1, r < inter ? r : r - inter};
}

namespace {
// Tiles keep both sides in cache for the large (thousands x thousands) expert matrices; a typed
// element copy (not memcpy per element) keeps a Llama-4-sized layer to seconds.
template <class T>
void transpose_typed(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          T v;
          std::memcpy(&v, src + (r * cols + c) * sizeof(T), sizeof(T));
          std::memcpy(dst + (c * rows + r) * sizeof(T), &v, sizeof(T));
        }
      }
    }
  }
}
}  // namespace

void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, std::size_t esize,
                     uint8_t* dst) {
  switch (esize) {
    case 1:
      return transpose_typed<uint8_t>(src, rows, cols, dst);
    case 2:
      return transpose_typed<uint16_t>(src, rows, cols, dst);
    case 4:
      return transpose_typed<uint32_t>(src, rows, cols, dst);
    case 8:
      return transpose_typed<uint64_t>(src, rows, cols, dst);
    default:
      throw Error(ErrorCode::kInternal, "transpose of " + std::to_string(esize) + "-byte elements");
  }
}

float load_float(StDtype t, const uint8_t* p) {
  switch (t) {
    case StDtype::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case StDtype::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return numeric::bf16_to_float(h);
    }
    case StDtype::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return numeric::fp16_to_float(h);
    }
    default:
      throw Error(ErrorCode::kInternal, std::string("load_float of ") + st_dtype_name(t));
  }
}

void store_float(StDtype t, float v, uint8_t* p) {
  switch (t) {
    case StDtype::kF32:
      std::memcpy(p, &v, 4);
      return;
    case StDtype::kBF16: {
      const uint16_t h = numeric::float_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case StDtype::kF16: {
      const uint16_t h = numeric::float_to_fp16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    default:
      throw Error(ErrorCode::kInternal, std::string("store_float of ") + st_dtype_name(t));
  }
}

}  // namespace moekit::io
