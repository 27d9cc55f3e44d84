// The `moekit` command end to end: exit codes, one-line errors, --help, the file round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "moekit/io.hpp"
#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "quant/quant.hpp"
#include "support/command.hpp"
#ifdef MOEKIT_WITH_CUDA
#include "support/gpu.hpp"
#endif

namespace {

using testcmd::Ran;
using testcmd::slurp;

std::string tmp_dir() { return testcmd::test_dir("cli"); }

Ran moekit(const std::string& args) {
  return testcmd::run(tmp_dir(), testcmd::program("MOEKIT_TEST_CLI", MOEKIT_CLI_PATH) + " " + args);
}

// A small Qwen3-like layer the reference runs in milliseconds.
const char* kSmall = "--preset qwen3-30b-a3b --experts 8 --hidden 128 --intermediate 64 --backend reference";

TEST(Cli, PresetsListsRealModels) {
  Ran r = moekit("presets");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* name : {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "llama4-maverick"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

TEST(Cli, HelpOnEverySubcommand) {
  for (const char* sub : {"", "presets", "run", "resolve", "bench"}) {
    Ran r = moekit(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << sub;
  }
}

TEST(Cli, RunPrintsImplementationAndChecksum) {
  Ran r = moekit(std::string("run ") + kSmall + " --tokens 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("implementation: cpu.reference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
}

TEST(Cli, ErrorsAreOneLineAndNonZero) {
  for (const char* args : {"run --preset no-such-model", "run --preset qwen3-30b-a3b --tp-size 7 --experts 8",
                           "run --preset qwen3-30b-a3b --weights-format fp9", "resolve --preset qwen3-30b-a3b --backend nonsense",
                           "run --preset qwen3-30b-a3b --input /nonexistent/file.safetensors",
                           "bench --preset qwen3-30b-a3b --flush sideways"}) {
    Ran r = moekit(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("moekit: error: ", 0), 0u) << r.err;
  }
  EXPECT_NE(moekit("run --preset no-such-model").err.find("no-such-model"), std::string::npos);
  EXPECT_NE(moekit("bench --flush sideways").err.find("sideways"), std::string::npos);
  EXPECT_EQ(moekit("run --tokens 0").code, 2);  // command-line error
  EXPECT_EQ(moekit("bench --trace -1").code, 2);
  // bench sizes the workspace by --max-tokens where given, so a count past it is refused first.
  Ran small = moekit("bench --preset qwen3-30b-a3b --tokens 1,64 --max-tokens 8");
  EXPECT_EQ(small.code, 1) << small.out << small.err;
  EXPECT_NE(small.err.find("--max-tokens 8 is below the token count 64"), std::string::npos)
      << small.err;
  EXPECT_EQ(moekit("frobnicate").code, 2);
}

#ifdef MOEKIT_WITH_CUDA
// bench --trace on a small layer: one table line per kernel of the forward, finalize last.
TEST(Cli, BenchTraceListsTheForwardsKernels) {
  const std::string reason = moekit::devtest::gpu_skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  Ran r = moekit("bench --preset qwen3-30b-a3b --experts 8 --hidden 256 --intermediate 128 "
                 "--tokens 3 --trace 7");
  if (r.code == 1 && r.err.find("built without it") != std::string::npos) GTEST_SKIP() << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const size_t head = r.out.find("# trace of 7 replays (CUPTI)");
  ASSERT_NE(head, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("permute", head), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("finalize", head), std::string::npos) << r.out;
}

// bench measures the launch floor (an empty kernel's graph replay) and reports it in its header
// and JSON beside the copy and GEMM floors.
TEST(Cli, BenchReportsTheGraphLaunchFloor) {
  const std::string reason = moekit::devtest::gpu_skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string json = tmp_dir() + "/launch.json";
  Ran r = moekit("bench --preset qwen3-30b-a3b --experts 8 --hidden 256 --intermediate 128 "
                 "--tokens 2 --json " + json);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("graph launch"), std::string::npos) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(slurp(json));
  EXPECT_GT(doc.at("floors").at("graph_launch_us").get<double>(), 0.0) << doc.dump();
}
#endif

TEST(Cli, ResolveTableAndJson) {
  Ran t = moekit(std::string("resolve ") + kSmall);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("cpu.reference"), std::string::npos);
  Ran j = moekit(std::string("resolve ") + kSmall + " --json");
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_NO_THROW(moekit::resolution_from_json(j.out));
}

TEST(Cli, FileRoundTripMatchesTheLibrary) {
  using namespace moekit;
  const std::string d = tmp_dir();
  const int64_t tokens = 6, hidden = 128, experts = 8;
  std::vector<float> h(tokens * hidden), logits(tokens * experts);
  uint32_t s = 12345;
  for (auto& v : h) v = ((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f * 2 - 1;
  for (auto& v : logits) v = ((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f * 4 - 2;
  write_tensors(d + "/in.safetensors", {named_tensor_from_floats("hidden", DType::kBFloat16, {tokens, hidden}, h.data()),
                                        named_tensor_from_floats("router_logits", DType::kFloat32, {tokens, experts}, logits.data())});
  Ran r = moekit(std::string("run ") + kSmall + " --seed 3 --input " + d + "/in.safetensors --output " + d + "/out.safetensors");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<float> got = named_tensor_to_floats(read_tensor(d + "/out.safetensors", "output"));

  // The same forward through the library.
  MoeSpec spec = find_preset("qwen3-30b-a3b").spec;
  spec.num_experts = experts;
  spec.hidden = hidden;
  spec.intermediate = 64;
  spec.max_tokens = tokens;
  MoeWeights w = quant::make_random_weights(spec, 3);
  LayerOptions o;
  o.backend = "reference";
  auto layer = MoeLayer::create(spec, w, o);
  std::vector<uint8_t> hb = read_tensor(d + "/in.safetensors", "hidden").bytes;
  std::vector<uint16_t> out(tokens * hidden);
  ForwardArgs a;
  a.hidden = host_view(hb.data(), DType::kBFloat16, {tokens, hidden});
  a.router_logits = host_view(logits.data(), DType::kFloat32, {tokens, experts});
  a.output = host_view(out.data(), DType::kBFloat16, {tokens, hidden});
  layer->forward(a);
  const std::vector<float> want = named_tensor_to_floats(make_named_tensor("o", DType::kBFloat16, {tokens, hidden}, out.data()));
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;

  // The same weights written as a Qwen3-MoE checkpoint layer and loaded with --weights.
  save_layer_weights(d + "/layer.safetensors", find_model_family("qwen3_moe"), 5, spec, w);
  Ran r2 = moekit(std::string("run ") + kSmall + " --weights " + d + "/layer.safetensors --layer 5 --input " + d +
                  "/in.safetensors --output " + d + "/out2.safetensors");
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_EQ(named_tensor_to_floats(read_tensor(d + "/out2.safetensors", "output")), want);
  // A layer that is not in the file is one clear error naming the tensor.
  Ran r3 = moekit(std::string("run ") + kSmall + " --weights " + d + "/layer.safetensors --layer 6");
  EXPECT_EQ(r3.code, 1);
  EXPECT_NE(r3.err.find("layers.6"), std::string::npos) << r3.err;
}

}  // namespace
