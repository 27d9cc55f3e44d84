// Over 800 lines: every model family's layout and every weight format through one loader's fixture.
// One MoE layer's experts through every model family's files: write then load gives the same
// weights, the local TP/EP shard equals shard_weights() of the full set, the names and layouts
// are the checkpoints' own, and a mismatching file is an error naming file, tensor, expected and
// found.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/numeric.hpp"
#include "io/io_test_util.hpp"
#include "io/safetensors.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"
#include "moekit/weights.hpp"
#include "quant/quant.hpp"
#include "reference/reference.hpp"
#include "support/errors.hpp"
#include "support/specs.hpp"

namespace moekit {
namespace {

using test::expect_same;
using test::temp_path;

void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = numeric::bf16_to_float(numeric::float_to_bf16(x));
}

MoeSpec small_spec(WeightFormat f, int64_t experts, int64_t hidden, int64_t inter) {
  MoeSpec s;
  s.num_experts = experts;
  s.top_k = 2;
  s.hidden = hidden;
  s.intermediate = inter;
  s.weights.format = f;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  return s;
}

MoeSpec gpt_oss_spec(WeightFormat f, GateUpLayout layout) {
  MoeSpec s = small_spec(f, 4, 64, 64);
  test::set_clamped_swiglu(s);
  s.gate_up_layout = layout;
  s.fc1_bias = s.fc2_bias = true;
  return s;
}

MoeSpec deepseek_spec() {
  MoeSpec s = small_spec(WeightFormat::kFP8Block128, 8, 256, 256);
  test::set_deepseek_v3_routing(s, 2, 1);
  return s;
}

MoeWeights random_weights(const MoeSpec& s, uint64_t seed, const ModelFamily& fam) {
  MoeWeights w = quant::make_random_weights(s, seed);
  if (fam.bias_dtype == DType::kBFloat16) {  // what the family's files can hold exactly
    round_to_bf16(w.fc1_bias);
    round_to_bf16(w.fc2_bias);
  }
  return w;
}

struct Case {
  std::string family;
  MoeSpec spec;
  std::string label;
};

std::vector<Case> round_trip_cases() {
  std::vector<Case> c;
  for (const char* fam : {"mixtral", "qwen3_moe", "deepseek_v3"}) {
    for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kFP16, WeightFormat::kFP32}) {
      for (GateUpLayout l : {GateUpLayout::kHalves, GateUpLayout::kInterleaved}) {
        MoeSpec s = small_spec(f, 4, 64, 32);
        s.gate_up_layout = l;
        c.push_back({fam, s, std::string(fam) + "/" + to_string(f) + "/" + to_string(l)});
      }
    }
    c.push_back({fam, small_spec(WeightFormat::kFP8Block128, 2, 384, 256),
                 std::string(fam) + "/fp8_block128"});
    for (GateUpLayout l : {GateUpLayout::kHalves, GateUpLayout::kInterleaved}) {
      MoeSpec s = small_spec(WeightFormat::kNVFP4, 2, 64, 32);  // ModelOpt's names
      s.gate_up_layout = l;
      c.push_back({fam, s, std::string(fam) + "/nvfp4/" + to_string(l)});
    }
  }
  c.push_back({"deepseek_v3", deepseek_spec(), "deepseek_v3/routing"});
  for (WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kBF16, WeightFormat::kFP32}) {
    for (GateUpLayout l : {GateUpLayout::kInterleaved, GateUpLayout::kHalves}) {
      c.push_back({"gpt_oss", gpt_oss_spec(f, l),
                   std::string("gpt_oss/") + to_string(f) + "/" + to_string(l)});
    }
  }
  for (GateUpLayout l : {GateUpLayout::kHalves, GateUpLayout::kInterleaved}) {
    MoeSpec s = small_spec(WeightFormat::kBF16, 4, 48, 40);
    s.top_k = 1;
    s.routing.method = RoutingMethod::kLlama4;
    s.gate_up_layout = l;
    c.push_back({"llama4", s, std::string("llama4/") + to_string(l)});
  }
  // moekit's own files: every format, gated and not, with biases, zero points and AWQ scales.
  for (WeightFormat f :
       {WeightFormat::kBF16, WeightFormat::kFP16, WeightFormat::kFP32, WeightFormat::kFP8PerTensor,
        WeightFormat::kFP8Block128, WeightFormat::kInt8Group, WeightFormat::kInt4Group,
        WeightFormat::kMXFP4, WeightFormat::kNVFP4, WeightFormat::kMXFP8}) {
    MoeSpec s = small_spec(f, 4, 256, 256);
    s.fc1_bias = s.fc2_bias = true;
    s.gate_up_layout =
        f == WeightFormat::kFP8Block128 ? GateUpLayout::kHalves : GateUpLayout::kInterleaved;
    c.push_back({"moekit", s, std::string("moekit/") + to_string(f)});
    if (f == WeightFormat::kInt8Group || f == WeightFormat::kInt4Group) {
      MoeSpec z = s;
      z.weights.group_size = 64;
      z.weights.zero_points = true;
      z.weights.pre_quant_scale = true;
      c.push_back({"moekit", z, std::string("moekit/") + to_string(f) + "/zeros+awq"});
    }
  }
  MoeSpec ng = small_spec(WeightFormat::kInt4Group, 2, 128, 64);
  ng.activation.kind = ActivationKind::kReLU2;
  ng.weights.group_size = 32;
  c.push_back({"moekit", ng, "moekit/non-gated"});
  return c;
}

