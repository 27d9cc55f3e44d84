// AWQ and GPTQ packs unpacked into moekit's canonical int layout; see awq_gptq.hpp.
#include "io/awq_gptq.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
#include "moekit/status.hpp"

namespace moekit {
namespace {

// Largest quantization config read (a model's config.json is a few kB).
constexpr uint64_t kMaxConfigBytes = 16'000'000;

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The fields of one quantization config object; `method` is the quant_method a file implies
// when it names none (AutoGPTQ's quantize_config.json: gptq; AutoAWQ's quant_config.json: awq).
QuantizationConfig parse_quantization_config(const nlohmann::json& obj, const std::string& file,
                                             const std::string& method) {
  auto bad_key = [&](const std::string& key, const char* want) {
    throw Error(ErrorCode::kBadFile,
                "quantization config " + file + ": key '" + key + "' is not " + want);
  };
  // The first of `keys` present (synonyms: AutoAWQ's quant_config.json says w_bit, q_group_size
  // and version where transformers' AwqConfig says bits, group_size and version).
  auto find = [&](std::initializer_list<const char*> keys) -> const nlohmann::json* {
    for (const char* k : keys) {
      auto it = obj.find(k);
      if (it != obj.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  };
  auto integer = [&](std::initializer_list<const char*> keys) {
    const nlohmann::json* v = find(keys);
    if (!v) return 0;
    if (!v->is_number_integer() || v->get<int64_t>() < -1 || v->get<int64_t>() > 1'000'000'000)
      bad_key(*keys.begin(), "an integer");
    return v->get<int>();
  };
  auto text = [&](std::initializer_list<const char*> keys) {
    const nlohmann::json* v = find(keys);
    if (!v) return std::string();
    if (!v->is_string()) bad_key(*keys.begin(), "a string");
    return lower(v->get<std::string>());
  };
  QuantizationConfig q;
  q.source = file;
  q.quant_method = text({"quant_method"});
  if (q.quant_method.empty()) q.quant_method = method;
  q.bits = integer({"bits", "w_bit"});
  q.group_size = integer({"group_size", "q_group_size"});
  // GPTQModel saves the format of either method as checkpoint_format; AWQ's own name is version.
  q.format = text({"checkpoint_format", "version"});
  if (const nlohmann::json* m = find({"is_marlin_format"})) {  // AutoGPTQ before checkpoint_format
    if (!m->is_boolean()) bad_key("is_marlin_format", "true or false");
    if (m->get<bool>()) q.format = "marlin";
  }
  return q;
}

}  // namespace

QuantizationConfig read_quantization_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path folder = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  // Where transformers and vLLM look first, then the quantizers' own files.
  struct Candidate {
    const char* name;
    const char* key;  // the object inside the file, or nullptr for the whole file
    const char* method;
  };
  for (const Candidate& cand : {Candidate{"config.json", "quantization_config", ""},
                                Candidate{"quantize_config.json", nullptr, "gptq"},
                                Candidate{"quant_config.json", nullptr, "awq"}}) {
    const std::string file = (folder / cand.name).string();
    if (!fs::exists(fs::path(file), ec)) continue;
    const std::string text = io::read_regular_file(file, kMaxConfigBytes, "quantization config");
    const nlohmann::json j = io::parse_untrusted_json(text, "quantization config " + file);
    if (!j.is_object())
      throw Error(ErrorCode::kBadFile, "quantization config " + file + " is not a JSON object");
    if (!cand.key) return parse_quantization_config(j, file, cand.method);
    const auto it = j.find(cand.key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) {
      throw Error(ErrorCode::kBadFile,
                  "quantization config " + file + ": key '" + cand.key + "' is not an object");
    }
    return parse_quantization_config(*it, file, cand.method);
  }
  return {};
}

namespace io {
namespace {

// AutoAWQ awq/utils/packing_utils.py, AWQ_ORDER: nibble i of a packed word holds out feature
// 8c + kAwqOrder[i] (WQLinear_GEMM.from_linear packs intweight[:, 8c + order_map[i]] << 4i), so
// out feature 8c + j sits in nibble kAwqReverseOrder[j] (AWQ_REVERSE_ORDER).
constexpr int kAwqReverseOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// The I32 word `i` of a tensor (safetensors data is little endian and may be unaligned).
uint32_t word_at(const uint8_t* base, int64_t i) {
  uint32_t w;
  std::memcpy(&w, base + i * 4, 4);
  return w;
}

[[noreturn]] void bad_tensor(ErrorCode code, const TensorIndex::Hit& h, const std::string& name,
                             const std::string& what) {
  throw Error(code, "safetensors file " + h.file->path() + ": tensor '" + name + "' " + what);
}

// GPTQ's g_idx [K]: in feature k's group. Only the trivial k / group maps onto contiguous groups.
// AutoGPTQ auto_gptq/quantization/gptq.py, GPTQ.fasterquant: with actorder (desc_act) the
// columns are quantized in a permuted order and g_idx = [i // groupsize][invperm], which is not
// trivial, unless static_groups, where g_idx = [perm[i] // groupsize][invperm] = k / groupsize.
void check_g_idx(const TensorIndex& idx, const std::string& name, int64_t cols, int group) {
  if (!idx.find(name)) return;  // optional: trivial when absent
  const auto h = idx.expect(name, StDtype::kI32, {cols});
  for (int64_t k = 0; k < cols; ++k) {
    const auto g = static_cast<int32_t>(word_at(h.data(), k));
    if (g != k / group) {
      bad_tensor(ErrorCode::kUnsupported, h, name,
                 "puts in feature " + std::to_string(k) + " in group " + std::to_string(g) +
                     ", not " + std::to_string(k / group) + " = " + std::to_string(k) + " / " +
                     std::to_string(group) +
                     ": an act-order (desc_act) GPTQ checkpoint, whose groups are not contiguous "
                     "in-feature ranges as moekit's int formats need");
    }
  }
}

}  // namespace

bool reads_packed_ints(const ModelFamily& family, const MoeSpec& spec) {
  const WeightFormat f = spec.weights.format;
  return family.storage == ExpertStorage::kPerExpert &&
         (f == WeightFormat::kInt4Group || f == WeightFormat::kInt8Group);
}

PackedLayout packed_layout(const QuantizationConfig& quant, const MoeSpec& spec,
                           const std::string& fc1_tensor, const std::string& fc2_tensor) {
  const std::string fmt = to_string(spec.weights.format);
  if (quant.quant_method.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "the quantization config for the " + fmt +
                                                 " tensors (e.g. '" + fc1_tensor +
                                                 "') names no quant_method (awq or gptq)");
  }
  const std::string where =
      "quantization config" + (quant.source.empty() ? std::string() : " " + quant.source);
  auto fail = [&](ErrorCode code, const std::string& what) {
    throw Error(code, where + ": " + what);
  };
  PackedLayout p;
  p.awq = quant.quant_method == "awq";
  if (!p.awq && quant.quant_method != "gptq") {
    fail(ErrorCode::kUnsupported, "quant_method '" + quant.quant_method + "': moekit reads " + fmt +
                                      " from awq and gptq checkpoints");
  }
  const int want_bits = format_value_bits(spec.weights.format);
  p.bits = quant.bits != 0 ? quant.bits : want_bits;
  if (p.awq && p.bits != 4) {
    // AutoAWQ awq/modules/linear/gemm.py, WQLinear_GEMM.__init__: "Only 4-bit are supported".
    fail(ErrorCode::kUnsupported,
         "bits " + std::to_string(p.bits) + ": AutoAWQ's GEMM layout holds 4-bit values only");
  }
  if (p.bits != 4 && p.bits != 8) {
    fail(ErrorCode::kUnsupported,
         "bits " + std::to_string(p.bits) +
             ": moekit holds 4-bit (int4_group) and 8-bit (int8_group) values only");
  }
  if (p.bits != want_bits) {
    fail(ErrorCode::kFormatMismatch, "bits " + std::to_string(p.bits) + ", but the spec's " + fmt +
                                         " holds " + std::to_string(want_bits) + "-bit values");
  }
  p.group = quant.group_size != 0 ? quant.group_size : spec.weights.group_size;
  if (p.group == -1) {
    fail(ErrorCode::kUnsupported,
         "group_size -1 (one scale per row of all in features): moekit's int groups are 32, 64 "
         "or 128 in features");
  }
  if (p.group <= 0)
    fail(ErrorCode::kBadFile, "group_size " + std::to_string(p.group) + " is not a group size");
  for (const auto& [k, tensor] :
       {std::make_pair(spec.hidden, fc1_tensor), std::make_pair(spec.intermediate, fc2_tensor)}) {
    if (k % p.group != 0) {
      fail(ErrorCode::kBadFile, "group_size " + std::to_string(p.group) + " does not divide the " +
                                    std::to_string(k) + " in features of tensor '" + tensor + "'");
    }
  }
  if (p.group != 32 && p.group != 64 && p.group != 128) {
    fail(ErrorCode::kUnsupported, "group_size " + std::to_string(p.group) +
                                      ": moekit's int groups are 32, 64 or 128 in features");
  }
  if (p.group != spec.weights.group_size) {
    fail(ErrorCode::kFormatMismatch, "group_size " + std::to_string(p.group) +
                                         ", but the spec's weights.group_size is " +
                                         std::to_string(spec.weights.group_size));
  }
  const std::string& f = quant.format;
  if (p.awq) {
    // version gemm (AutoAWQ's default, GEMM in its quant_config.json); gemv, gemv_fast and
    // marlin pack the words otherwise.
    if (!f.empty() && f != "gemm")
      fail(ErrorCode::kUnsupported, "AWQ version '" + f + "': moekit reads the gemm layout");
  } else if (f.empty() || f == "gptq") {
    // AutoGPTQ qlinear_cuda_old.py, QuantLinear.pack: `zeros -= 1` before packing, and forward
    // adds 1 back; GPTQModel's default save format ("gptq", v1) keeps that.
    p.zero_offset = 1;
  } else if (f != "gptq_v2") {  // GPTQModel's v2 stores the zero points as they are
    fail(ErrorCode::kUnsupported,
         "GPTQ checkpoint_format '" + f + "': moekit reads gptq and gptq_v2 packs");
  }
  return p;
}

MatRef UnpackedProjection::ref(int64_t rows, int64_t cols) const {
  MatRef m;
  m.rows = rows;
  m.cols = cols;
  m.values = values.data();
  m.scales = reinterpret_cast<const uint8_t*>(scales.data());
  m.zeros = zeros.empty() ? nullptr : zeros.data();
  return m;
}

void unpack_projection(const TensorIndex& idx, const PackedLayout& layout, const Packing& pk,
                       const std::string& prefix, int64_t rows, int64_t cols,
                       UnpackedProjection& out) {
  const int64_t n_out = rows, k_in = cols;
  const int64_t groups = k_in / layout.group;
  const int per_word = 32 / layout.bits;
  if (n_out % 8 != 0 || k_in % layout.group != 0 || layout.group % 8 != 0) {
    // A valid spec's sizes are multiples of its group (32, 64 or 128).
    throw Error(ErrorCode::kInternal, "unpacking " + prefix + " of " + std::to_string(n_out) +
                                          " x " + std::to_string(k_in) + " in groups of " +
                                          std::to_string(layout.group));
  }
  const int64_t packed_out = (n_out + per_word - 1) / per_word;
  const std::string qweight = prefix + "qweight", qzeros = prefix + "qzeros";
  const std::string scales = prefix + "scales";
  // AWQ packs along out features ([K, N/8]); GPTQ along in features ([K*bits/32, N]).
  const auto hq = layout.awq ? idx.expect(qweight, StDtype::kI32, {k_in, packed_out})
                             : idx.expect(qweight, StDtype::kI32, {k_in / per_word, n_out});
  const auto hz = idx.expect(qzeros, StDtype::kI32, {groups, packed_out});
  const auto hs = idx.expect_float(scales, {groups, n_out});
  if (!layout.awq) check_g_idx(idx, prefix + "g_idx", k_in, layout.group);

  const int64_t row_bytes = pk.row_bytes(k_in);
  out.values.assign(static_cast<std::size_t>(n_out * row_bytes), 0);
  const uint8_t* q = hq.data();
  if (layout.awq) {
    // Word (k, c) holds in feature k of out features 8c..8c+7; two consecutive k make a byte.
    for (int64_t k = 0; k < k_in; k += 2) {
      for (int64_t c = 0; c < packed_out; ++c) {
        const uint32_t lo = word_at(q, k * packed_out + c),
                       hi = word_at(q, (k + 1) * packed_out + c);
        for (int j = 0; j < 8; ++j) {
          const int shift = 4 * kAwqReverseOrder[j];
          out.values[static_cast<std::size_t>((8 * c + j) * row_bytes + k / 2)] =
              static_cast<uint8_t>(((lo >> shift) & 0xf) | (((hi >> shift) & 0xf) << 4));
        }
      }
    }
  } else {
    // Word (w, n) holds in features per_word*w.. of out feature n, lowest bits first: as little
    // endian bytes exactly moekit's row bytes (4-bit: element 2j in the low nibble).
    for (int64_t w = 0; w < k_in / per_word; ++w)
      for (int64_t n = 0; n < n_out; ++n)
        std::memcpy(&out.values[static_cast<std::size_t>(n * row_bytes + 4 * w)],
                    q + (w * n_out + n) * 4, 4);
  }

  const int64_t ns = n_out * groups;
  out.scales.resize(static_cast<std::size_t>(ns));
  const std::size_t es = st_dtype_size(hs.info->dtype);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n = 0; n < n_out; ++n)
      out.scales[static_cast<std::size_t>(n * groups + g)] =
          load_float(hs.info->dtype, hs.data() + (g * n_out + n) * es);

  // Zero points: kept, or (without the spec's zero points) required to be the midpoint, which
  // the signed values then absorb: q - 2^(bits-1) in two's complement is q ^ 2^(bits-1).
  const int max_zero = (1 << layout.bits) - 1, mid = 1 << (layout.bits - 1);
  out.zeros.assign(pk.zeros ? static_cast<std::size_t>(ns) : 0, 0);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t n = 0; n < n_out; ++n) {
      const uint32_t w = word_at(hz.data(), g * packed_out + n / per_word);
      const int shift = layout.awq ? 4 * kAwqReverseOrder[n % 8] : layout.bits * (n % per_word);
      const int stored = static_cast<int>((w >> shift) & static_cast<uint32_t>(max_zero));
      const int z = stored + layout.zero_offset;
      auto at = [&] {
        return " for out feature " + std::to_string(n) + ", group " + std::to_string(g);
      };
      if (z > max_zero) {
        bad_tensor(ErrorCode::kBadFile, hz, qzeros,
                   "stores " + std::to_string(stored) + at() +
                       ", which the gptq format's zeros - 1 convention reads as zero point " +
                       std::to_string(z) + ", past the " + std::to_string(layout.bits) +
                       "-bit range 0.." + std::to_string(max_zero));
      }
      if (pk.zeros) {
        out.zeros[static_cast<std::size_t>(n * groups + g)] = static_cast<uint8_t>(z);
      } else if (z != mid) {
        bad_tensor(ErrorCode::kFormatMismatch, hz, qzeros,
                   "holds zero point " + std::to_string(z) + at() +
                       ", but the spec has no zero points (weights.zero_points false), which "
                       "needs the symmetric " +
                       std::to_string(mid) + " everywhere");
      }
    }
  }
  if (!pk.zeros) {
    const uint8_t flip = layout.bits == 4 ? 0x88 : 0x80;
    for (uint8_t& b : out.values) b ^= flip;
  }
}

