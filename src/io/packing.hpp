// Row-level copying of packed expert projections (any WeightFormat), so that every model family's
// layout maps onto moekit's canonical one through the same few functions: a family only says
// which source row holds (gate or up, intermediate index i).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.hpp"
#include "moekit/spec.hpp"
#include "moekit/types.hpp"
#include "moekit/weights.hpp"

namespace moekit::io {

// How one projection [rows, cols] of a format is packed (layouts: include/moekit/types.hpp).
struct Packing {
  WeightFormat format = WeightFormat::kBF16;
  int value_bits = 16;
  int group = 0;       // columns per scale (0: no scale array)
  int row_block = 1;   // rows per scale (128 for kFP8Block128)
  int scale_size = 0;  // bytes per scale: 4 (QuantizedTensor::scales), 1 (scale_bytes), 0 none
  bool zeros = false;
  bool weight_scale = false;  // per-expert fp32 weight_scale (kFP8PerTensor)
  bool global_scale = false;  // per-expert fp32 global scale (kNVFP4)
  bool input_scale = false;   // per-expert fp32 input_scale (kFP8PerTensor)
  bool pre_quant = false;     // [E, cols] fp32 AWQ scale

  int64_t row_bytes(int64_t cols) const { return (cols * value_bits + 7) / 8; }
  int64_t value_cols(int64_t cols) const { return value_bits >= 8 ? cols : row_bytes(cols); }
  int64_t scale_rows(int64_t rows) const { return (rows + row_block - 1) / row_block; }
  int64_t scale_cols(int64_t cols) const { return group > 0 ? (cols + group - 1) / group : 0; }
};
Packing packing_of(const WeightQuant& q);
// The safetensors dtype of the packed values (4-bit formats: U8 holding two values).
StDtype value_dtype(const WeightQuant& q);
// The dtype of the scale array (F32 or U8 / F8_E4M3 for the 8-bit scales).
StDtype scale_dtype(WeightFormat f);
// The dtypes a reader accepts for it (e8m0 scales: U8 or F8_E8M0).
std::vector<StDtype> scale_dtypes_read(WeightFormat f);

// One expert's projection somewhere in memory (a file's bytes or a QuantizedTensor), packed as a
// Packing says. Null pointers for parts the format lacks.
struct MatRef {
  const uint8_t* values = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zeros = nullptr;
  int64_t rows = 0, cols = 0;
};
struct MatOut {
  uint8_t* values = nullptr;
  uint8_t* scales = nullptr;
  uint8_t* zeros = nullptr;
  int64_t rows = 0, cols = 0;
};
MatRef expert_ref(const Packing& pk, const QuantizedTensor& t, int64_t e);
MatOut expert_out(const Packing& pk, QuantizedTensor& t, int64_t e);

// Allocates a QuantizedTensor of q's format and shape with every buffer the format needs.
QuantizedTensor alloc_tensor(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols);

// Copies rows [src_row, src_row + count) of `src`, columns [col0, col0 + dst.cols), into rows
// [dst_row, ...) of `dst`. Formats with row blocks (fp8 block-128) need whole blocks on both
// sides; otherwise Error(kUnsupported) naming `what`.
void copy_rows(const Packing& pk, const MatRef& src, int64_t src_row, const MatOut& dst,
               int64_t dst_row, int64_t count, int64_t col0, const std::string& what);

// A run of consecutive rows taken from one of several source matrices.
struct Run {
  int src = 0;
  int64_t src_row = 0, dst_row = 0, count = 0;
};
// Coalesces the row map dst row r -> (source index, source row) into runs.
std::vector<Run> make_runs(int64_t dst_rows,
                           const std::function<std::pair<int, int64_t>(int64_t)>& src_of);

// Where (part p: 0 gate / 1 up, index i) sits among the rows of a fused FC1 with `inter` rows per
// part; non-gated: row i.
int64_t fused_row(bool gated, GateUpLayout layout, int64_t inter, int p, int64_t i);
// The inverse: (part, index) of fused row r.
std::pair<int, int64_t> fused_part(bool gated, GateUpLayout layout, int64_t inter, int64_t r);

// dst [cols, rows] = transpose of src [rows, cols], elements of `esize` bytes.
void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, std::size_t esize,
                     uint8_t* dst);

// A float-like element (F32, BF16, F16) at `p` (unaligned) as fp32 / stored from fp32.
float load_float(StDtype t, const uint8_t* p);
void store_float(StDtype t, float v, uint8_t* p);

}  // namespace moekit::io
