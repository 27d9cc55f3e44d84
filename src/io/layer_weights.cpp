// Loading and saving one MoE layer's experts in a model family's layout. Every family reduces to
// "which source row holds (gate or up, intermediate index i)"; packing.cpp does the copying.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/awq_gptq.hpp"
#include "io/model_family.hpp"
#include "io/packing.hpp"
#include "io/safetensors.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"

namespace moekit {
namespace io {
namespace {

// Metadata keys of the kNative family (per layer, so one file can hold several layers).
std::string meta_key(int layer, const char* what) {
  return "moekit.layers." + std::to_string(layer) + "." + what;
}

// ModelOpt's NVFP4 tensors beside a projection's `weight` (TensorRT-LLM and vLLM read these
// names): weight_scale = e4m3 block scales [rows, cols/16], weight_scale_2 = fp32 global scale
// (a scalar), input_scale = fp32 activation scale (W4A4 only: checked, not used; types.hpp).
constexpr const char* kModelOptBlockScaleSuffix = "_scale";
constexpr const char* kModelOptGlobalScaleSuffix = "_scale_2";
constexpr const char* kModelOptInputScale = "input_scale";

// The start shared by a projection's tensors: its name up to the last dot, kept
// ("...gate_proj.weight" -> "...gate_proj."); a name without a dot is its own prefix.
std::string projection_prefix(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot + 1);
}

// The tensor beside `name` whose last dot-separated component is `leaf`
// ("...gate_proj.weight" -> "...gate_proj.input_scale").
std::string sibling(const std::string& name, const char* leaf) {
  const std::string p = projection_prefix(name);
  return (p == name ? name + "." : p) + leaf;
}

// The spec's options a file must match, for error messages.
std::string options_text(const MoeSpec& spec) {
  const WeightQuant& q = spec.weights;
  std::string s = std::string("weights.format ") + to_string(q.format);
  if (q.format == WeightFormat::kInt8Group || q.format == WeightFormat::kInt4Group) {
    s += ", zero_points " + std::string(q.zero_points ? "true" : "false") + ", pre_quant_scale " +
         (q.pre_quant_scale ? "true" : "false");
  }
  s += std::string(", fc1_bias ") + (spec.fc1_bias ? "true" : "false") + ", fc2_bias " +
       (spec.fc2_bias ? "true" : "false") + ", routing.correction_bias " +
       (spec.routing.correction_bias ? "true" : "false");
  return s;
}

struct Ctx {
  const ModelFamily& fam;
  int layer;
  const MoeSpec& spec;
  LocalProblem lp;
  Packing pk;
  bool gated;
  std::string name(const std::string& pattern, int64_t e = 0) const {
    return expand_tensor_name(pattern, layer, e);
  }
};

MatRef file_matrix(const Packing& pk, const uint8_t* values, const uint8_t* scales,
                   const uint8_t* zeros, int64_t e, int64_t rows, int64_t cols) {
  MatRef m;
  m.rows = rows;
  m.cols = cols;
  m.values = values + e * rows * pk.row_bytes(cols);
  const int64_t ns = pk.scale_rows(rows) * pk.scale_cols(cols);
  if (scales) m.scales = scales + e * ns * pk.scale_size;
  if (zeros) m.zeros = zeros + e * rows * pk.scale_cols(cols);
  return m;
}

// ---- loading -------------------------------------------------------------------------------

// Rows of the local FC1 from (part, global intermediate index) -> (source, source row).
std::vector<Run> fc1_load_runs(const Ctx& c,
                               const std::function<std::pair<int, int64_t>(int, int64_t)>& src) {
  const int64_t li = c.lp.intermediate, off = c.lp.intermediate_offset;
  return make_runs(c.lp.fc1_rows, [&](int64_t r) {
    const auto [p, i] = fused_part(c.gated, c.spec.gate_up_layout, li, r);
    return src(p, off + i);
  });
}

void load_bias_rows(const TensorIndex::Hit& h, int64_t src_expert, int64_t src_rows,
                    const std::vector<Run>& runs, float* dst) {
  const std::size_t es = st_dtype_size(h.info->dtype);
  const uint8_t* base = h.data() + src_expert * src_rows * es;
  for (const Run& r : runs)
    for (int64_t k = 0; k < r.count; ++k)
      dst[r.dst_row + k] = load_float(h.info->dtype, base + (r.src_row + k) * es);
}

void load_floats(const TensorIndex::Hit& h, int64_t first, int64_t count, float* dst) {
  const std::size_t es = st_dtype_size(h.info->dtype);
  for (int64_t k = 0; k < count; ++k)
    dst[k] = load_float(h.info->dtype, h.data() + (first + k) * es);
}

// An fp32 scalar tensor (shape [] or [1], as exporters write it); Error(kBadFile) otherwise.
float load_scalar_f32(const TensorIndex& idx, const std::string& name) {
  const auto h = idx.need(name);
  const auto& shape = h.info->shape;
  if (h.info->dtype != StDtype::kF32 || shape.size() > 1 || (shape.size() == 1 && shape[0] != 1)) {
    throw Error(ErrorCode::kBadFile, "safetensors file " + h.file->path() + ": tensor '" + name +
                                         "' is " + st_dtype_name(h.info->dtype) + " " +
                                         shape_to_string(shape) + ", expected an F32 scalar");
  }
  return load_float(StDtype::kF32, h.data());
}

// A scale that must be finite and positive (a global or activation scale).
float load_positive_scale(const TensorIndex& idx, const std::string& name) {
  const float v = load_scalar_f32(idx, name);
  if (!(v > 0.0f) || !std::isfinite(v)) {
    throw Error(ErrorCode::kBadFile, "safetensors file " + idx.need(name).file->path() +
                                         ": tensor '" + name + "' is " + std::to_string(v) +
                                         ", not a finite positive scale");
  }
  return v;
}

// The scale array beside a per-expert projection: fp8 block-128 `<weight>_scale_inv` (the
// family's suffix), NVFP4 `<weight>_scale` (ModelOpt).
std::string per_expert_scale_name(const Ctx& c, const std::string& weight) {
  return weight + (c.pk.format == WeightFormat::kNVFP4 ? kModelOptBlockScaleSuffix
                                                       : c.fam.block_scale_suffix);
}

// `packed`: the AWQ / GPTQ layout of int formats (reads_packed_ints), else null.
void load_per_expert(const Ctx& c, const TensorIndex& idx, MoeWeights& w,
                     const PackedLayout* packed) {
  const Packing& pk = c.pk;
  const int64_t I = c.spec.intermediate, H = c.spec.hidden;
  const StDtype vd = value_dtype(c.spec.weights);
  const auto runs = fc1_load_runs(c, [](int p, int64_t i) { return std::make_pair(p, i); });
  // Block scales are fp32 in DeepSeek-V3; other fp8 exports use bf16 / fp16: widened here.
  // AWQ / GPTQ projections are unpacked whole into moekit's layout first. One slot each for
  // gate, up and down.
  std::vector<float> wide[3];
  UnpackedProjection unpacked[3];
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, int slot) {
    if (packed) {
      unpack_projection(idx, *packed, pk, projection_prefix(name), rows, cols, unpacked[slot]);
      return unpacked[slot].ref(rows, cols);
    }
    std::vector<float>& tmp = wide[slot];
    const auto v = idx.expect(name, vd, {rows, pk.value_cols(cols)});
    const uint8_t* s = nullptr;
    const std::vector<int64_t> scale_shape = {pk.scale_rows(rows), pk.scale_cols(cols)};
    if (pk.scale_size == 1) {
      s = idx.expect(per_expert_scale_name(c, name), scale_dtypes_read(pk.format), scale_shape)
              .data();
    } else if (pk.scale_size) {
      const auto h = idx.expect_float(per_expert_scale_name(c, name), scale_shape);
      s = h.data();
      if (h.info->dtype != StDtype::kF32) {
        tmp.resize(static_cast<std::size_t>(h.info->numel()));
        load_floats(h, 0, h.info->numel(), tmp.data());
        s = reinterpret_cast<const uint8_t*>(tmp.data());
      }
    }
    if (pk.global_scale && idx.find(sibling(name, kModelOptInputScale)))
      load_positive_scale(idx, sibling(name, kModelOptInputScale));  // W4A4 only: not used
    return file_matrix(pk, v.data(), s, nullptr, 0, rows, cols);
  };
  for (int64_t el = 0; el < c.lp.num_experts; ++el) {
    const int64_t e = c.lp.first_expert + el;
    const std::string gname = c.name(c.fam.gate_proj, e), uname = c.name(c.fam.up_proj, e);
    const MatRef src[2] = {matrix(gname, I, H, 0), matrix(uname, I, H, 1)};
    const MatOut o1 = expert_out(pk, w.fc1, el);
    for (const Run& r : runs)
      copy_rows(pk, src[r.src], r.src_row, o1, r.dst_row, r.count, 0, gname);
    const std::string dname = c.name(c.fam.down_proj, e);
    copy_rows(pk, matrix(dname, H, I, 2), 0, expert_out(pk, w.fc2, el), 0, H,
              c.lp.intermediate_offset, dname);
    if (pk.pre_quant) {
      const int64_t li = c.lp.intermediate;
      load_pre_quant_scales(idx, projection_prefix(gname), projection_prefix(uname),
                            projection_prefix(dname), H, I, c.lp.intermediate_offset, li,
                            w.fc1.pre_quant_scale.data() + el * H,
                            w.fc2.pre_quant_scale.data() + el * li);
    }
    if (pk.global_scale) {
      // moekit's fused FC1 keeps one global scale per expert: gate and up must agree.
      const std::string g2 = gname + kModelOptGlobalScaleSuffix;
      const std::string u2 = uname + kModelOptGlobalScaleSuffix;
      const float gs = load_positive_scale(idx, g2), us = load_positive_scale(idx, u2);
      if (gs != us) {
        throw Error(ErrorCode::kUnsupported,
                    "tensors '" + g2 + "' (" + std::to_string(gs) + ") and '" + u2 + "' (" +
                        std::to_string(us) +
                        ") differ, but moekit's fused FC1 holds one NVFP4 global scale per expert");
      }
      w.fc1.global_scale[el] = gs;
      w.fc2.global_scale[el] = load_positive_scale(idx, dname + kModelOptGlobalScaleSuffix);
    }
  }
  // Whatever else sits beside the projections (another format's scales, zero points, an AWQ
  // scale, a GPTQ g_idx beside AWQ tensors, a bias) is refused, not ignored.
  const std::string options = options_text(c.spec);
  for (int64_t el = 0; el < c.lp.num_experts; ++el) {
    const int64_t e = c.lp.first_expert + el;
    for (const std::string* pattern : {&c.fam.gate_proj, &c.fam.up_proj, &c.fam.down_proj})
      idx.refuse_unread(projection_prefix(c.name(*pattern, e)), options);
  }
}

// e8m0 0xff is NaN: refused at load (types.hpp), naming file, tensor and position. Scans the
// local experts' scales [experts, rows, groups] of a file tensor.
void refuse_nan_e8m0(const TensorIndex::Hit& h, const std::string& name, int64_t first, int64_t n,
                     int64_t rows, int64_t groups) {
  const uint8_t* s = h.data() + first * rows * groups;
  const uint8_t* end = s + n * rows * groups;
  const uint8_t* it = std::find(s, end, uint8_t{0xff});
  if (it == end) return;
  const int64_t k = it - s;
  throw Error(ErrorCode::kBadFile, "safetensors file " + h.file->path() + ": tensor '" + name +
                                       "' holds the e8m0 NaN scale 0xff at expert " +
                                       std::to_string(first + k / (rows * groups)) + ", row " +
                                       std::to_string(k / groups % rows) + ", group " +
                                       std::to_string(k % groups));
}

// kFused and kNative: one tensor per projection for all experts.
void load_fused(const Ctx& c, const TensorIndex& idx, MoeWeights& w) {
  const Packing& pk = c.pk;
  const int64_t E = c.spec.num_experts, I = c.spec.intermediate, H = c.spec.hidden;
  const int64_t R = c.spec.fc1_rows();
  const bool native = c.fam.storage == ExpertStorage::kNative;
  const std::string p1 = c.name(c.fam.fused_gate_up), p2 = c.name(c.fam.fused_down);
  GateUpLayout layout = c.fam.fused_layout;

  if (native) {
    // The file says which format and gate/up order it holds; a different format is refused.
    const auto h = idx.need(p1 + ".values");
    const auto& meta = h.file->metadata();
    if (auto it = meta.find(meta_key(c.layer, "format")); it != meta.end()) {
      const auto f = weight_format_from_string(it->second);
      if (!f || *f != c.spec.weights.format) {
        throw Error(ErrorCode::kFormatMismatch,
                    "safetensors file " + h.file->path() + " holds layer " +
                        std::to_string(c.layer) + " in weight format " + it->second +
                        ", but the spec's format is " + to_string(c.spec.weights.format));
      }
    }
    if (auto it = meta.find(meta_key(c.layer, "group_size")); it != meta.end()) {
      if (it->second != std::to_string(pk.group)) {
        throw Error(ErrorCode::kFormatMismatch,
                    "safetensors file " + h.file->path() + " holds layer " +
                        std::to_string(c.layer) + " with scale group " + it->second +
                        ", but the spec's " + to_string(c.spec.weights.format) + " uses group " +
                        std::to_string(pk.group));
      }
    }
    layout = c.spec.gate_up_layout;
    if (auto it = meta.find(meta_key(c.layer, "gate_up_layout")); it != meta.end()) {
      if (it->second == to_string(GateUpLayout::kHalves))
        layout = GateUpLayout::kHalves;
      else if (it->second == to_string(GateUpLayout::kInterleaved))
        layout = GateUpLayout::kInterleaved;
      else
        throw Error(ErrorCode::kBadFile, "safetensors file " + h.file->path() + ": metadata " +
                                             meta_key(c.layer, "gate_up_layout") + " is '" +
                                             it->second + "', not halves or interleaved");
    }
  }
  const auto runs = fc1_load_runs(
      c, [&](int p, int64_t i) { return std::make_pair(0, fused_row(c.gated, layout, I, p, i)); });
  const std::string what1 = native ? p1 + ".values" : p1;

  const bool dense = !native && pk.value_bits >= 16;
  if (dense) {
    // Stored in-features first ([E, H, R], [E, I, H]): transpose one expert at a time.
    const StDtype vd = value_dtype(c.spec.weights);
    const std::size_t es = st_dtype_size(vd);
    const auto g = idx.expect(p1, vd, {E, H, R});
    const auto d = idx.expect(p2, vd, {E, I, H});
    std::vector<uint8_t> tmp(static_cast<std::size_t>(std::max(R * H, I * H)) * es);
    for (int64_t el = 0; el < c.lp.num_experts; ++el) {
      const int64_t e = c.lp.first_expert + el;
      transpose_bytes(g.data() + e * H * R * es, H, R, es, tmp.data());
      const MatRef s1 = file_matrix(pk, tmp.data(), nullptr, nullptr, 0, R, H);
      const MatOut o1 = expert_out(pk, w.fc1, el);
      for (const Run& r : runs) copy_rows(pk, s1, r.src_row, o1, r.dst_row, r.count, 0, p1);
      transpose_bytes(d.data() + e * I * H * es, I, H, es, tmp.data());
      copy_rows(pk, file_matrix(pk, tmp.data(), nullptr, nullptr, 0, H, I), 0,
                expert_out(pk, w.fc2, el), 0, H, c.lp.intermediate_offset, p2);
    }
  } else {
    // Out-features first, packed as moekit packs the format.
    const bool e8m0 = pk.format == WeightFormat::kMXFP4 || pk.format == WeightFormat::kMXFP8;
    const int64_t first = c.lp.first_expert, n = c.lp.num_experts;
    struct Parts {
      TensorIndex::Hit values;
      const uint8_t* scales = nullptr;
      const uint8_t* zeros = nullptr;
    };
    auto parts = [&](const std::string& prefix, int64_t rows, int64_t cols) {
      Parts p;
      if (native) {
        p.values = idx.expect(prefix + ".values", value_dtype(c.spec.weights),
                              {E, rows, pk.value_cols(cols)});
        if (pk.scale_size) {
          const auto h = idx.expect(prefix + ".scales", scale_dtypes_read(pk.format),
                                    {E, pk.scale_rows(rows), pk.scale_cols(cols)});
          if (e8m0) refuse_nan_e8m0(h, prefix + ".scales", first, n, rows, pk.scale_cols(cols));
          p.scales = h.data();
        }
        if (pk.zeros) {
          p.zeros =
              idx.expect(prefix + ".zeros", StDtype::kU8, {E, rows, pk.scale_cols(cols)}).data();
        }
      } else {  // gpt-oss MXFP4: blocks [E, rows, cols/32, 16], scales [E, rows, cols/32]
        const int64_t g = pk.group;
        p.values = idx.expect(prefix + c.fam.blocks_suffix, StDtype::kU8,
                              {E, rows, pk.scale_cols(cols), pk.row_bytes(g)});
        const auto h = idx.expect(prefix + c.fam.scales_suffix, scale_dtypes_read(pk.format),
                                  {E, rows, pk.scale_cols(cols)});
        if (e8m0)
          refuse_nan_e8m0(h, prefix + c.fam.scales_suffix, first, n, rows, pk.scale_cols(cols));
        p.scales = h.data();
      }
      return p;
    };
    const Parts a = parts(p1, R, H), b = parts(p2, H, I);
    for (int64_t el = 0; el < c.lp.num_experts; ++el) {
      const int64_t e = c.lp.first_expert + el;
      const MatRef s1 = file_matrix(pk, a.values.data(), a.scales, a.zeros, e, R, H);
      const MatOut o1 = expert_out(pk, w.fc1, el);
      for (const Run& r : runs) copy_rows(pk, s1, r.src_row, o1, r.dst_row, r.count, 0, what1);
      copy_rows(pk, file_matrix(pk, b.values.data(), b.scales, b.zeros, e, H, I), 0,
                expert_out(pk, w.fc2, el), 0, H, c.lp.intermediate_offset, p2);
    }
    if (native) {
      // Per-expert scalars and the AWQ scales (sliced along FC2's columns like its weights).
      auto scalars = [&](const std::string& prefix, std::vector<float>& dst, const char* suffix) {
        load_floats(idx.expect(prefix + suffix, StDtype::kF32, {E}), first, n, dst.data());
      };
      if (pk.weight_scale) {
        scalars(p1, w.fc1.weight_scale, ".weight_scale");
        scalars(p2, w.fc2.weight_scale, ".weight_scale");
      }
      if (pk.global_scale) {
        scalars(p1, w.fc1.global_scale, ".global_scale");
        scalars(p2, w.fc2.global_scale, ".global_scale");
      }
      if (pk.input_scale) {
        scalars(p1, w.fc1.input_scale, ".input_scale");
        scalars(p2, w.fc2.input_scale, ".input_scale");
      }
      if (pk.pre_quant) {
        const auto q1 = idx.expect(p1 + ".pre_quant_scale", StDtype::kF32, {E, H});
        const auto q2 = idx.expect(p2 + ".pre_quant_scale", StDtype::kF32, {E, I});
        const int64_t li = c.lp.intermediate;
        for (int64_t el = 0; el < n; ++el) {
          load_floats(q1, (first + el) * H, H, w.fc1.pre_quant_scale.data() + el * H);
          load_floats(q2, (first + el) * I + c.lp.intermediate_offset, li,
                      w.fc2.pre_quant_scale.data() + el * li);
        }
      }
    }
  }

  // Biases: fc1 in the file's gate/up order, fc2 whole (derive_local decides who adds it).
  if (c.spec.fc1_bias) {
    const std::string bn = c.name(c.fam.gate_up_bias);
    const auto h = idx.expect_float(bn, {E, R});
    w.fc1_bias.resize(static_cast<std::size_t>(c.lp.num_experts * c.lp.fc1_rows));
    for (int64_t el = 0; el < c.lp.num_experts; ++el)
      load_bias_rows(h, c.lp.first_expert + el, R, runs, w.fc1_bias.data() + el * c.lp.fc1_rows);
  }
  if (c.spec.fc2_bias) {
    const auto h = idx.expect_float(c.name(c.fam.down_bias), {E, H});
    w.fc2_bias.resize(static_cast<std::size_t>(c.lp.num_experts * H));
    load_floats(h, c.lp.first_expert * H, c.lp.num_experts * H, w.fc2_bias.data());
  }
  // Every tensor named after the projections (zero points, AWQ or other scales, biases: the
  // names of both families' parts start with these) must have been read.
  const std::string options = options_text(c.spec);
  idx.refuse_unread(p1, options);
  idx.refuse_unread(p2, options);
}

// ---- saving --------------------------------------------------------------------------------

NamedTensor blank(std::string name, StDtype dtype, std::vector<int64_t> shape) {
  NamedTensor t;
  t.name = std::move(name);
  t.dtype = *to_dtype(dtype);
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * st_dtype_size(dtype));
  return t;
}