void load_pre_quant_scales(const TensorIndex& idx, const std::string& gate_prefix,
                           const std::string& up_prefix, const std::string& down_prefix,
                           int64_t hidden, int64_t inter, int64_t offset, int64_t count, float* fc1,
                           float* fc2) {
  auto load = [&](const std::string& name, int64_t k, int64_t first, int64_t n, float* dst) {
    const auto h = idx.expect_float(name, {k});
    const std::size_t es = st_dtype_size(h.info->dtype);
    for (int64_t i = 0; i < n; ++i) dst[i] = load_float(h.info->dtype, h.data() + (first + i) * es);
  };
  const std::string g = gate_prefix + "pre_quant_scale", u = up_prefix + "pre_quant_scale";
  std::vector<float> up(static_cast<std::size_t>(hidden));
  load(g, hidden, 0, hidden, fc1);
  load(u, hidden, 0, hidden, up.data());
  for (int64_t i = 0; i < hidden; ++i) {
    if (std::memcmp(&fc1[i], &up[i], sizeof(float)) != 0) {
      throw Error(ErrorCode::kUnsupported,
                  "tensors '" + g + "' and '" + u + "' differ at in feature " + std::to_string(i) +
                      " (" + std::to_string(fc1[i]) + ", " + std::to_string(up[i]) +
                      "), but moekit's fused FC1 holds one pre-quant scale per expert");
    }
  }
  load(down_prefix + "pre_quant_scale", inter, offset, count, fc2);
}

}  // namespace io
}  // namespace moekit
