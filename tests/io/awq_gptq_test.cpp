// AWQ and GPTQ checkpoints of Mixtral and Qwen3-MoE experts, written here from known integer
// values the way AutoAWQ (WQLinear_GEMM.from_linear) and AutoGPTQ (QuantLinear.pack) pack them,
// load as the same weights as moekit's own layout holds, and give the same reference output;
// every inconsistent or unsupported file is refused with its ErrorCode.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/numeric.hpp"
#include "io/io_test_util.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"
#include "moekit/weights.hpp"
#include "quant/quant.hpp"
#include "reference/reference.hpp"
#include "support/errors.hpp"
#include "support/specs.hpp"

namespace moekit {
namespace {

using test::expect_error;
using test::expect_same;
using test::temp_path;

constexpr int kLayer = 3;
constexpr int kGroup = 32;

// One checkpoint kind the writer below produces.
struct Source {
  std::string label;
  std::string method;  // quant_method: "awq" or "gptq"
  std::string format;  // AWQ version / GPTQ checkpoint_format ("" = not stated)
  int bits = 4;
  bool sym = false;        // every zero point 2^(bits-1): loaded into a spec without zero points
  bool pre_quant = false;  // an AWQ pre_quant_scale beside every projection
};

bool stores_zero_minus_one(const Source& s) { return s.method == "gptq" && s.format != "gptq_v2"; }

// Known values of projection `tag` (0: FC1 with gate rows [0, I) and up rows [I, 2I); 1: FC2),
// expert e, out feature r, in feature c / group g.
int known_q(const Source& s, int tag, int64_t e, int64_t r, int64_t c) {
  return static_cast<int>((tag * 7 + e * 5 + r * 3 + c * 11 + (r * c) % 7) % (1 << s.bits));
}
int known_zero(const Source& s, int tag, int64_t e, int64_t r, int64_t g) {
  if (s.sym) return 1 << (s.bits - 1);
  return static_cast<int>(1 + (tag + 3 * e + r + 5 * g) % ((1 << s.bits) - 1));  // 1..2^bits-1
}
float known_scale(int tag, int64_t e, int64_t r, int64_t g) {
  return static_cast<float>(1 + (tag + e + 2 * r + 3 * g) % 13) / 256.0f;  // exact in fp16
}
float known_pre_quant(int tag, int64_t e, int64_t c) {
  return 0.5f + 0.25f * static_cast<float>((tag + e + c) % 5);  // exact in fp16
}

MoeSpec spec_for(const Source& s) {
  MoeSpec m = test::small_fp32_spec(4, 2, 128, 64);
  m.act_dtype = DType::kBFloat16;
  m.weights.format = s.bits == 4 ? WeightFormat::kInt4Group : WeightFormat::kInt8Group;
  m.weights.group_size = kGroup;
  m.weights.zero_points = !s.sym;
  m.weights.pre_quant_scale = s.pre_quant;
  m.routing.method = RoutingMethod::kTopKSoftmax;
  return m;
}

// moekit's canonical tensor of the known values (include/moekit/types.hpp): element 2j in the
// low nibble; without zero points the signed value q - 2^(bits-1). Row r holds known row
// known_row(r).
QuantizedTensor known_tensor(const Source& s, int tag, int64_t experts, int64_t rows, int64_t cols,
                             const std::function<int64_t(int64_t)>& known_row) {
  QuantizedTensor t;
  t.format = s.bits == 4 ? WeightFormat::kInt4Group : WeightFormat::kInt8Group;
  t.experts = experts;
  t.rows = rows;
  t.cols = cols;
  t.group_size = kGroup;
  const int mid = 1 << (s.bits - 1);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t r = known_row(row);
      auto value = [&](int64_t c) { return known_q(s, tag, e, r, c) - (s.sym ? mid : 0); };
      if (s.bits == 4) {
        for (int64_t c = 0; c < cols; c += 2)
          t.values.push_back(static_cast<uint8_t>((value(c) & 0xf) | ((value(c + 1) & 0xf) << 4)));
      } else {
        for (int64_t c = 0; c < cols; ++c)
          t.values.push_back(static_cast<uint8_t>(value(c) & 0xff));
      }
      for (int64_t g = 0; g < cols / kGroup; ++g) {
        t.scales.push_back(known_scale(tag, e, r, g));
        if (!s.sym) t.zeros.push_back(static_cast<uint8_t>(known_zero(s, tag, e, r, g)));
      }
    }
    if (s.pre_quant)
      for (int64_t c = 0; c < cols; ++c) t.pre_quant_scale.push_back(known_pre_quant(tag, e, c));
  }
  return t;
}