MatOut tensor_matrix(const Packing& pk, NamedTensor& values, NamedTensor* scales, int64_t e,
                     int64_t rows, int64_t cols) {
  const MatRef r = file_matrix(pk, values.bytes.data(), scales ? scales->bytes.data() : nullptr,
                               nullptr, e, rows, cols);
  return MatOut{const_cast<uint8_t*>(r.values), const_cast<uint8_t*>(r.scales), nullptr, rows,
                cols};
}

NamedTensor floats_tensor(std::string name, StDtype dtype, std::vector<int64_t> shape,
                          const float* v) {
  NamedTensor t = blank(std::move(name), dtype, std::move(shape));
  const std::size_t es = st_dtype_size(dtype);
  for (int64_t k = 0; k < t.numel(); ++k) store_float(dtype, v[k], t.bytes.data() + k * es);
  return t;
}

// Raw copy of a vector into a tensor of the given dtype and shape.
template <class T>
NamedTensor raw_tensor(std::string name, StDtype dtype, std::vector<int64_t> shape,
                       const std::vector<T>& v) {
  NamedTensor t = blank(std::move(name), dtype, std::move(shape));
  if (t.bytes.size() != v.size() * sizeof(T)) {
    throw Error(ErrorCode::kInternal, "tensor '" + t.name + "' has " +
                                          std::to_string(v.size() * sizeof(T)) +
                                          " bytes for shape " + shape_to_string(t.shape));
  }
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

void save_per_expert(const Ctx& c, const MoeWeights& w, std::vector<NamedTensor>& out) {
  const Packing& pk = c.pk;
  const int64_t I = c.spec.intermediate, H = c.spec.hidden;
  const StDtype vd = value_dtype(c.spec.weights);
  // NVFP4 also gets ModelOpt's weight_scale_2 (the expert's global scale; no input_scale).
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, const float* global) {
    out.push_back(blank(name, vd, {rows, pk.value_cols(cols)}));
    if (pk.scale_size) {
      out.push_back(blank(per_expert_scale_name(c, name), scale_dtype(pk.format),
                          {pk.scale_rows(rows), pk.scale_cols(cols)}));
      if (pk.global_scale)
        out.push_back(floats_tensor(name + kModelOptGlobalScaleSuffix, StDtype::kF32, {}, global));
      const std::size_t v = out.size() - (pk.global_scale ? 3 : 2);
      return tensor_matrix(pk, out[v], &out[v + 1], 0, rows, cols);
    }
    return tensor_matrix(pk, out.back(), nullptr, 0, rows, cols);
  };
  out.reserve(out.size() + static_cast<std::size_t>(c.spec.num_experts) * (pk.scale_size ? 9 : 3));
  for (int p = 0; p < 2; ++p) {
    const auto runs = make_runs(I, [&](int64_t i) {
      return std::make_pair(0, fused_row(true, c.spec.gate_up_layout, I, p, i));
    });
    for (int64_t e = 0; e < c.spec.num_experts; ++e) {
      const std::string name = c.name(p == 0 ? c.fam.gate_proj : c.fam.up_proj, e);
      const MatOut o = matrix(name, I, H, pk.global_scale ? &w.fc1.global_scale[e] : nullptr);
      const MatRef s = expert_ref(pk, w.fc1, e);
      for (const Run& r : runs) copy_rows(pk, s, r.src_row, o, r.dst_row, r.count, 0, name);
    }
  }
  for (int64_t e = 0; e < c.spec.num_experts; ++e) {
    const std::string name = c.name(c.fam.down_proj, e);
    const MatOut o = matrix(name, H, I, pk.global_scale ? &w.fc2.global_scale[e] : nullptr);
    copy_rows(pk, expert_ref(pk, w.fc2, e), 0, o, 0, H, 0, name);
  }
}