TEST(LayerWeights, RoundTripEveryFamily) {
  uint64_t seed = 100;
  for (const Case& c : round_trip_cases()) {
    SCOPED_TRACE(c.label);
    const ModelFamily& fam = find_model_family(c.family);
    ASSERT_TRUE(c.spec.validate().empty()) << c.spec.validate()[0];
    const MoeWeights w = random_weights(c.spec, ++seed, fam);
    const std::string path = temp_path(std::to_string(seed) + ".safetensors");
    save_layer_weights(path, fam, 3, c.spec, w);
    const MoeWeights back = load_layer_weights({path}, fam, 3, c.spec);
    expect_same(w, back, c.label);
  }
}

// Every TP x EP rank loads exactly shard_weights() of the full set.
TEST(LayerWeights, LocalShardEqualsShardWeights) {
  std::vector<Case> cases = {
      {"qwen3_moe", small_spec(WeightFormat::kBF16, 4, 64, 64), "qwen3_moe"},
      {"deepseek_v3", deepseek_spec(), "deepseek_v3"},
      {"gpt_oss", gpt_oss_spec(WeightFormat::kMXFP4, GateUpLayout::kInterleaved), "gpt_oss/mxfp4"},
      {"gpt_oss", gpt_oss_spec(WeightFormat::kMXFP4, GateUpLayout::kHalves),
       "gpt_oss/mxfp4/halves"},
      {"gpt_oss", gpt_oss_spec(WeightFormat::kBF16, GateUpLayout::kInterleaved), "gpt_oss/bf16"},
      {"llama4", small_spec(WeightFormat::kFP16, 4, 48, 64), "llama4"},
      {"mixtral", small_spec(WeightFormat::kNVFP4, 4, 64, 64), "mixtral/nvfp4 (ModelOpt)"},
  };
  cases[1].spec.intermediate = 512;  // fp8 blocks: 256 rows per TP rank
  cases[0].spec.gate_up_layout = GateUpLayout::kInterleaved;
  for (WeightFormat f : {WeightFormat::kInt4Group, WeightFormat::kNVFP4,
                         WeightFormat::kFP8PerTensor, WeightFormat::kFP8Block128}) {
    MoeSpec s = small_spec(f, 4, 256, 256);
    s.fc1_bias = s.fc2_bias = true;
    if (f == WeightFormat::kInt4Group) {
      s.weights.group_size = 64;
      s.weights.zero_points = s.weights.pre_quant_scale = true;
      s.gate_up_layout = GateUpLayout::kInterleaved;
    }
    cases.push_back({"moekit", s, std::string("moekit/") + to_string(f)});
  }
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const ModelFamily& fam = find_model_family(c.family);
    const MoeWeights full = random_weights(c.spec, ++seed, fam);
    const std::string path = temp_path(std::to_string(seed) + ".safetensors");
    save_layer_weights(path, fam, 0, c.spec, full);
    for (int tp : {1, 2}) {
      for (int ep : {1, 2, 4}) {
        for (int tr = 0; tr < tp; ++tr) {
          for (int er = 0; er < ep; ++er) {
            MoeSpec s = c.spec;
            s.tp_size = tp;
            s.tp_rank = tr;
            s.ep_size = ep;
            s.ep_rank = er;
            const std::string label = c.label + " tp " + std::to_string(tr) + "/" +
                                      std::to_string(tp) + " ep " + std::to_string(er) + "/" +
                                      std::to_string(ep);
            SCOPED_TRACE(label);
            ASSERT_TRUE(s.validate().empty()) << s.validate()[0];
            expect_same(load_layer_weights({path}, fam, 0, s), shard_weights(s, full), label);
          }
        }
      }
    }
  }
}