// The full weights in m's gate/up layout (known FC1 rows: gate [0, I), up [I, 2I)).
MoeWeights known_weights(const Source& s, const MoeSpec& m) {
  const int64_t I = m.intermediate;
  const bool interleaved = m.gate_up_layout == GateUpLayout::kInterleaved;
  MoeWeights w;
  w.fc1 = known_tensor(s, 0, m.num_experts, 2 * I, m.hidden,
                       [&](int64_t r) { return interleaved ? (r % 2) * I + r / 2 : r; });
  w.fc2 = known_tensor(s, 1, m.num_experts, m.hidden, I, [](int64_t r) { return r; });
  return w;
}

NamedTensor int32_tensor(std::string name, std::vector<int64_t> shape,
                         const std::vector<uint32_t>& words) {
  return make_named_tensor(std::move(name), DType::kInt32, std::move(shape), words.data());
}

NamedTensor fp16_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  return named_tensor_from_floats(std::move(name), DType::kFloat16, std::move(shape), v.data());
}

// The projection (tag, expert e, out features [row0, row0 + rows), in features cols) packed as
// the quantizer writes it, under `prefix` ("...experts.2.w1.").
void add_projection(std::vector<NamedTensor>& out, const Source& s, const std::string& prefix,
                    int tag, int64_t e, int64_t row0, int64_t rows, int64_t cols) {
  const int64_t groups = cols / kGroup, per_word = 32 / s.bits;
  const int off = stores_zero_minus_one(s) ? 1 : 0;
  auto q = [&](int64_t n, int64_t k) {
    return static_cast<uint32_t>(known_q(s, tag, e, row0 + n, k));
  };
  auto z = [&](int64_t n, int64_t g) {
    return static_cast<uint32_t>(known_zero(s, tag, e, row0 + n, g) - off);
  };
  std::vector<uint32_t> qweight, qzeros;
  if (s.method == "awq") {
    // AutoAWQ WQLinear_GEMM.from_linear: intweight is [in, out]; word (k, c) |= intweight[k,
    // 8c + order_map[i]] << 4i with order_map 0 2 4 6 1 3 5 7; the zeros the same.
    const int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    qweight.assign(static_cast<std::size_t>(cols * rows / 8), 0);
    for (int64_t k = 0; k < cols; ++k)
      for (int64_t c = 0; c < rows / 8; ++c)
        for (int i = 0; i < 8; ++i)
          qweight[k * (rows / 8) + c] |= q(8 * c + order_map[i], k) << (4 * i);
    qzeros.assign(static_cast<std::size_t>(groups * rows / 8), 0);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < rows / 8; ++c)
        for (int i = 0; i < 8; ++i)
          qzeros[g * (rows / 8) + c] |= z(8 * c + order_map[i], g) << (4 * i);
    out.push_back(int32_tensor(prefix + "qweight", {cols, rows / 8}, qweight));
  } else {
    // AutoGPTQ QuantLinear.pack: qweight row w |= intweight[w * per_word + j] << bits * j (the
    // in features of an out feature); qzeros column c |= (zeros - 1)[:, c * per_word + j] << ...
    qweight.assign(static_cast<std::size_t>(cols / per_word * rows), 0);
    for (int64_t w = 0; w < cols / per_word; ++w)
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t j = 0; j < per_word; ++j)
          qweight[w * rows + n] |= q(n, w * per_word + j) << (s.bits * j);
    qzeros.assign(static_cast<std::size_t>(groups * rows / per_word), 0);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < rows / per_word; ++c)
        for (int64_t j = 0; j < per_word; ++j)
          qzeros[g * (rows / per_word) + c] |= z(c * per_word + j, g) << (s.bits * j);
    std::vector<uint32_t> g_idx;
    for (int64_t k = 0; k < cols; ++k) g_idx.push_back(static_cast<uint32_t>(k / kGroup));
    out.push_back(int32_tensor(prefix + "qweight", {cols / per_word, rows}, qweight));
    out.push_back(int32_tensor(prefix + "g_idx", {cols}, g_idx));
  }
  out.push_back(int32_tensor(prefix + "qzeros", {groups, rows / per_word}, qzeros));
  std::vector<float> scales;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n = 0; n < rows; ++n) scales.push_back(known_scale(tag, e, row0 + n, g));
  out.push_back(fp16_tensor(prefix + "scales", {groups, rows}, scales));
  if (s.pre_quant) {
    std::vector<float> pqs;
    for (int64_t k = 0; k < cols; ++k) pqs.push_back(known_pre_quant(tag, e, k));
    out.push_back(fp16_tensor(prefix + "pre_quant_scale", {cols}, pqs));
  }
}