void save_fused(const Ctx& c, const MoeWeights& w, std::vector<NamedTensor>& out,
                std::map<std::string, std::string>& meta) {
  const Packing& pk = c.pk;
  const int64_t E = c.spec.num_experts, I = c.spec.intermediate, H = c.spec.hidden;
  const int64_t R = c.spec.fc1_rows();
  const bool native = c.fam.storage == ExpertStorage::kNative;
  const std::string p1 = c.name(c.fam.fused_gate_up), p2 = c.name(c.fam.fused_down);
  const GateUpLayout layout = native ? c.spec.gate_up_layout : c.fam.fused_layout;
  // File row r <- moekit row holding the same (part, index).
  const auto runs = make_runs(R, [&](int64_t r) {
    const auto [p, i] = fused_part(c.gated, layout, I, r);
    return std::make_pair(0, fused_row(c.gated, c.spec.gate_up_layout, I, p, i));
  });

  if (native) {
    const WeightQuant& q = c.spec.weights;
    meta[meta_key(c.layer, "format")] = to_string(q.format);
    meta[meta_key(c.layer, "gate_up_layout")] = to_string(c.spec.gate_up_layout);
    meta[meta_key(c.layer, "group_size")] = std::to_string(pk.group);
    auto dump = [&](const std::string& prefix, const QuantizedTensor& t, int64_t rows,
                    int64_t cols) {
      out.push_back(
          raw_tensor(prefix + ".values", value_dtype(q), {E, rows, pk.value_cols(cols)}, t.values));
      const std::vector<int64_t> ss = {E, pk.scale_rows(rows), pk.scale_cols(cols)};
      if (pk.scale_size == 4)
        out.push_back(raw_tensor(prefix + ".scales", StDtype::kF32, ss, t.scales));
      if (pk.scale_size == 1)
        out.push_back(raw_tensor(prefix + ".scales", scale_dtype(q.format), ss, t.scale_bytes));
      if (pk.zeros)
        out.push_back(
            raw_tensor(prefix + ".zeros", StDtype::kU8, {E, rows, pk.scale_cols(cols)}, t.zeros));
      if (pk.weight_scale)
        out.push_back(raw_tensor(prefix + ".weight_scale", StDtype::kF32, {E}, t.weight_scale));
      if (pk.global_scale)
        out.push_back(raw_tensor(prefix + ".global_scale", StDtype::kF32, {E}, t.global_scale));
      if (pk.input_scale)
        out.push_back(raw_tensor(prefix + ".input_scale", StDtype::kF32, {E}, t.input_scale));
      if (pk.pre_quant)
        out.push_back(
            raw_tensor(prefix + ".pre_quant_scale", StDtype::kF32, {E, cols}, t.pre_quant_scale));
    };
    dump(p1, w.fc1, R, H);
    dump(p2, w.fc2, H, I);
  } else if (pk.value_bits >= 16) {
    const StDtype vd = value_dtype(c.spec.weights);
    const std::size_t es = st_dtype_size(vd);
    out.push_back(blank(p1, vd, {E, H, R}));
    NamedTensor& g = out.back();
    std::vector<uint8_t> tmp(static_cast<std::size_t>(R * H) * es);
    for (int64_t e = 0; e < E; ++e) {
      const MatOut t{tmp.data(), nullptr, nullptr, R, H};
      const MatRef s = expert_ref(pk, w.fc1, e);
      for (const Run& r : runs) copy_rows(pk, s, r.src_row, t, r.dst_row, r.count, 0, p1);
      transpose_bytes(tmp.data(), R, H, es, g.bytes.data() + e * H * R * es);
    }
    out.push_back(blank(p2, vd, {E, I, H}));
    NamedTensor& d = out.back();
    for (int64_t e = 0; e < E; ++e)
      transpose_bytes(expert_ref(pk, w.fc2, e).values, H, I, es, d.bytes.data() + e * I * H * es);
  } else {
    const int64_t g = pk.group;
    auto pair = [&](const std::string& prefix, int64_t rows, int64_t cols) {
      out.push_back(blank(prefix + c.fam.blocks_suffix, StDtype::kU8,
                          {E, rows, pk.scale_cols(cols), pk.row_bytes(g)}));
      out.push_back(blank(prefix + c.fam.scales_suffix, scale_dtype(pk.format),
                          {E, rows, pk.scale_cols(cols)}));
      return std::make_pair(out.size() - 2, out.size() - 1);
    };
    const auto [b1, s1] = pair(p1, R, H);
    for (int64_t e = 0; e < E; ++e) {
      const MatOut o = tensor_matrix(pk, out[b1], &out[s1], e, R, H);
      const MatRef s = expert_ref(pk, w.fc1, e);
      for (const Run& r : runs) copy_rows(pk, s, r.src_row, o, r.dst_row, r.count, 0, p1);
    }
    const auto [b2, s2] = pair(p2, H, I);
    for (int64_t e = 0; e < E; ++e)
      copy_rows(pk, expert_ref(pk, w.fc2, e), 0, tensor_matrix(pk, out[b2], &out[s2], e, H, I), 0,
                H, 0, p2);
  }

  const StDtype bd = from_dtype(c.fam.bias_dtype);
  if (c.spec.fc1_bias) {
    std::vector<float> b(static_cast<std::size_t>(E * R));
    for (int64_t e = 0; e < E; ++e)
      for (const Run& r : runs)
        for (int64_t k = 0; k < r.count; ++k)
          b[e * R + r.dst_row + k] = w.fc1_bias[e * R + r.src_row + k];
    out.push_back(floats_tensor(c.name(c.fam.gate_up_bias), bd, {E, R}, b.data()));
  }
  if (c.spec.fc2_bias)
    out.push_back(floats_tensor(c.name(c.fam.down_bias), bd, {E, H}, w.fc2_bias.data()));
}

