// The built-in model families: how real checkpoints name and lay out one layer's experts.
#include "io/model_family.hpp"

#include <algorithm>

#include "moekit/io.hpp"
#include "moekit/status.hpp"

namespace moekit {
namespace {

std::vector<ModelFamily> build_families() {
  using F = WeightFormat;
  std::vector<ModelFamily> v;

  ModelFamily per_expert;
  per_expert.storage = ExpertStorage::kPerExpert;
  // Dense checkpoints, the fine-grained fp8 ones (DeepSeek-V3, Qwen3-*-FP8: weight_scale_inv),
  // NVIDIA ModelOpt's NVFP4 exports (weight, weight_scale, weight_scale_2, input_scale), and
  // AWQ / GPTQ int4 and int8 packs (qweight, qzeros, scales, g_idx; awq_gptq.hpp).
  per_expert.formats = {F::kBF16,  F::kFP16,      F::kFP32,     F::kFP8Block128,
                        F::kNVFP4, F::kInt4Group, F::kInt8Group};
  per_expert.block_scale_suffix = "_scale_inv";

  {
    ModelFamily f = per_expert;
    f.name = "mixtral";
    f.description = "Mixtral: block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down)";
    const std::string p = "model.layers.{L}.block_sparse_moe.";
    f.gate_proj = p + "experts.{e}.w1.weight";
    f.up_proj = p + "experts.{e}.w3.weight";
    f.down_proj = p + "experts.{e}.w2.weight";
    f.router_weight = p + "gate.weight";
    v.push_back(f);
  }
  {
    ModelFamily f = per_expert;
    f.name = "qwen3_moe";
    f.description = "Qwen3-MoE: mlp.experts.{e}.gate_proj / up_proj / down_proj";
    const std::string p = "model.layers.{L}.mlp.";
    f.gate_proj = p + "experts.{e}.gate_proj.weight";
    f.up_proj = p + "experts.{e}.up_proj.weight";
    f.down_proj = p + "experts.{e}.down_proj.weight";
    f.router_weight = p + "gate.weight";
    v.push_back(f);
  }
  {
    ModelFamily f = v.back();  // same expert names as Qwen3-MoE
    f.name = "deepseek_v3";
    f.description =
        "DeepSeek-V3: mlp.experts.{e}.gate_proj / up_proj / down_proj, fp8 weight_scale_inv "
        "128x128 blocks, mlp.gate.e_score_correction_bias";
    f.correction_bias = "model.layers.{L}.mlp.gate.e_score_correction_bias";
    v.push_back(f);
  }
  {
    ModelFamily f;
    f.name = "gpt_oss";
    f.description =
        "gpt-oss: fused mlp.experts.gate_up_proj (gate/up interleaved) and down_proj, MXFP4 "
        "_blocks/_scales, bf16 biases";
    f.storage = ExpertStorage::kFused;
    f.formats = {F::kMXFP4, F::kBF16, F::kFP16, F::kFP32};
    const std::string p = "model.layers.{L}.mlp.";
    f.fused_gate_up = p + "experts.gate_up_proj";
    f.fused_down = p + "experts.down_proj";
    f.fused_layout = GateUpLayout::kInterleaved;
    f.gate_up_bias = p + "experts.gate_up_proj_bias";
    f.down_bias = p + "experts.down_proj_bias";
    f.bias_dtype = DType::kBFloat16;
    f.router_weight = p + "router.weight";
    f.router_bias = p + "router.bias";
    v.push_back(f);
  }
  {
    ModelFamily f;
    f.name = "llama4";
    f.description =
        "Llama-4: fused feed_forward.experts.gate_up_proj [E, H, 2I] (gate then up) and "
        "down_proj [E, I, H]";
    f.storage = ExpertStorage::kFused;
    f.formats = {F::kBF16, F::kFP16, F::kFP32};
    const std::string p = "language_model.model.layers.{L}.feed_forward.";
    f.fused_gate_up = p + "experts.gate_up_proj";
    f.fused_down = p + "experts.down_proj";
    f.fused_layout = GateUpLayout::kHalves;
    f.router_weight = p + "router.weight";
    v.push_back(f);
  }
  {
    ModelFamily f;
    f.name = "moekit";
    f.description = "moekit's own layout: any weight format, the in-memory buffers as they are";
    f.storage = ExpertStorage::kNative;
    f.formats = {F::kBF16,      F::kFP16,      F::kFP32,  F::kFP8PerTensor, F::kFP8Block128,
                 F::kInt8Group, F::kInt4Group, F::kMXFP4, F::kNVFP4,        F::kMXFP8};
    f.fused_gate_up = "layers.{L}.experts.fc1";
    f.fused_down = "layers.{L}.experts.fc2";
    f.gate_up_bias = "layers.{L}.experts.fc1_bias";
    f.down_bias = "layers.{L}.experts.fc2_bias";
    f.bias_dtype = DType::kFloat32;  // lossless
    f.correction_bias = "layers.{L}.routing_bias";
    v.push_back(f);
  }
  return v;
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = build_families();
  return families;
}

const ModelFamily& find_model_family(std::string_view name) {
  for (const ModelFamily& f : model_families())
    if (f.name == name) return f;
  std::string known;
  for (const ModelFamily& f : model_families()) known += (known.empty() ? "" : ", ") + f.name;
  throw Error(ErrorCode::kNotFound,
              "unknown model family '" + std::string(name) + "'; known families: " + known);
}

std::string expand_tensor_name(std::string_view pattern, int layer, int64_t expert) {
  std::string out;
  out.reserve(pattern.size() + 8);
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 3, "{L}") == 0) {
      out += std::to_string(layer);
      i += 3;
    } else if (pattern.compare(i, 3, "{e}") == 0) {
      out += std::to_string(expert);
      i += 3;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

}  // namespace moekit

namespace moekit::io {

void check_family_supports(const ModelFamily& family, const MoeSpec& spec) {
  const WeightFormat f = spec.weights.format;
  bool has = false;
  std::string names;
  for (WeightFormat g : family.formats) {
    has = has || g == f;
    names += (names.empty() ? "" : ", ") + std::string(to_string(g));
  }
  auto unsupported = [&](const std::string& why) {
    throw Error(ErrorCode::kUnsupported, "model family " + family.name + " " + why);
  };
  if (!has) {
    unsupported(std::string("stores weight formats ") + names + ", not weights.format " +
                to_string(f));
  }
  if (family.storage != ExpertStorage::kNative && !activation_is_gated(spec.activation.kind)) {
    unsupported(std::string("stores gated (gate and up) experts, but activation ") +
                to_string(spec.activation.kind) + " is not gated");
  }
  if (spec.fc1_bias && family.gate_up_bias.empty())
    unsupported("has no FC1 (gate/up) bias, but fc1_bias is set");
  if (spec.fc2_bias && family.down_bias.empty())
    unsupported("has no FC2 (down) bias, but fc2_bias is set");
  if (spec.routing.correction_bias && family.correction_bias.empty()) {
    unsupported("has no routing correction bias, but routing.correction_bias is set");
  }
  if (family.storage == ExpertStorage::kFused && format_value_bits(f) < 16 &&
      f != WeightFormat::kMXFP4 && f != WeightFormat::kMXFP8) {
    // Fused files hold dense tensors or the MX pair (_blocks, _scales) and nothing else.
    unsupported(std::string("stores fused experts as dense tensors or MX blocks and scales, not ") +
                to_string(f));
  }
  if (family.storage == ExpertStorage::kPerExpert && format_value_bits(f) < 16 &&
      f != WeightFormat::kFP8Block128 && f != WeightFormat::kNVFP4 &&
      f != WeightFormat::kInt4Group && f != WeightFormat::kInt8Group) {
    // Per-expert files hold dense tensors, fp8 with block scales (weight_scale_inv),
    // ModelOpt's NVFP4 or AWQ / GPTQ int packs.
    unsupported(std::string("stores one tensor per expert as dense, fp8 block-128, nvfp4 or "
                            "AWQ / GPTQ int4 / int8, not ") +
                to_string(f));
  }
  if (family.storage == ExpertStorage::kPerExpert && format_row_block(f) > 1 &&
      spec.gate_up_layout == GateUpLayout::kInterleaved) {
    // Interleaving separate gate and up tensors would cut the 128-row scale blocks.
    unsupported(std::string("stores gate and up apart with ") + to_string(f) +
                " row-block scales, which cannot be interleaved (gate_up_layout interleaved)");
  }
  if (family.storage == ExpertStorage::kPerExpert &&
      (family.gate_proj.empty() || family.up_proj.empty() || family.down_proj.empty())) {
    unsupported("stores experts one tensor each but lacks a gate_proj / up_proj / down_proj name");
  }
  if (family.storage != ExpertStorage::kPerExpert &&
      (family.fused_gate_up.empty() || family.fused_down.empty())) {
    unsupported("stores fused experts but lacks a fused_gate_up / fused_down name");
  }
}

TensorIndex::TensorIndex(const std::vector<std::string>& files) {
  if (files.empty()) throw Error(ErrorCode::kInvalidArgument, "no safetensors file was given");
  files_.reserve(files.size());
  for (const std::string& p : files) files_.emplace_back(p);
  for (std::size_t i = 0; i < files_.size(); ++i) {
    for (const TensorInfo& t : files_[i].tensors()) {
      auto [it, inserted] = by_name_.emplace(t.name, std::make_pair(i, &t));
      if (!inserted) {
        throw Error(ErrorCode::kBadFile,
                    "tensor '" + t.name + "' appears in both safetensors file " +
                        files_[it->second.first].path() + " and " + files_[i].path());
      }
    }
  }
}

std::string TensorIndex::files_text() const {
  if (files_.size() == 1) return "safetensors file " + files_[0].path();
  std::string s = "any of the " + std::to_string(files_.size()) + " safetensors files (";
  for (std::size_t i = 0; i < files_.size() && i < 3; ++i) s += (i ? ", " : "") + files_[i].path();
  return s + (files_.size() > 3 ? ", ...)" : ")");
}

std::optional<TensorIndex::Hit> TensorIndex::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return Hit{&files_[it->second.first], it->second.second};
}

TensorIndex::Hit TensorIndex::need(const std::string& name) const {
  auto h = find(name);
  if (!h) throw Error(ErrorCode::kBadFile, "tensor '" + name + "' is missing from " + files_text());
  read_.insert(name);
  return *h;
}

void TensorIndex::refuse_unread(const std::string& prefix, const std::string& options) const {
  for (auto it = by_name_.lower_bound(prefix);
       it != by_name_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    if (read_.count(it->first)) continue;
    throw Error(ErrorCode::kFormatMismatch,
                "safetensors file " + files_[it->second.first].path() + ": tensor '" + it->first +
                    "' is not used by the spec (" + options +
                    "); refusing to ignore it (the file holds another format or options)");
  }
}

void TensorIndex::refuse_present(const std::string& name, const std::string& options) const {
  auto it = by_name_.find(name);
  if (it != by_name_.end() && !read_.count(name)) refuse_unread(name, options);
}

TensorIndex::Hit TensorIndex::expect(const std::string& name, StDtype dtype,
                                     const std::vector<int64_t>& shape) const {
  return expect(name, std::vector<StDtype>{dtype}, shape);
}

TensorIndex::Hit TensorIndex::expect(const std::string& name, const std::vector<StDtype>& dtypes,
                                     const std::vector<int64_t>& shape) const {
  const Hit h = need(name);
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), h.info->dtype) != dtypes.end();
  if (!dtype_ok || h.info->shape != shape) {
    std::string want;
    for (std::size_t i = 0; i < dtypes.size(); ++i)
      want += (i == 0                   ? ""
               : i + 1 == dtypes.size() ? " or "
                                        : ", ") +
              std::string(st_dtype_name(dtypes[i]));
    throw Error(ErrorCode::kBadFile, "safetensors file " + h.file->path() + ": tensor '" + name +
                                         "' is " + st_dtype_name(h.info->dtype) + " " +
                                         shape_to_string(h.info->shape) + ", expected " + want +
                                         " " + shape_to_string(shape));
  }
  return h;
}

TensorIndex::Hit TensorIndex::expect_float(const std::string& name,
                                           const std::vector<int64_t>& shape) const {
  return expect(name, {StDtype::kF32, StDtype::kBF16, StDtype::kF16}, shape);
}

}  // namespace moekit::io