// "...experts.2.w1.weight" -> "...experts.2.w1."
std::string prefix_of(const std::string& pattern, int64_t e) {
  const std::string name = expand_tensor_name(pattern, kLayer, e);
  return name.substr(0, name.rfind('.') + 1);
}

std::vector<NamedTensor> packed_tensors(const Source& s, const ModelFamily& fam, const MoeSpec& m) {
  std::vector<NamedTensor> out;
  const int64_t I = m.intermediate, H = m.hidden;
  for (int64_t e = 0; e < m.num_experts; ++e) {
    add_projection(out, s, prefix_of(fam.gate_proj, e), 0, e, 0, I, H);
    add_projection(out, s, prefix_of(fam.up_proj, e), 0, e, I, I, H);
    add_projection(out, s, prefix_of(fam.down_proj, e), 1, e, 0, H, I);
  }
  return out;
}

// config.json as transformers' AwqConfig / GPTQConfig write its quantization_config.
std::string config_json(const Source& s) {
  std::string q = "\"quant_method\": \"" + s.method + "\", \"bits\": " + std::to_string(s.bits) +
                  ", \"group_size\": " + std::to_string(kGroup);
  if (s.method == "awq") {
    q += ", \"zero_point\": true";
    if (!s.format.empty()) q += ", \"version\": \"" + s.format + "\"";
  } else {
    q += ", \"desc_act\": false, \"sym\": " + std::string(s.sym ? "true" : "false");
    if (!s.format.empty()) q += ", \"checkpoint_format\": \"" + s.format + "\"";
  }
  return "{\"architectures\": [\"MixtralForCausalLM\"], \"quantization_config\": {" + q + "}}";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// A fresh checkpoint folder for this test: `stem`/model.safetensors (+ config.json).
std::string checkpoint_folder(const std::string& stem) {
  const std::string folder = temp_path(stem);
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

// Writes `s`'s checkpoint (tensors edited by `edit`) and its config.json; returns the shard.
std::string write_checkpoint(const std::string& stem, const Source& s, const ModelFamily& fam,
                             const MoeSpec& m,
                             const std::function<void(std::vector<NamedTensor>&)>& edit = {}) {
  const std::string folder = checkpoint_folder(stem);
  auto tensors = packed_tensors(s, fam, m);
  if (edit) edit(tensors);
  const std::string shard = folder + "/model.safetensors";
  write_tensors(shard, tensors);
  write_text(folder + "/config.json", config_json(s));
  return shard;
}

NamedTensor& find_named(std::vector<NamedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << name;
  return ts.front();
}
void erase_named(std::vector<NamedTensor>& ts, const std::string& name) {
  ts.erase(ts.begin() + (&find_named(ts, name) - ts.data()));
}

std::vector<Source> sources() {
  return {
      {"awq", "awq", "gemm", 4, false, false},
      {"awq-sym", "awq", "", 4, true, false},
      {"awq-pre-quant", "awq", "gemm", 4, false, true},
      {"gptq", "gptq", "gptq", 4, false, false},
      {"gptq-v2", "gptq", "gptq_v2", 4, false, false},
      {"gptq-sym", "gptq", "", 4, true, false},
      {"gptq-int8", "gptq", "gptq", 8, false, false},
      {"gptq-int8-sym", "gptq", "gptq", 8, true, false},
      {"gptq-int8-v2-pre-quant", "gptq", "gptq_v2", 8, false, true},
  };
}

TEST(AwqGptq, LoadsAsTheSameWeightsAsMoekitsLayout) {
  for (const Source& s : sources()) {
    for (const char* family : {"mixtral", "qwen3_moe"}) {
      SCOPED_TRACE(s.label + " " + family);
      const ModelFamily& fam = find_model_family(family);
      const MoeSpec m = spec_for(s);
      const MoeWeights known = known_weights(s, m);
      const std::string shard = write_checkpoint(s.label + "." + family, s, fam, m);
      const MoeWeights packed = load_layer_weights({shard}, fam, kLayer, m);
      expect_same(packed, known, "packed");

      // Every weight is (q - z) * s of the known values, as the quantizers' dequantization says.
      for (int tag = 0; tag < 2; ++tag) {
        const QuantizedTensor& t = tag == 0 ? packed.fc1 : packed.fc2;
        std::vector<float> d(static_cast<std::size_t>(t.rows * t.cols));
        for (int64_t e = 0; e < t.experts; ++e) {
          quant::dequantize_expert(t, e, d.data());
          for (int64_t r = 0; r < t.rows; ++r)
            for (int64_t c = 0; c < t.cols; ++c)
              ASSERT_EQ(d[r * t.cols + c],
                        static_cast<float>(known_q(s, tag, e, r, c) -
                                           known_zero(s, tag, e, r, c / kGroup)) *
                            known_scale(tag, e, r, c / kGroup))
                  << "tag " << tag << " expert " << e << " row " << r << " col " << c;
        }
      }

      // The same weights in moekit's own layout, and the same reference output, bit for bit.
      const ModelFamily& native = find_model_family("moekit");
      const std::string native_path = temp_path(s.label + "." + family + ".native.safetensors");
      save_layer_weights(native_path, native, kLayer, m, known);
      const MoeWeights own = load_layer_weights({native_path}, native, kLayer, m);
      expect_same(packed, own, "moekit layout");
      const int64_t tokens = 3;
      std::vector<float> hidden(static_cast<std::size_t>(tokens * m.hidden));
      std::vector<float> route(static_cast<std::size_t>(tokens * m.top_k), 0.5f);
      std::vector<float> a(hidden.size()), b(hidden.size());
      for (std::size_t i = 0; i < hidden.size(); ++i)
        hidden[i] = quant::round_to(DType::kBFloat16, 0.01f * static_cast<float>(int(i % 23) - 11));
      const std::vector<int32_t> ids = {0, 3, 2, 1, 1, 0};
      ASSERT_TRUE(
          reference::forward(m, packed, tokens, hidden.data(), ids.data(), route.data(), a.data())
              .ok());
      ASSERT_TRUE(
          reference::forward(m, own, tokens, hidden.data(), ids.data(), route.data(), b.data())
              .ok());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      EXPECT_NE(a, std::vector<float>(a.size(), 0.0f));
    }
  }
}

TEST(AwqGptq, LocalShardEqualsShardWeights) {
  for (const Source& s : sources()) {
    if (s.label != "awq-pre-quant" && s.label != "gptq" && s.label != "gptq-int8-sym") continue;
    const ModelFamily& fam = find_model_family("qwen3_moe");
    const MoeSpec full = spec_for(s);
    const std::string shard = write_checkpoint(s.label, s, fam, full);
    for (int tp : {1, 2}) {
      for (int ep : {1, 2}) {
        for (int tr = 0; tr < tp; ++tr) {
          for (int er = 0; er < ep; ++er) {
            MoeSpec m = full;
            m.tp_size = tp;
            m.tp_rank = tr;
            m.ep_size = ep;
            m.ep_rank = er;
            m.gate_up_layout = (tr + er) % 2 ? GateUpLayout::kInterleaved : GateUpLayout::kHalves;
            const std::string label = s.label + " tp " + std::to_string(tr) + "/" +
                                      std::to_string(tp) + " ep " + std::to_string(er) + "/" +
                                      std::to_string(ep) + " " + to_string(m.gate_up_layout);
            SCOPED_TRACE(label);
            ASSERT_TRUE(m.validate().empty()) << m.validate()[0];
            MoeSpec unsharded = full;
            unsharded.gate_up_layout = m.gate_up_layout;
            expect_same(load_layer_weights({shard}, fam, kLayer, m),
                        shard_weights(m, known_weights(s, unsharded)), label);
          }
        }
      }
    }
  }
}

TEST(AwqGptq, ReadsTheQuantizersConfigFiles) {
  // config.json's quantization_config first (an object that lacks it is passed over).
  const std::string folder = checkpoint_folder("configs");
  const QuantizationConfig none = read_quantization_config(folder);
  EXPECT_EQ(none.quant_method, "");
  EXPECT_EQ(none.source, "");
  write_text(folder + "/config.json", "{\"model_type\": \"mixtral\"}");
  EXPECT_EQ(read_quantization_config(folder).quant_method, "");
  // AutoGPTQ's quantize_config.json: no quant_method in older files, is_marlin_format.
  write_text(folder + "/quantize_config.json",
             "{\"bits\": 8, \"group_size\": 64, \"desc_act\": true, \"sym\": true, "
             "\"is_marlin_format\": true}");
  QuantizationConfig q = read_quantization_config(folder + "/model.safetensors");
  EXPECT_EQ(q.quant_method, "gptq");
  EXPECT_EQ(q.bits, 8);
  EXPECT_EQ(q.group_size, 64);
  EXPECT_EQ(q.format, "marlin");
  EXPECT_EQ(q.source, folder + "/quantize_config.json");
  std::filesystem::remove(folder + "/quantize_config.json");
  // AutoAWQ's quant_config.json: w_bit, q_group_size, version in capitals.
  write_text(folder + "/quant_config.json",
             "{\"zero_point\": true, \"q_group_size\": 128, \"w_bit\": 4, \"version\": \"GEMM\", "
             "\"modules_to_not_convert\": null}");
  q = read_quantization_config(folder);
  EXPECT_EQ(q.quant_method, "awq");
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_EQ(q.format, "gemm");
  // config.json wins when it holds one.
  write_text(
      folder + "/config.json",
      "{\"quantization_config\": {\"quant_method\": \"GPTQ\", \"bits\": 4, \"group_size\": "
      "-1, \"checkpoint_format\": \"gptq_v2\", \"meta\": {\"quantizer\": [\"gptqmodel\"]}}}");
  q = read_quantization_config(folder);
  EXPECT_EQ(q.quant_method, "gptq");
  EXPECT_EQ(q.group_size, -1);
  EXPECT_EQ(q.format, "gptq_v2");
  EXPECT_EQ(q.source, folder + "/config.json");

  // Malformed files: named, kBadFile.
  const std::string config = folder + "/config.json";
  auto expect_bad = [&](const std::string& text, const std::vector<std::string>& parts) {
    SCOPED_TRACE(text);
    write_text(config, text);
    std::vector<std::string> all = parts;
    all.push_back(config);
    expect_error(ErrorCode::kBadFile, all, [&] { read_quantization_config(folder); });
  };
  expect_bad("{\"quantization_config\": {\"bits\": 4,", {"not valid JSON"});
  expect_bad("[1, 2]", {"not a JSON object"});
  expect_bad("{\"quantization_config\": [4]}", {"quantization_config", "not an object"});
  expect_bad("{\"quantization_config\": {\"bits\": \"4\"}}", {"'bits'", "integer"});
  expect_bad("{\"quantization_config\": {\"bits\": 4.5}}", {"'bits'", "integer"});
  expect_bad("{\"quantization_config\": {\"quant_method\": 1}}", {"'quant_method'", "string"});
  expect_bad("{\"quantization_config\": {\"is_marlin_format\": 1}}", {"'is_marlin_format'"});
  expect_bad("{\"quantization_config\": {\"bits\": 4, \"bits\": 8}}", {"'bits'", "twice"});
  expect_bad(std::string(100, '[') + std::string(100, ']'), {"deeper than 64"});
  // A folder where the file should be: the OS's refusal, kIo.
  std::filesystem::remove(config);
  std::filesystem::create_directories(config);
  expect_error(ErrorCode::kIo, {config}, [&] { read_quantization_config(folder); });
}

// The config against the spec, before any tensor is read.
TEST(AwqGptq, ConfigsThatDoNotFitTheSpecAreRefused) {
  const Source awq{"awq", "awq", "gemm", 4, false, false};
  const ModelFamily& fam = find_model_family("mixtral");
  const MoeSpec m = spec_for(awq);
  const std::string shard = write_checkpoint("config", awq, fam, m);
  const std::string gate = "model.layers.3.block_sparse_moe.experts.0.w1.qweight";
  const std::string down = "model.layers.3.block_sparse_moe.experts.0.w2.qweight";
  auto expect_refused = [&](QuantizationConfig q, ErrorCode code,
                            const std::vector<std::string>& parts) {
    q.source = "here.json";
    SCOPED_TRACE(parts.front());
    std::vector<std::string> all = parts;
    all.push_back("here.json");
    expect_error(code, all, [&] { load_layer_weights({shard}, fam, kLayer, m, q); });
  };
  const QuantizationConfig ok{"", "awq", 4, kGroup, "gemm"};
  EXPECT_NO_THROW(load_layer_weights({shard}, fam, kLayer, m, ok));
  auto with = [&](const std::function<void(QuantizationConfig&)>& edit) {
    QuantizationConfig q = ok;
    edit(q);
    return q;
  };
  expect_refused(with([](auto& q) { q.quant_method = "bitsandbytes"; }), ErrorCode::kUnsupported,
                 {"'bitsandbytes'"});
  expect_refused(with([](auto& q) { q.bits = 8; }), ErrorCode::kUnsupported, {"bits 8", "4-bit"});
  expect_refused(with([](auto& q) {
                   q.quant_method = "gptq";
                   q.bits = 3;
                 }),
                 ErrorCode::kUnsupported, {"bits 3"});
  expect_refused(with([](auto& q) {
                   q.quant_method = "gptq";
                   q.bits = 8;
                 }),
                 ErrorCode::kFormatMismatch, {"bits 8", "int4_group"});
  expect_refused(with([](auto& q) { q.group_size = -1; }), ErrorCode::kUnsupported,
                 {"group_size -1"});
  expect_refused(with([](auto& q) { q.group_size = -4; }), ErrorCode::kBadFile, {"group_size -4"});
  expect_refused(with([](auto& q) { q.group_size = 48; }), ErrorCode::kBadFile,
                 {"group_size 48", "128 in features", gate});
  expect_refused(with([](auto& q) { q.group_size = 128; }), ErrorCode::kBadFile,
                 {"group_size 128", "64 in features", down});
  expect_refused(with([](auto& q) { q.group_size = 16; }), ErrorCode::kUnsupported,
                 {"group_size 16"});
  expect_refused(with([](auto& q) { q.group_size = 64; }), ErrorCode::kFormatMismatch,
                 {"group_size 64", "32"});
  expect_refused(with([](auto& q) { q.format = "gemv"; }), ErrorCode::kUnsupported, {"'gemv'"});
  expect_refused(with([](auto& q) {
                   q.quant_method = "gptq";
                   q.format = "marlin";
                 }),
                 ErrorCode::kUnsupported, {"'marlin'"});
  expect_error(ErrorCode::kInvalidArgument, {"quant_method", gate},
               [&] { load_layer_weights({shard}, fam, kLayer, m, QuantizationConfig{}); });
  // No config beside the shard: the folder is named.
  std::filesystem::remove(std::filesystem::path(shard).parent_path() / "config.json");
  expect_error(ErrorCode::kBadFile, {shard, "quantization config"},
               [&] { load_layer_weights({shard}, fam, kLayer, m); });
  // Other formats never look for one.
  MoeSpec bf16 = m;
  bf16.weights = WeightQuant{};
  const std::string dense = temp_path("dense.safetensors");
  save_layer_weights(dense, fam, kLayer, bf16, quant::make_random_weights(bf16, 1));
  EXPECT_NO_THROW(load_layer_weights({dense}, fam, kLayer, bf16));
  // Writing the packs is refused.
  expect_error(ErrorCode::kUnsupported, {"mixtral", "int4_group"},
               [&] { save_layer_weights(dense, fam, kLayer, m, known_weights(awq, m)); });
}

TEST(AwqGptq, MalformedTensorsAreRefused) {
  const ModelFamily& fam = find_model_family("qwen3_moe");
  const std::string p = "model.layers.3.mlp.experts.1.";
  const Source awq{"awq", "awq", "gemm", 4, false, false};
  const Source gptq{"gptq", "gptq", "gptq", 4, false, false};
  const Source gptq_sym{"gptq-sym", "gptq", "gptq", 4, true, false};
  auto expect_load_error = [&](const Source& s, const MoeSpec& m,
                               const std::function<void(std::vector<NamedTensor>&)>& edit,
                               ErrorCode code, const std::vector<std::string>& parts) {
    SCOPED_TRACE(s.label + " " + parts.front());
    const std::string shard = write_checkpoint("bad", s, fam, m, edit);
    std::vector<std::string> all = parts;
    all.push_back(shard);
    expect_error(code, all, [&] { load_layer_weights({shard}, fam, kLayer, m); });
  };
  const MoeSpec ma = spec_for(awq), mg = spec_for(gptq);
  // Missing zero points or scales.
  expect_load_error(awq, ma, [&](auto& ts) { erase_named(ts, p + "up_proj.qzeros"); },
                    ErrorCode::kBadFile, {p + "up_proj.qzeros", "missing"});
  expect_load_error(gptq, mg, [&](auto& ts) { erase_named(ts, p + "down_proj.scales"); },
                    ErrorCode::kBadFile, {p + "down_proj.scales", "missing"});
  // GPTQ's qweight shape in an AWQ checkpoint, and the other way round.
  expect_load_error(awq, ma,
                    [&](auto& ts) {
                      find_named(ts, p + "gate_proj.qweight").shape = {16, 64};  // GPTQ's [K/8, N]
                    },
                    ErrorCode::kBadFile, {p + "gate_proj.qweight", "[128, 8]", "[16, 64]"});
  expect_load_error(gptq, mg,
                    [&](auto& ts) {
                      find_named(ts, p + "gate_proj.qweight").shape = {128, 8};
                    },
                    ErrorCode::kBadFile, {p + "gate_proj.qweight", "[16, 64]", "[128, 8]"});
  // Packed words of another dtype (GPTQModel's pack_dtype int16, say).
  expect_load_error(gptq, mg,
                    [&](auto& ts) {
                      NamedTensor& t = find_named(ts, p + "down_proj.qweight");
                      t.dtype = DType::kBFloat16;
                      t.shape = {8, 128, 2};
                    },
                    ErrorCode::kBadFile, {p + "down_proj.qweight", "BF16", "I32"});
  // Scales for another group size.
  expect_load_error(awq, ma,
                    [&](auto& ts) {
                      NamedTensor& t = find_named(ts, p + "up_proj.scales");
                      t.shape = {2, 128};  // group 64 instead of 32
                    },
                    ErrorCode::kBadFile, {p + "up_proj.scales", "[4, 64]", "[2, 128]"});
  // An act-order g_idx.
  expect_load_error(gptq, mg,
                    [&](auto& ts) {
                      NamedTensor& t = find_named(ts, p + "gate_proj.g_idx");
                      const int32_t other = 2;
                      std::memcpy(t.bytes.data() + 5 * 4, &other, 4);
                    },
                    ErrorCode::kUnsupported,
                    {p + "gate_proj.g_idx", "in feature 5 in group 2", "desc_act"});
  expect_load_error(gptq, mg,
                    [&](auto& ts) {
                      find_named(ts, p + "gate_proj.g_idx").shape = {2, 64};
                    },
                    ErrorCode::kBadFile, {p + "gate_proj.g_idx", "[128]"});
  // A g_idx (or a bias) beside AWQ tensors is not read: refused rather than ignored.
  expect_load_error(awq, ma,
                    [&](auto& ts) {
                      const std::vector<uint32_t> g(128, 0);
                      ts.push_back(int32_tensor(p + "down_proj.g_idx", {128}, g));
                    },
                    ErrorCode::kFormatMismatch, {p + "down_proj.g_idx"});
  expect_load_error(
      gptq, mg,
      [&](auto& ts) {
        ts.push_back(fp16_tensor(p + "down_proj.bias", {128}, std::vector<float>(128, 0.0f)));
      },
      ErrorCode::kFormatMismatch, {p + "down_proj.bias"});
  // The gptq format stores z - 1: a stored 15 reads as 16, past 4 bits.
  expect_load_error(
      gptq, mg,
      [&](auto& ts) {
        NamedTensor& t = find_named(ts, p + "down_proj.qzeros");  // [2 groups, 128 / 8]
        t.bytes[(1 * 16 + 2) * 4 + 1] |= 0xf0;  // word (group 1, 2), nibble 3: out feature 19
      },
      ErrorCode::kBadFile, {p + "down_proj.qzeros", "out feature 19, group 1", "16"});
  // Asymmetric zero points where the spec has none.
  MoeSpec no_zeros = mg;
  no_zeros.weights.zero_points = false;
  expect_load_error(gptq, no_zeros, {}, ErrorCode::kFormatMismatch,
                    {"qzeros", "zero_points", "symmetric 8"});
  expect_load_error(
      gptq_sym, no_zeros,
      [&](auto& ts) {
        NamedTensor& t = find_named(ts, p + "up_proj.qzeros");
        t.bytes[3] = 0x76;  // out features 6 and 7 of group 0: stored 6 (zero point 7) and 7
      },
      ErrorCode::kFormatMismatch, {p + "up_proj.qzeros", "zero point 7", "out feature 6, group 0"});
}

// An AWQ smoothing scale beside the projections is applied (loaded) or refused, never dropped.
TEST(AwqGptq, PreQuantScaleIsNeverDropped) {
  const ModelFamily& fam = find_model_family("mixtral");
  const std::string p = "model.layers.3.block_sparse_moe.experts.2.";
  const Source with{"awq-pre-quant", "awq", "gemm", 4, false, true};
  const Source without{"awq", "awq", "gemm", 4, false, false};
  const MoeSpec spec_with = spec_for(with), spec_without = spec_for(without);
  {
    // In the file, not in the spec.
    const std::string shard = write_checkpoint("unread", with, fam, spec_with);
    expect_error(ErrorCode::kFormatMismatch, {shard, "pre_quant_scale", "pre_quant_scale false"},
                 [&] { load_layer_weights({shard}, fam, kLayer, spec_without); });
  }
  {
    // In the spec, not in the file.
    const std::string shard = write_checkpoint("missing", without, fam, spec_without);
    expect_error(ErrorCode::kBadFile, {"pre_quant_scale", "missing"},
                 [&] { load_layer_weights({shard}, fam, kLayer, spec_with); });
  }
  {
    // Gate and up with different scales cannot share FC1's.
    const std::string shard = write_checkpoint("differ", with, fam, spec_with, [&](auto& ts) {
      NamedTensor& t = find_named(ts, p + "w3.pre_quant_scale");
      t = fp16_tensor(t.name, {128}, std::vector<float>(128, 1.0f));
    });
    expect_error(ErrorCode::kUnsupported, {p + "w1.pre_quant_scale", p + "w3.pre_quant_scale"},
                 [&] { load_layer_weights({shard}, fam, kLayer, spec_with); });
  }
  {
    // Of another shape.
    const std::string shard = write_checkpoint("shape", with, fam, spec_with, [&](auto& ts) {
      find_named(ts, p + "w2.pre_quant_scale").shape = {1, 64};
    });
    expect_error(ErrorCode::kBadFile, {shard, p + "w2.pre_quant_scale", "[64]"},
                 [&] { load_layer_weights({shard}, fam, kLayer, spec_with); });
  }
}

}  // namespace
}  // namespace moekit