// The files hold what the real checkpoints hold, under their names.
TEST(LayerWeights, CheckpointNamesAndLayouts) {
  {
    const MoeSpec s = small_spec(WeightFormat::kBF16, 4, 64, 32);
    const ModelFamily& fam = find_model_family("mixtral");
    const MoeWeights w = quant::make_random_weights(s, 7);
    const std::string path = temp_path("mixtral.safetensors");
    save_layer_weights(path, fam, 5, s, w);
    // w1 = gate = FC1 rows [0, I), w3 = up = rows [I, 2I), w2 = down = FC2.
    const std::size_t row = 64 * 2;
    const NamedTensor w1 = read_tensor(path, "model.layers.5.block_sparse_moe.experts.2.w1.weight");
    const NamedTensor w3 = read_tensor(path, "model.layers.5.block_sparse_moe.experts.2.w3.weight");
    const NamedTensor w2 = read_tensor(path, "model.layers.5.block_sparse_moe.experts.2.w2.weight");
    EXPECT_EQ(w1.dtype, DType::kBFloat16);
    EXPECT_EQ(w1.shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(w2.shape, (std::vector<int64_t>{64, 32}));
    const uint8_t* e2 = w.fc1.values.data() + 2 * 64 * row;
    EXPECT_EQ(std::memcmp(w1.bytes.data(), e2, 32 * row), 0);
    EXPECT_EQ(std::memcmp(w3.bytes.data(), e2 + 32 * row, 32 * row), 0);
    EXPECT_EQ(std::memcmp(w2.bytes.data(), w.fc2.values.data() + 2 * 64 * 32 * 2, 64 * 32 * 2), 0);
    EXPECT_EQ(read_metadata(path).at("format"), "pt");
  }
  {
    const MoeSpec s = deepseek_spec();
    const MoeWeights w = quant::make_random_weights(s, 8);
    const std::string path = temp_path("dsv3.safetensors");
    save_layer_weights(path, find_model_family("deepseek_v3"), 0, s, w);
    const NamedTensor g = read_tensor(path, "model.layers.0.mlp.experts.7.gate_proj.weight");
    EXPECT_EQ(g.dtype, DType::kFloat8E4M3);
    const NamedTensor gs =
        read_tensor(path, "model.layers.0.mlp.experts.7.gate_proj.weight_scale_inv");
    EXPECT_EQ(gs.dtype, DType::kFloat32);
    EXPECT_EQ(gs.shape, (std::vector<int64_t>{2, 2}));
    const NamedTensor b = read_tensor(path, "model.layers.0.mlp.gate.e_score_correction_bias");
    EXPECT_EQ(b.shape, (std::vector<int64_t>{8}));
    EXPECT_EQ(named_tensor_to_floats(b), w.routing_bias);
  }
  {
    // gpt-oss: blocks [E, 2I, H/32, 16], scales [E, 2I, H/32], gate/up interleaved, bf16 biases.
    const MoeSpec s = gpt_oss_spec(WeightFormat::kMXFP4, GateUpLayout::kHalves);
    const ModelFamily& fam = find_model_family("gpt_oss");
    const MoeWeights w = quant::make_random_weights(s, 9);
    const std::string path = temp_path("gptoss.safetensors");
    save_layer_weights(path, fam, 1, s, w);
    const std::string p = "model.layers.1.mlp.experts.";
    const NamedTensor blocks = read_tensor(path, p + "gate_up_proj_blocks");
    const NamedTensor scales = read_tensor(path, p + "gate_up_proj_scales");
    EXPECT_EQ(blocks.dtype, DType::kUInt8);
    EXPECT_EQ(blocks.shape, (std::vector<int64_t>{4, 128, 2, 16}));
    EXPECT_EQ(scales.shape, (std::vector<int64_t>{4, 128, 2}));
    EXPECT_EQ(read_tensor(path, p + "down_proj_blocks").shape,
              (std::vector<int64_t>{4, 64, 2, 16}));
    const NamedTensor bias = read_tensor(path, p + "gate_up_proj_bias");
    EXPECT_EQ(bias.dtype, DType::kBFloat16);
    // File row 2i is gate i = moekit (halves) row i; file row 2i+1 is up i = row 64 + i.
    const auto fb = named_tensor_to_floats(bias);
    for (int64_t e = 0; e < 4; ++e) {
      for (int64_t i = 0; i < 64; i += 9) {
        for (int part = 0; part < 2; ++part) {
          const int64_t frow = e * 128 + 2 * i + part, mrow = e * 128 + part * 64 + i;
          EXPECT_EQ(
              std::memcmp(blocks.bytes.data() + frow * 32, w.fc1.values.data() + mrow * 32, 32), 0);
          EXPECT_EQ(scales.bytes[frow * 2], w.fc1.scale_bytes[mrow * 2]);
          EXPECT_EQ(fb[frow], numeric::bf16_to_float(numeric::float_to_bf16(w.fc1_bias[mrow])));
        }
      }
    }
    // Loading rounds nothing further: biases come back as the bf16 the file holds.
    const MoeWeights back = load_layer_weights({path}, fam, 1, s);
    std::vector<float> r = w.fc1_bias;
    round_to_bf16(r);
    EXPECT_EQ(back.fc1_bias, r);
  }
  {
    // Llama-4: gate_up_proj [E, H, 2I] (in-features first), gate then up.
    MoeSpec s = small_spec(WeightFormat::kBF16, 2, 48, 40);
    s.top_k = 1;
    s.routing.method = RoutingMethod::kLlama4;
    const MoeWeights w = quant::make_random_weights(s, 10);
    const std::string path = temp_path("llama4.safetensors");
    save_layer_weights(path, find_model_family("llama4"), 2, s, w);
    const NamedTensor gu =
        read_tensor(path, "language_model.model.layers.2.feed_forward.experts.gate_up_proj");
    const NamedTensor dn =
        read_tensor(path, "language_model.model.layers.2.feed_forward.experts.down_proj");
    EXPECT_EQ(gu.shape, (std::vector<int64_t>{2, 48, 80}));
    EXPECT_EQ(dn.shape, (std::vector<int64_t>{2, 40, 48}));
    for (int64_t e = 0; e < 2; ++e)
      for (int64_t h = 0; h < 48; h += 7)
        for (int64_t j = 0; j < 80; j += 3) {
          EXPECT_EQ(std::memcmp(gu.bytes.data() + ((e * 48 + h) * 80 + j) * 2,
                                w.fc1.values.data() + ((e * 80 + j) * 48 + h) * 2, 2),
                    0);
          if (j < 40)
            EXPECT_EQ(std::memcmp(dn.bytes.data() + ((e * 40 + j) * 48 + h) * 2,
                                  w.fc2.values.data() + ((e * 48 + h) * 40 + j) * 2, 2),
                      0);
        }
  }
}

TEST(LayerWeights, ShardsSpreadOverFiles) {
  const MoeSpec s = small_spec(WeightFormat::kBF16, 4, 64, 32);
  const ModelFamily& fam = find_model_family("qwen3_moe");
  const MoeWeights w = quant::make_random_weights(s, 11);
  const std::string whole = temp_path("whole.safetensors");
  save_layer_weights(whole, fam, 0, s, w);
  auto tensors = read_tensors(whole);
  std::vector<NamedTensor> a, b;
  for (std::size_t i = 0; i < tensors.size(); ++i) (i % 3 == 0 ? a : b).push_back(tensors[i]);
  const std::string pa = temp_path("a.safetensors"), pb = temp_path("b.safetensors");
  write_tensors(pa, a);
  write_tensors(pb, b);
  expect_same(load_layer_weights({pa, pb}, fam, 0, s), w, "two files");
  // The same tensor in two files is ambiguous.
  try {
    load_layer_weights({pa, pb, whole}, fam, 0, s);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadFile);
    EXPECT_NE(std::string(e.what()).find(whole), std::string::npos) << e.what();
  }
  // A folder and an index file name the same shards.
  const std::string index = temp_path("model.safetensors.index.json");
  {
    std::ofstream f(index);
    f << R"({"metadata": {}, "weight_map": {"x": ")"
      << std::filesystem::path(pa).filename().string() << R"(", "y": ")"
      << std::filesystem::path(pb).filename().string() << R"("}})";
  }
  const auto files = checkpoint_files(index);
  ASSERT_EQ(files.size(), 2u);
  expect_same(load_layer_weights(files, fam, 0, s), w, "index");
  EXPECT_EQ(checkpoint_files(pa), std::vector<std::string>{pa});
}

