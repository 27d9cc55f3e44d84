// Loading and saving one MoE layer's experts in a model family's layout. Every family reduces to
// "which source row holds (gate or up, intermediate index i)"; packing.cpp does the copying.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

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

void load_per_expert(const Ctx& c, const TensorIndex& idx, MoeWeights& w) {
  const Packing& pk = c.pk;
  const int64_t I = c.spec.intermediate, H = c.spec.hidden;
  const StDtype vd = value_dtype(c.spec.weights);
  const auto runs = fc1_load_runs(c, [](int p, int64_t i) { return std::make_pair(p, i); });
  // Block scales are fp32 in DeepSeek-V3; other fp8 exports use bf16 / fp16: widened here.
  std::vector<float> wide[3];
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, std::vector<float>& tmp) {
    const auto v = idx.expect(name, vd, {rows, pk.value_cols(cols)});
    const uint8_t* s = nullptr;
    if (pk.scale_size) {
      const auto h = idx.expect_float(name + c.fam.block_scale_suffix,
                                      {pk.scale_rows(rows), pk.scale_cols(cols)});
      s = h.data();
      if (h.info->dtype != StDtype::kF32) {
        tmp.resize(static_cast<std::size_t>(h.info->numel()));
        load_floats(h, 0, h.info->numel(), tmp.data());
        s = reinterpret_cast<const uint8_t*>(tmp.data());
      }
    }
    return file_matrix(pk, v.data(), s, nullptr, 0, rows, cols);
  };
  for (int64_t el = 0; el < c.lp.num_experts; ++el) {
    const int64_t e = c.lp.first_expert + el;
    const std::string gname = c.name(c.fam.gate_proj, e);
    const MatRef src[2] = {matrix(gname, I, H, wide[0]),
                           matrix(c.name(c.fam.up_proj, e), I, H, wide[1])};
    const MatOut o1 = expert_out(pk, w.fc1, el);
    for (const Run& r : runs)
      copy_rows(pk, src[r.src], r.src_row, o1, r.dst_row, r.count, 0, gname);
    const std::string dname = c.name(c.fam.down_proj, e);
    copy_rows(pk, matrix(dname, H, I, wide[2]), 0, expert_out(pk, w.fc2, el), 0, H,
              c.lp.intermediate_offset, dname);
  }
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
          p.scales = idx.expect(prefix + ".scales", scale_dtypes_read(pk.format),
                                {E, pk.scale_rows(rows), pk.scale_cols(cols)})
                         .data();
        }
        if (pk.zeros) {
          p.zeros =
              idx.expect(prefix + ".zeros", StDtype::kU8, {E, rows, pk.scale_cols(cols)}).data();
        }
      } else {  // gpt-oss MXFP4: blocks [E, rows, cols/32, 16], scales [E, rows, cols/32]
        const int64_t g = pk.group;
        p.values = idx.expect(prefix + c.fam.blocks_suffix, StDtype::kU8,
                              {E, rows, pk.scale_cols(cols), pk.row_bytes(g)});
        p.scales = idx.expect(prefix + c.fam.scales_suffix, scale_dtypes_read(pk.format),
                              {E, rows, pk.scale_cols(cols)})
                       .data();
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
      const int64_t n = c.lp.num_experts, first = c.lp.first_expert;
      auto scalars = [&](const std::string& prefix, std::vector<float>& dst, const char* suffix) {
        load_floats(idx.expect(prefix + suffix, StDtype::kF32, {E}), first, n, dst.data());
      };
      if (pk.weight_scale) {
        scalars(p1, w.fc1.weight_scale, ".weight_scale");
        scalars(p2, w.fc2.weight_scale, ".weight_scale");
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
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    out.push_back(blank(name, vd, {rows, pk.value_cols(cols)}));
    if (pk.scale_size) {
      out.push_back(blank(name + c.fam.block_scale_suffix, scale_dtype(pk.format),
                          {pk.scale_rows(rows), pk.scale_cols(cols)}));
      return tensor_matrix(pk, out[out.size() - 2], &out.back(), 0, rows, cols);
    }
    return tensor_matrix(pk, out.back(), nullptr, 0, rows, cols);
  };
  out.reserve(out.size() + static_cast<std::size_t>(c.spec.num_experts) * (pk.scale_size ? 6 : 3));
  for (int p = 0; p < 2; ++p) {
    const auto runs = make_runs(I, [&](int64_t i) {
      return std::make_pair(0, fused_row(true, c.spec.gate_up_layout, I, p, i));
    });
    for (int64_t e = 0; e < c.spec.num_experts; ++e) {
      const std::string name = c.name(p == 0 ? c.fam.gate_proj : c.fam.up_proj, e);
      const MatOut o = matrix(name, I, H);
      const MatRef s = expert_ref(pk, w.fc1, e);
      for (const Run& r : runs) copy_rows(pk, s, r.src_row, o, r.dst_row, r.count, 0, name);
    }
  }
  for (int64_t e = 0; e < c.spec.num_experts; ++e) {
    const std::string name = c.name(c.fam.down_proj, e);
    const MatOut o = matrix(name, H, I);
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

}  // namespace
}  // namespace io

MoeWeights load_layer_weights(const std::vector<std::string>& files, const ModelFamily& family,
                              int layer, const MoeSpec& spec) {
  const io::Ctx c = io::make_ctx(family, layer, spec);
  const io::TensorIndex idx(files);
  MoeWeights w;
  w.fc1 = io::alloc_tensor(spec.weights, c.lp.num_experts, c.lp.fc1_rows, c.lp.hidden);
  w.fc2 = io::alloc_tensor(spec.weights, c.lp.num_experts, c.lp.hidden, c.lp.intermediate);
  if (family.storage == ExpertStorage::kPerExpert)
    io::load_per_expert(c, idx, w);
  else
    io::load_fused(c, idx, w);
  if (spec.routing.correction_bias) {
    const auto h = idx.expect_float(c.name(family.correction_bias), {spec.num_experts});
    w.routing_bias.resize(static_cast<std::size_t>(spec.num_experts));
    io::load_floats(h, 0, spec.num_experts, w.routing_bias.data());
  }
  check_weights(spec, w);
  return w;
}

std::vector<NamedTensor> layer_weight_tensors(const ModelFamily& family, int layer,
                                              const MoeSpec& spec, const MoeWeights& weights,
                                              std::map<std::string, std::string>* metadata) {
  const io::Ctx c = io::make_ctx(family, layer, spec);
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