Ctx make_ctx(const ModelFamily& family, int layer, const MoeSpec& spec) {
  if (layer < 0)
    throw Error(ErrorCode::kInvalidArgument, "layer " + std::to_string(layer) + " is negative");
  spec.validate_or_throw();
  check_family_supports(family, spec);
  return Ctx{family,
             layer,
             spec,
             derive_local(spec),
             packing_of(spec.weights),
             activation_is_gated(spec.activation.kind)};
}

// `quant_config` is asked only where the spec's format needs it (reads_packed_ints).
MoeWeights load_layer(const std::vector<std::string>& files, const ModelFamily& family, int layer,
                      const MoeSpec& spec,
                      const std::function<QuantizationConfig()>& quant_config) {
  const Ctx c = make_ctx(family, layer, spec);
  const TensorIndex idx(files);
  std::optional<PackedLayout> packed;
  if (reads_packed_ints(family, spec)) {
    const int64_t e = c.lp.first_expert;
    packed = packed_layout(quant_config(), spec,
                           projection_prefix(c.name(family.gate_proj, e)) + "qweight",
                           projection_prefix(c.name(family.down_proj, e)) + "qweight");
  }
  MoeWeights w;
  w.fc1 = alloc_tensor(spec.weights, c.lp.num_experts, c.lp.fc1_rows, c.lp.hidden);
  w.fc2 = alloc_tensor(spec.weights, c.lp.num_experts, c.lp.hidden, c.lp.intermediate);
  if (family.storage == ExpertStorage::kPerExpert)
    load_per_expert(c, idx, w, packed ? &*packed : nullptr);
  else
    load_fused(c, idx, w);
  if (spec.routing.correction_bias) {
    const auto h = idx.expect_float(c.name(family.correction_bias), {spec.num_experts});
    w.routing_bias.resize(static_cast<std::size_t>(spec.num_experts));
    load_floats(h, 0, spec.num_experts, w.routing_bias.data());
  }
  // Biases the spec does not have are refused where the file holds them.
  const std::string options = options_text(spec);
  for (const std::string* pattern :
       {&family.gate_up_bias, &family.down_bias, &family.correction_bias}) {
    if (!pattern->empty()) idx.refuse_present(c.name(*pattern), options);
  }
  check_weights(spec, w);
  return w;
}

}  // namespace
}  // namespace io