// Rewrites `path` with tensor `name` changed by `edit` (or removed when edit returns false).
void edit_tensor(const std::string& path, const std::string& name,
                 const std::function<bool(NamedTensor&)>& edit) {
  auto tensors = read_tensors(path);
  const auto meta = read_metadata(path);
  std::vector<NamedTensor> out;
  bool found = false;
  for (auto& t : tensors) {
    if (t.name == name) {
      found = true;
      if (!edit(t)) continue;
    }
    out.push_back(t);
  }
  ASSERT_TRUE(found) << name;
  write_tensors(path, out, meta);
}

void expect_load_error(const std::string& path, const ModelFamily& fam, const MoeSpec& s,
                       ErrorCode code, const std::vector<std::string>& parts) {
  test::expect_error(code, parts, [&] { load_layer_weights({path}, fam, 0, s); });
}

TEST(LayerWeights, MismatchNamesFileTensorExpectedAndFound) {
  const MoeSpec s = small_spec(WeightFormat::kBF16, 4, 64, 32);
  const ModelFamily& fam = find_model_family("mixtral");
  const MoeWeights w = quant::make_random_weights(s, 12);
  const std::string t = "model.layers.0.block_sparse_moe.experts.1.w3.weight";
  {
    const std::string path = temp_path("dtype.safetensors");
    save_layer_weights(path, fam, 0, s, w);
    edit_tensor(path, t, [](NamedTensor& x) {
      x.dtype = DType::kFloat16;
      return true;
    });
    expect_load_error(path, fam, s, ErrorCode::kBadFile, {path, t, "BF16", "F16"});
  }
  {
    const std::string path = temp_path("shape.safetensors");
    save_layer_weights(path, fam, 0, s, w);
    edit_tensor(path, t, [](NamedTensor& x) {
      x.shape = {64, 32};
      return true;
    });
    expect_load_error(path, fam, s, ErrorCode::kBadFile, {path, t, "[32, 64]", "[64, 32]"});
  }
  {
    const std::string path = temp_path("missing.safetensors");
    save_layer_weights(path, fam, 0, s, w);
    edit_tensor(path, t, [](NamedTensor&) { return false; });
    expect_load_error(path, fam, s, ErrorCode::kBadFile, {path, t});
  }
  {
    // Another layer is not in the file.
    const std::string path = temp_path("layer.safetensors");
    save_layer_weights(path, fam, 0, s, w);
    try {
      load_layer_weights({path}, fam, 1, s);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadFile);
      EXPECT_NE(std::string(e.what()).find("model.layers.1."), std::string::npos) << e.what();
    }
  }
  {
    // The spec expects another shape than the file holds.
    const std::string path = temp_path("spec.safetensors");
    save_layer_weights(path, fam, 0, s, w);
    MoeSpec other = s;
    other.intermediate = 48;
    expect_load_error(path, fam, other, ErrorCode::kBadFile, {path, "[48, 64]", "[32, 64]"});
  }
  {
    // gpt-oss blocks and biases.
    const MoeSpec g = gpt_oss_spec(WeightFormat::kMXFP4, GateUpLayout::kInterleaved);
    const ModelFamily& gf = find_model_family("gpt_oss");
    const std::string path = temp_path("gptoss.safetensors");
    save_layer_weights(path, gf, 0, g, random_weights(g, 13, gf));
    const std::string blocks = "model.layers.0.mlp.experts.down_proj_blocks";
    edit_tensor(path, blocks, [](NamedTensor& x) {
      x.shape = {4, 64, 32};
      return true;
    });
    expect_load_error(path, gf, g, ErrorCode::kBadFile,
                      {path, blocks, "[4, 64, 2, 16]", "[4, 64, 32]"});
    save_layer_weights(path, gf, 0, g, random_weights(g, 13, gf));
    const std::string bias = "model.layers.0.mlp.experts.gate_up_proj_bias";
    edit_tensor(path, bias, [](NamedTensor& x) {
      x.dtype = DType::kInt8;  // same byte count as the bf16 [4, 128]
      x.shape = {4, 128, 2};
      return true;
    });
    expect_load_error(path, gf, g, ErrorCode::kBadFile, {path, bias, "I8"});
  }
}

// fp8 exports other than DeepSeek's store weight_scale_inv as bf16: read and widened to fp32.
TEST(LayerWeights, Bf16BlockScalesAreWidened) {
  const MoeSpec s = deepseek_spec();
  const ModelFamily& fam = find_model_family("deepseek_v3");
  const MoeWeights w = quant::make_random_weights(s, 17);
  const std::string path = test::temp_path("bf16scales.safetensors");
  save_layer_weights(path, fam, 0, s, w);
  const std::string name = "model.layers.0.mlp.experts.3.up_proj.weight_scale_inv";
  std::vector<float> rounded;
  edit_tensor(path, name, [&](NamedTensor& t) {
    rounded = named_tensor_to_floats(t);
    round_to_bf16(rounded);
    t = named_tensor_from_floats(t.name, DType::kBFloat16, t.shape, rounded.data());
    return true;
  });
  const MoeWeights back = load_layer_weights({path}, fam, 0, s);
  // Expert 3's FC1 blocks: [4 row blocks (gate 2, up 2), 2 column blocks]; up is rows 2..3.
  MoeWeights want = w;
  for (int i = 0; i < 4; ++i) want.fc1.scales[(3 * 4 + 2) * 2 + i] = rounded[i];
  expect_same(back, want, "bf16 scales");
  EXPECT_NE(rounded, std::vector<float>(w.fc1.scales.begin() + 28, w.fc1.scales.begin() + 32));
}

// Newer exports type the MXFP4 scales F8_E8M0 rather than U8: the same bytes, accepted.
TEST(LayerWeights, E8m0ScalesTypedF8E8M0) {
  const MoeSpec s = gpt_oss_spec(WeightFormat::kMXFP4, GateUpLayout::kInterleaved);
  const ModelFamily& fam = find_model_family("gpt_oss");
  const MoeWeights w = random_weights(s, 18, fam);
  const std::string u8 = test::temp_path("u8.safetensors"), e8 = test::temp_path("e8.safetensors");
  save_layer_weights(u8, fam, 0, s, w);
  {
    const io::SafetensorsFile f(u8);
    std::vector<io::TensorRef> refs;
    for (const auto& t : f.tensors()) {
      const bool scales = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, "_scales") == 0;
      refs.push_back({t.name, scales ? io::StDtype::kF8E8M0 : t.dtype, t.shape, f.bytes(t)});
    }
    io::write_safetensors(e8, refs);
  }
  expect_same(load_layer_weights({e8}, fam, 0, s), w, "F8_E8M0 scales");
}

TEST(LayerWeights, NativeFormatMismatchNamesBoth) {
  MoeSpec s = small_spec(WeightFormat::kInt8Group, 2, 128, 128);
  const ModelFamily& fam = find_model_family("moekit");
  const std::string path = temp_path("native.safetensors");
  save_layer_weights(path, fam, 0, s, quant::make_random_weights(s, 14));
  MoeSpec other = s;
  other.weights.format = WeightFormat::kInt4Group;
  expect_load_error(path, fam, other, ErrorCode::kFormatMismatch, {"int8", "int4"});
  MoeSpec group = s;
  group.weights.group_size = 64;
  expect_load_error(path, fam, group, ErrorCode::kFormatMismatch, {"128", "64"});
}

TEST(LayerWeights, UnsupportedCombinations) {
  const ModelFamily& mixtral = find_model_family("mixtral");
  const std::string path = temp_path("x.safetensors");
  MoeSpec s = small_spec(WeightFormat::kBF16, 4, 64, 32);
  save_layer_weights(path, mixtral, 0, s, quant::make_random_weights(s, 15));
  auto expect_unsupported = [&](const ModelFamily& fam, const MoeSpec& spec,
                                const std::string& part) {
    try {
      load_layer_weights({path}, fam, 0, spec);
      ADD_FAILURE() << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fam.name), std::string::npos) << e.what();
    }
  };
  MoeSpec mx = small_spec(WeightFormat::kMXFP4, 4, 64, 32);
  expect_unsupported(mixtral, mx, "mxfp4");
  MoeSpec bias = s;
  bias.fc1_bias = true;
  expect_unsupported(mixtral, bias, "fc1_bias");
  MoeSpec ng = s;
  ng.activation.kind = ActivationKind::kGeLUErf;
  expect_unsupported(mixtral, ng, "gated");
  expect_unsupported(find_model_family("deepseek_v3"), mx, "mxfp4");
  // fp8 128-row blocks cannot be interleaved from separate gate and up tensors.
  MoeSpec fp8 = small_spec(WeightFormat::kFP8Block128, 2, 256, 256);
  fp8.gate_up_layout = GateUpLayout::kInterleaved;
  MoeSpec fp8_halves = fp8;
  fp8_halves.gate_up_layout = GateUpLayout::kHalves;
  const std::string p8 = temp_path("fp8.safetensors");
  save_layer_weights(p8, mixtral, 0, fp8_halves, quant::make_random_weights(fp8_halves, 16));
  try {
    load_layer_weights({p8}, mixtral, 0, fp8);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
  // Saving needs the full set; an invalid spec is refused before anything is read.
  MoeSpec sharded = s;
  sharded.ep_size = 2;
  try {
    save_layer_weights(temp_path("y.safetensors"), mixtral, 0, sharded,
                       quant::make_random_weights(sharded, 1));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  MoeSpec invalid = s;
  invalid.top_k = 0;
  try {
    load_layer_weights({path}, mixtral, 0, invalid);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidSpec) << e.what();
  }
}

TEST(LayerWeights, Families) {
  for (const char* n : {"mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4", "moekit"})
    EXPECT_EQ(find_model_family(n).name, n);
  try {
    find_model_family("gpt2");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("mixtral"), std::string::npos);
  }
  EXPECT_EQ(expand_tensor_name("model.layers.{L}.experts.{e}.w1.{L}", 12, 7),
            "model.layers.12.experts.7.w1.12");
}