MoeWeights load_layer_weights(const std::vector<std::string>& files, const ModelFamily& family,
                              int layer, const MoeSpec& spec) {
  return io::load_layer(files, family, layer, spec, [&] {
    QuantizationConfig q = read_quantization_config(files.front());
    if (q.quant_method.empty()) {
      throw Error(ErrorCode::kBadFile,
                  "the folder of safetensors file " + files.front() +
                      " holds no quantization config (quantization_config in config.json, "
                      "quantize_config.json or quant_config.json), which says whether its " +
                      to_string(spec.weights.format) + " projections are AWQ or GPTQ packs");
    }
    return q;
  });
}

MoeWeights load_layer_weights(const std::vector<std::string>& files, const ModelFamily& family,
                              int layer, const MoeSpec& spec, const QuantizationConfig& quant) {
  return io::load_layer(files, family, layer, spec, [&] { return quant; });
}

std::vector<NamedTensor> layer_weight_tensors(const ModelFamily& family, int layer,
                                              const MoeSpec& spec, const MoeWeights& weights,
                                              std::map<std::string, std::string>* metadata) {
  const io::Ctx c = io::make_ctx(family, layer, spec);
  if (io::reads_packed_ints(family, spec)) {
    throw Error(ErrorCode::kUnsupported,
                "model family " + family.name + " stores " + to_string(spec.weights.format) +
                    " as AWQ or GPTQ packs, which moekit reads but does not write; save to the "
                    "moekit family");
  }
  if (spec.tp_size != 1 || spec.ep_size != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "saving layer weights needs the full (unsharded) set, but the spec has tp_size " +
                    std::to_string(spec.tp_size) + " and ep_size " + std::to_string(spec.ep_size));
  }
  check_weights(spec, weights);  // the copies below trust the buffer sizes
  std::vector<NamedTensor> out;
  std::map<std::string, std::string> meta;
  if (family.storage == ExpertStorage::kPerExpert)
    io::save_per_expert(c, weights, out);
  else
    io::save_fused(c, weights, out, meta);
  if (spec.routing.correction_bias) {
    if (static_cast<int64_t>(weights.routing_bias.size()) != spec.num_experts) {
      throw Error(ErrorCode::kInvalidArgument,
                  "routing_bias has " + std::to_string(weights.routing_bias.size()) +
                      " values, expected num_experts " + std::to_string(spec.num_experts));
    }
    out.push_back(io::floats_tensor(c.name(family.correction_bias), io::StDtype::kF32,
                                    {spec.num_experts}, weights.routing_bias.data()));
  }
  if (metadata) metadata->insert(meta.begin(), meta.end());
  return out;
}

void save_layer_weights(const std::string& file, const ModelFamily& family, int layer,
                        const MoeSpec& spec, const MoeWeights& weights) {
  std::map<std::string, std::string> meta{{"format", "pt"}};  // what HF loaders expect
  const auto tensors = layer_weight_tensors(family, layer, spec, weights, &meta);
  write_tensors(file, tensors, meta);
}

}  // namespace moekit