// A family is plain data: a copy with other names (or formats) reads and writes its own files.
TEST(LayerWeights, CustomFamily) {
  ModelFamily mine = find_model_family("qwen3_moe");
  mine.name = "mine";
  mine.gate_proj = "blk.{L}.ffn.{e}.g";
  mine.up_proj = "blk.{L}.ffn.{e}.u";
  mine.down_proj = "blk.{L}.ffn.{e}.d";
  const MoeSpec s = small_spec(WeightFormat::kBF16, 4, 64, 32);
  const MoeWeights w = quant::make_random_weights(s, 19);
  const std::string path = test::temp_path("mine.safetensors");
  save_layer_weights(path, mine, 2, s, w);
  EXPECT_NO_THROW(read_tensor(path, "blk.2.ffn.3.u"));
  expect_same(load_layer_weights({path}, mine, 2, s), w, "mine");

  ModelFamily mx = find_model_family("gpt_oss");
  mx.formats = {WeightFormat::kMXFP8};
  const MoeSpec m = gpt_oss_spec(WeightFormat::kMXFP8, GateUpLayout::kHalves);
  const MoeWeights wm = random_weights(m, 20, mx);
  save_layer_weights(path, mx, 0, m, wm);
  EXPECT_EQ(read_tensor(path, "model.layers.0.mlp.experts.down_proj_blocks").shape,
            (std::vector<int64_t>{4, 64, 2, 32}));
  expect_same(load_layer_weights({path}, mx, 0, m), wm, "mxfp8 fused");
}

// ---- NVIDIA ModelOpt's NVFP4 files, and tensors the spec's options do not read ---------------

// NVFP4 weights from known values (no encoder involved): e2m1 code of element (e, r, c) and
// e4m3 block-scale byte of (e, r, group), per projection tag.
uint8_t known_code(int tag, int64_t e, int64_t r, int64_t c) {
  return static_cast<uint8_t>((tag * 7 + e * 5 + r * 3 + c) % 16);
}
uint8_t known_scale(int tag, int64_t e, int64_t r, int64_t g) {
  return static_cast<uint8_t>(0x30 + (tag + e + r + 2 * g) % 12);  // e4m3 0.5 .. 1.375
}
QuantizedTensor known_nvfp4(int tag, int64_t experts, int64_t rows, int64_t cols,
                            std::vector<float> global) {
  QuantizedTensor t;
  t.format = WeightFormat::kNVFP4;
  t.experts = experts;
  t.rows = rows;
  t.cols = cols;
  t.group_size = 16;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols / 2; ++j)
        t.values.push_back(static_cast<uint8_t>(known_code(tag, e, r, 2 * j) |
                                                (known_code(tag, e, r, 2 * j + 1) << 4)));
      for (int64_t g = 0; g < cols / 16; ++g) t.scale_bytes.push_back(known_scale(tag, e, r, g));
    }
  t.global_scale = std::move(global);
  return t;
}

// The same experts as ModelOpt exports them: per projection `weight` (U8, two e2m1 per byte,
// low nibble first), `weight_scale` (F8_E4M3 [rows, cols/16]), `weight_scale_2` (F32 scalar)
// and `input_scale` (F32 scalar). FC1 rows [0, I) are gate, [I, 2I) up (halves layout).
std::vector<NamedTensor> modelopt_tensors(const ModelFamily& fam, const MoeWeights& w) {
  std::vector<NamedTensor> out;
  auto projection = [&](const std::string& pattern, const QuantizedTensor& t, int64_t e,
                        int64_t row0, int64_t rows) {
    const std::string name = expand_tensor_name(pattern, 0, e);
    const std::string base = name.substr(0, name.size() - std::string("weight").size());
    const int64_t vb = t.cols / 2, sb = t.cols / 16;
    out.push_back(make_named_tensor(name, DType::kUInt8, {rows, vb},
                                    t.values.data() + (e * t.rows + row0) * vb));
    out.push_back(make_named_tensor(name + "_scale", DType::kFloat8E4M3, {rows, sb},
                                    t.scale_bytes.data() + (e * t.rows + row0) * sb));
    out.push_back(make_named_tensor(name + "_scale_2", DType::kFloat32, {}, &t.global_scale[e]));
    const float input_scale = 0.02f;  // W4A4's activation scale: checked, not used
    out.push_back(make_named_tensor(base + "input_scale", DType::kFloat32, {}, &input_scale));
  };
  const int64_t I = w.fc2.cols;
  for (int64_t e = 0; e < w.fc1.experts; ++e) {
    projection(fam.gate_proj, w.fc1, e, 0, I);
    projection(fam.up_proj, w.fc1, e, I, I);
    projection(fam.down_proj, w.fc2, e, 0, w.fc2.rows);
  }
  return out;
}

NamedTensor* find_named(std::vector<NamedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  ADD_FAILURE() << name;
  return &ts.front();
}

TEST(LayerWeightsModelOpt, Nvfp4LoadsAsTheSameWeightsAsMoekitsLayout) {
  MoeSpec s = small_spec(WeightFormat::kNVFP4, 2, 64, 32);
  s.act_dtype = DType::kBFloat16;
  MoeWeights w;
  w.fc1 = known_nvfp4(0, 2, 64, 64, {0.5f, 0.1f});
  w.fc2 = known_nvfp4(1, 2, 64, 32, {0.25f, 3.0f});
  const std::string native = temp_path("native.safetensors");
  save_layer_weights(native, find_model_family("moekit"), 0, s, w);
  const MoeWeights from_native = load_layer_weights({native}, find_model_family("moekit"), 0, s);
  expect_same(from_native, w, "moekit layout");

  // Known values: up row 2 (fc1 row 34) of expert 1, element 17 (group 1).
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::vector<float> d(64 * 64);
  quant::dequantize_expert(from_native.fc1, 1, d.data());
  const float block = numeric::e4m3_to_float(known_scale(0, 1, 34, 1)) * 0.1f;
  EXPECT_EQ(d[34 * 64 + 17], e2m1[known_code(0, 1, 34, 17)] * block);

  for (const char* family : {"qwen3_moe", "mixtral", "deepseek_v3"}) {
    SCOPED_TRACE(family);
    const ModelFamily& fam = find_model_family(family);
    const std::string path = temp_path(std::string(family) + ".safetensors");
    write_tensors(path, modelopt_tensors(fam, w), {});
    const MoeWeights from_modelopt = load_layer_weights({path}, fam, 0, s);
    expect_same(from_modelopt, w, "ModelOpt layout");

    // The same output through the reference, bit for bit.
    const int64_t tokens = 3;
    std::vector<float> hidden(tokens * 64), route(tokens * 2, 0.5f), a(tokens * 64), b(a);
    for (std::size_t i = 0; i < hidden.size(); ++i)
      hidden[i] = quant::round_to(DType::kBFloat16, 0.01f * static_cast<float>(int(i % 23) - 11));
    const std::vector<int32_t> ids = {0, 1, 1, 0, 0, 1};
    ASSERT_TRUE(reference::forward(s, from_modelopt, tokens, hidden.data(), ids.data(),
                                   route.data(), a.data())
                    .ok());
    ASSERT_TRUE(reference::forward(s, from_native, tokens, hidden.data(), ids.data(), route.data(),
                                   b.data())
                    .ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    EXPECT_NE(a, std::vector<float>(a.size(), 0.0f));
  }
}

TEST(LayerWeightsModelOpt, Nvfp4ScalesAreChecked) {
  const MoeSpec s = small_spec(WeightFormat::kNVFP4, 2, 64, 32);
  const ModelFamily& fam = find_model_family("qwen3_moe");
  MoeWeights w;
  w.fc1 = known_nvfp4(0, 2, 64, 64, {0.5f, 0.1f});
  w.fc2 = known_nvfp4(1, 2, 64, 32, {0.25f, 3.0f});
  const std::string p = "model.layers.0.mlp.experts.1.";
  const std::string path = temp_path("scales.safetensors");
  auto write_edited = [&](const std::function<void(std::vector<NamedTensor>&)>& edit) {
    auto ts = modelopt_tensors(fam, w);
    edit(ts);
    write_tensors(path, ts, {});
  };
  // Missing global scale.
  write_edited([&](std::vector<NamedTensor>& ts) {
    ts.erase(ts.begin() + (find_named(ts, p + "down_proj.weight_scale_2") - ts.data()));
  });
  expect_load_error(path, fam, s, ErrorCode::kBadFile, {path, p + "down_proj.weight_scale_2"});
  // Gate and up with different global scales cannot share moekit's fused FC1 scale.
  write_edited([&](std::vector<NamedTensor>& ts) {
    const float other = 0.2f;
    std::memcpy(find_named(ts, p + "up_proj.weight_scale_2")->bytes.data(), &other, 4);
  });
  expect_load_error(path, fam, s, ErrorCode::kUnsupported,
                    {p + "gate_proj.weight_scale_2", p + "up_proj.weight_scale_2"});
  // A non-positive activation scale, and a global scale of another dtype.
  write_edited([&](std::vector<NamedTensor>& ts) {
    const float bad = -1.0f;
    std::memcpy(find_named(ts, p + "gate_proj.input_scale")->bytes.data(), &bad, 4);
  });
  expect_load_error(path, fam, s, ErrorCode::kBadFile, {path, p + "gate_proj.input_scale"});
  write_edited([&](std::vector<NamedTensor>& ts) {
    NamedTensor* t = find_named(ts, p + "down_proj.weight_scale_2");
    *t = named_tensor_from_floats(t->name, DType::kBFloat16, {}, std::vector<float>{0.25f}.data());
  });
  expect_load_error(path, fam, s, ErrorCode::kBadFile,
                    {path, p + "down_proj.weight_scale_2", "BF16", "F32 scalar"});
  // ModelOpt's NVFP4_AWQ adds a pre_quant_scale that moekit's NVFP4 does not apply: refused.
  write_edited([&](std::vector<NamedTensor>& ts) {
    const std::vector<float> ones(64, 1.0f);
    ts.push_back(named_tensor_from_floats(p + "gate_proj.pre_quant_scale", DType::kBFloat16, {64},
                                          ones.data()));
  });
  expect_load_error(path, fam, s, ErrorCode::kFormatMismatch,
                    {path, p + "gate_proj.pre_quant_scale"});
}

// Adds `t` to the file at `path`.
void add_tensor(const std::string& path, NamedTensor t) {
  auto tensors = read_tensors(path);
  const auto meta = read_metadata(path);
  tensors.push_back(std::move(t));
  write_tensors(path, tensors, meta);
}

TEST(LayerWeightsStrict, TensorsTheSpecDoesNotReadAreRefused) {
  const ModelFamily& native = find_model_family("moekit");
  // Saved with `with`, loaded with `without`: refused, naming the file and `tensor`.
  auto expect_refused = [&](const MoeSpec& with, const MoeSpec& without, const std::string& tensor,
                            uint64_t seed) {
    SCOPED_TRACE(tensor);
    const std::string path = temp_path(std::to_string(seed) + ".safetensors");
    save_layer_weights(path, native, 0, with, quant::make_random_weights(with, seed));
    expect_load_error(path, native, without, ErrorCode::kFormatMismatch, {path, tensor});
  };
  // An int4 file with zero points loaded as int4 without: refused, not run without them.
  MoeSpec z = small_spec(WeightFormat::kInt4Group, 2, 128, 64);
  z.weights.group_size = 32;
  z.weights.zero_points = true;
  MoeSpec plain = z;
  plain.weights.zero_points = false;
  expect_refused(z, plain, "layers.0.experts.fc1.zeros", 31);
  {
    // And the other way: zero points expected but absent.
    const std::string p2 = temp_path("nozeros.safetensors");
    save_layer_weights(p2, native, 0, plain, quant::make_random_weights(plain, 31));
    expect_load_error(p2, native, z, ErrorCode::kBadFile, {p2, "layers.0.experts.fc1.zeros"});
  }
  MoeSpec awq = plain;
  awq.weights.pre_quant_scale = true;
  expect_refused(awq, plain, "layers.0.experts.fc1.pre_quant_scale", 32);
  MoeSpec b = small_spec(WeightFormat::kFP16, 2, 64, 32);
  b.fc1_bias = b.fc2_bias = true;
  MoeSpec no1 = b, no2 = b;
  no1.fc1_bias = false;
  no2.fc2_bias = false;
  expect_refused(b, no1, "layers.0.experts.fc1_bias", 33);
  expect_refused(b, no2, "layers.0.experts.fc2_bias", 34);
  {
    // gpt-oss biases the spec lacks.
    const MoeSpec g = gpt_oss_spec(WeightFormat::kBF16, GateUpLayout::kInterleaved);
    const ModelFamily& gf = find_model_family("gpt_oss");
    const std::string path = temp_path("gptoss.safetensors");
    save_layer_weights(path, gf, 0, g, random_weights(g, 34, gf));
    MoeSpec no2 = g;
    no2.fc2_bias = false;
    expect_load_error(path, gf, no2, ErrorCode::kFormatMismatch,
                      {path, "model.layers.0.mlp.experts.down_proj_bias"});
  }
  {
    // A routing correction bias the spec's routing does not use.
    const ModelFamily& ds = find_model_family("deepseek_v3");
    const MoeSpec d = deepseek_spec();
    const std::string path = temp_path("correction.safetensors");
    save_layer_weights(path, ds, 0, d, quant::make_random_weights(d, 35));
    const MoeSpec plain = small_spec(WeightFormat::kFP8Block128, 8, 256, 256);
    expect_load_error(path, ds, plain, ErrorCode::kFormatMismatch,
                      {path, "model.layers.0.mlp.gate.e_score_correction_bias"});
  }
  {
    // Scales of a quantized format beside a bf16 checkpoint's weight.
    const ModelFamily& mixtral = find_model_family("mixtral");
    const MoeSpec s = small_spec(WeightFormat::kBF16, 4, 64, 32);
    const std::string path = temp_path("scales.safetensors");
    save_layer_weights(path, mixtral, 0, s, quant::make_random_weights(s, 36));
    const std::string extra = "model.layers.0.block_sparse_moe.experts.2.w3.weight_scale_inv";
    const float one = 1.0f;
    add_tensor(path, make_named_tensor(extra, DType::kFloat32, {1, 1}, &one));
    expect_load_error(path, mixtral, s, ErrorCode::kFormatMismatch, {path, extra});
  }
}

// e8m0 0xff is NaN: refused at load with file, tensor and position named (types.hpp).
TEST(LayerWeightsStrict, NanE8m0ScaleIsRefused) {
  {
    const MoeSpec g = gpt_oss_spec(WeightFormat::kMXFP4, GateUpLayout::kInterleaved);
    const ModelFamily& gf = find_model_family("gpt_oss");
    const std::string path = temp_path("mxfp4.safetensors");
    save_layer_weights(path, gf, 0, g, random_weights(g, 37, gf));
    const std::string scales = "model.layers.0.mlp.experts.down_proj_scales";  // [4, 64, 2]
    edit_tensor(path, scales, [](NamedTensor& t) {
      t.bytes[(2 * 64 + 5) * 2 + 1] = 0xff;
      return true;
    });
    expect_load_error(path, gf, g, ErrorCode::kBadFile,
                      {path, scales, "0xff", "expert 2", "row 5", "group 1"});
    // A rank whose experts do not include it loads.
    MoeSpec ep = g;
    ep.ep_size = 2;
    ep.ep_rank = 0;
    EXPECT_NO_THROW(load_layer_weights({path}, gf, 0, ep));
  }
  {
    const MoeSpec m = small_spec(WeightFormat::kMXFP8, 2, 64, 64);
    const ModelFamily& native = find_model_family("moekit");
    const std::string path = temp_path("mxfp8.safetensors");
    save_layer_weights(path, native, 0, m, quant::make_random_weights(m, 38));
    const std::string scales = "layers.0.experts.fc1.scales";
    edit_tensor(path, scales, [](NamedTensor& t) {
      t.bytes[3] = 0xff;
      return true;
    });
    expect_load_error(path, native, m, ErrorCode::kBadFile, {path, scales, "0xff", "expert 0"});
  }
}

}  // namespace
}  // namespace moekit
