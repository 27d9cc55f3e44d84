// The `moekit` command end to end: exit codes, one-line errors, --help, the file round trip.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "moekit/io.hpp"
#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "moekit/version.hpp"
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

// Runs the command as a child of this process and measures its peak resident memory (KiB): the
// shell execs moekit, so wait4's ru_maxrss is moekit's own.
struct RanWithPeak {
  Ran ran;
  long peak_kib = -1;
};
RanWithPeak moekit_with_peak(const std::string& args) {
  const std::string dir = tmp_dir();
  const std::string cmd =
      "exec " + testcmd::program("MOEKIT_TEST_CLI", MOEKIT_CLI_PATH) + " " + args;
  const std::string out_path = dir + "/out.txt", err_path = dir + "/err.txt";
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  RanWithPeak r;
  int status = 0;
  struct rusage usage {};
  if (pid > 0 && wait4(pid, &status, 0, &usage) == pid) {
    r.ran.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.peak_kib = usage.ru_maxrss;
  }
  r.ran.out = slurp(out_path);
  r.ran.err = slurp(err_path);
  return r;
}

// The "spec" of `moekit resolve ... --json`.
nlohmann::json resolved_spec(const std::string& args) {
  Ran r = moekit("resolve " + args + " --json");
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(doc.is_discarded()) << r.out;
  return doc.is_discarded() ? nlohmann::json() : doc.value("spec", nlohmann::json());
}

// A small Qwen3-like layer the reference runs in milliseconds.
const char* kSmall =
    "--preset qwen3-30b-a3b --experts 8 --hidden 128 --intermediate 64 --backend reference";

TEST(Cli, PresetsListsRealModels) {
  Ran r = moekit("presets");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* name :
       {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "llama4-maverick"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

TEST(Cli, HelpOnEverySubcommand) {
  for (const char* sub : {"", "presets", "run", "resolve", "bench"}) {
    Ran r = moekit(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << sub;
  }
}

TEST(Cli, VersionIsTheLibrarys) {
  Ran r = moekit("--version");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(std::string("moekit ") + moekit::version()), std::string::npos) << r.out;
}

TEST(Cli, RunPrintsImplementationAndChecksum) {
  Ran r = moekit(std::string("run ") + kSmall + " --tokens 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("implementation: cpu.reference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
}

TEST(Cli, ErrorsAreOneLineAndNonZero) {
  for (const char* args :
       {"run --preset no-such-model", "run --preset qwen3-30b-a3b --tp-size 7 --experts 8",
        "run --preset qwen3-30b-a3b --weights-format fp9",
        "resolve --preset qwen3-30b-a3b --backend nonsense",
        "run --preset qwen3-30b-a3b --input /nonexistent/file.safetensors",
        "bench --preset qwen3-30b-a3b --flush sideways"}) {
    Ran r = moekit(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("moekit: error: ", 0), 0u) << r.err;
  }
  EXPECT_NE(moekit("run --preset no-such-model").err.find("no-such-model"), std::string::npos);
  EXPECT_NE(moekit("bench --flush sideways").err.find("sideways"), std::string::npos);
  EXPECT_EQ(moekit("run --tokens").code, 2);  // command-line error: a flag without its value
  // bench sizes the workspace by --max-tokens where given, so a count past it is refused first.
  Ran small = moekit("bench --preset qwen3-30b-a3b --tokens 1,64 --max-tokens 8");
  EXPECT_EQ(small.code, 1) << small.out << small.err;
  EXPECT_NE(small.err.find("--max-tokens 8 is below the token count 64"), std::string::npos)
      << small.err;
  EXPECT_EQ(moekit("frobnicate").code, 2);
}

// --ep-strategy: an unknown name is refused naming it, before the launcher's environment is read;
// a strategy given to a run that is not an expert-parallel rank would do nothing, and is refused.
TEST(Cli, EpStrategyIsCheckedAndOnlyForExpertParallelRuns) {
  const Ran bogus = moekit("run --preset qwen3-30b-a3b --ep-size 2 --ep-strategy bogus");
  EXPECT_EQ(bogus.code, 1) << bogus.out << bogus.err;
  EXPECT_NE(bogus.err.find("'bogus'"), std::string::npos) << bogus.err;
  for (const char* args : {"run --preset qwen3-30b-a3b --ep-strategy all_to_all",
                           "bench --preset qwen3-30b-a3b --ep-strategy all_to_all"}) {
    const Ran r = moekit(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("--ep-strategy all_to_all applies to expert-parallel runs"),
              std::string::npos)
        << args << ": " << r.err;
  }
}

#ifdef MOEKIT_WITH_CUDA
// bench --trace on a small layer: one table line per kernel of the forward, finalize last.
TEST(Cli, BenchTraceListsTheForwardsKernels) {
  const std::string reason = moekit::devtest::gpu_skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  Ran r = moekit(
      "bench --preset qwen3-30b-a3b --experts 8 --hidden 256 --intermediate 128 "
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
  Ran r = moekit(
      "bench --preset qwen3-30b-a3b --experts 8 --hidden 256 --intermediate 128 "
      "--tokens 2 --json " +
      json);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("graph launch"), std::string::npos) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(slurp(json));
  EXPECT_GT(doc.at("floors").at("graph_launch_us").get<double>(), 0.0) << doc.dump();
}

// bench with FP8 weights on a small layer: the rows say the format, the routing and the FP8 GEMM
// floor, and the bytes count each hit expert's FP8 values and fp32 block scales.
TEST(Cli, BenchFp8RowsCountValuesAndScales) {
  const std::string reason = moekit::devtest::gpu_skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string json = tmp_dir() + "/fp8.json";
  Ran r = moekit(
      "bench --preset qwen3-30b-a3b --experts 8 --hidden 512 --intermediate 256 "
      "--weights-format fp8_block128 --routing softmax_topk --tokens 2 --json " +
      json);
  if (r.code == 1 && r.err.find("bench times a CUDA implementation") != std::string::npos)
    GTEST_SKIP() << "no CUDA implementation takes fp8_block128 here: " << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("FP8 GEMM"), std::string::npos) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(slurp(json));
  EXPECT_GT(doc.at("floors").at("read_bytes_per_s").get<double>(), 0.0) << doc.dump();
  EXPECT_GT(doc.at("floors").at("fp8_gemm_flops_per_s").get<double>(), 0.0) << doc.dump();
  const nlohmann::json& row = doc.at("rows").at(0);
  EXPECT_EQ(row.at("weights_format"), "fp8_block128");
  EXPECT_EQ(row.at("routing"), "softmax_topk");
  EXPECT_EQ(row.at("gemm_floor"), "FP8");
  const int64_t hit = row.at("experts_hit").get<int64_t>();
  EXPECT_GE(hit, 1);
  EXPECT_LE(hit, 8);
  // FC1 [512, 512] and FC2 [512, 256]: one byte per value, 4 x 4 and 4 x 2 fp32 block scales.
  const double expert = 512 * 512 + 4 * 16 + 512 * 256 + 4 * 8;
  EXPECT_EQ(row.at("expert_bytes").get<double>(), expert);
  // Plus the activations in and out (bf16) and the logits (fp32).
  EXPECT_EQ(row.at("bytes").get<double>(), hit * expert + 2.0 * 2 * 512 * 2 + 4.0 * 2 * 8);
}
#endif

// A refused run's peak resident memory: the CUDA driver's context alone takes ~220 MB on an
// H100 (2026-12-07), far below the weights (1.7 GB for gpt-oss-120b's mxfp4 experts, 11 GB for
// DeepSeek-V3's fp8 ones) it must not draw.
constexpr long kRefusedPeakKib = 512 * 1024;

// bench takes the FP8 formats and another routing for the presets; without a GPU (or CUDA) the
// refusal is the resolver's or the device's, after the options were taken, and no weight is drawn.
TEST(Cli, BenchTakesFp8FormatsAndRouting) {
#ifdef MOEKIT_WITH_CUDA
  if (moekit::devtest::gpu_skip_reason().empty()) GTEST_SKIP() << "a GPU would run these";
#endif
  for (const char* args :
       {"--preset deepseek-v3 --weights-format fp8_block128 --routing softmax_topk",
        "--preset qwen3-30b-a3b --weights-format fp8_block128",
        "--preset deepseek-v3,qwen3-30b-a3b --weights-format fp8"}) {
    const RanWithPeak r = moekit_with_peak(std::string("bench ") + args + " --tokens 1,16384");
    EXPECT_EQ(r.ran.code, 1) << args << "\n" << r.ran.out << r.ran.err;
    EXPECT_EQ(r.ran.err.find("is not a known value"), std::string::npos) << args << r.ran.err;
    EXPECT_NE(r.ran.err.find("bench"), std::string::npos) << args << ": " << r.ran.err;
    EXPECT_EQ(std::count(r.ran.err.begin(), r.ran.err.end(), '\n'), 1) << r.ran.err;
    EXPECT_LT(r.peak_kib, kRefusedPeakKib) << args;
  }
  // The spec bench would time carries both options.
  const nlohmann::json spec =
      resolved_spec("--preset deepseek-v3 --weights-format fp8 --routing softmax_topk");
  EXPECT_EQ(spec.at("weights").at("format"), "fp8");
  EXPECT_EQ(spec.at("routing").at("method"), "softmax_topk");
}

TEST(Cli, BenchRefusesUnknownFormatsAndRoutingsNamingThem) {
  for (const auto& [args, value] : {std::pair{"--weights-format fp9", "'fp9'"},
                                    std::pair{"--weights-format fp8_block64", "'fp8_block64'"},
                                    std::pair{"--routing uniform", "'uniform'"}}) {
    Ran r = moekit(std::string("bench --preset deepseek-v3 ") + args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(value), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

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
  write_tensors(d + "/in.safetensors",
                {named_tensor_from_floats("hidden", DType::kBFloat16, {tokens, hidden}, h.data()),
                 named_tensor_from_floats("router_logits", DType::kFloat32, {tokens, experts},
                                          logits.data())});
  Ran r = moekit(std::string("run ") + kSmall + " --seed 3 --input " + d +
                 "/in.safetensors --output " + d + "/out.safetensors");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<float> got =
      named_tensor_to_floats(read_tensor(d + "/out.safetensors", "output"));

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
  const std::vector<float> want = named_tensor_to_floats(
      make_named_tensor("o", DType::kBFloat16, {tokens, hidden}, out.data()));
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;

  // The same weights written as a Qwen3-MoE checkpoint layer and loaded with --weights.
  save_layer_weights(d + "/layer.safetensors", find_model_family("qwen3_moe"), 5, spec, w);
  Ran r2 = moekit(std::string("run ") + kSmall + " --weights " + d +
                  "/layer.safetensors --layer 5 --input " + d + "/in.safetensors --output " + d +
                  "/out2.safetensors");
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_EQ(named_tensor_to_floats(read_tensor(d + "/out2.safetensors", "output")), want);
  // A layer that is not in the file is one clear error naming the tensor.
  Ran r3 =
      moekit(std::string("run ") + kSmall + " --weights " + d + "/layer.safetensors --layer 6");
  EXPECT_EQ(r3.code, 1);
  EXPECT_NE(r3.err.find("layers.6"), std::string::npos) << r3.err;
}

// A layer no implementation asked for can run is refused with the resolver's reason before any
// weight is built: gpt-oss-120b's mxfp4 weights (no cutlass engine runs mxfp4) are never drawn.
TEST(Cli, RefusesBeforeAllocating) {
  const RanWithPeak r = moekit_with_peak("run --preset gpt-oss-120b --backend cutlass");
  EXPECT_EQ(r.ran.code, 1) << r.ran.out << r.ran.err;
  EXPECT_NE(r.ran.err.find("cutlass"), std::string::npos) << r.ran.err;
  EXPECT_NE(r.ran.err.find("mxfp4"), std::string::npos)
      << "the reason names the format: " << r.ran.err;
  EXPECT_EQ(std::count(r.ran.err.begin(), r.ran.err.end(), '\n'), 1) << r.ran.err;
  ASSERT_GT(r.peak_kib, 0);
  EXPECT_LT(r.peak_kib, kRefusedPeakKib) << "peak resident memory of the refused run, KiB";
#ifndef MOEKIT_WITH_CUDA
  // Without CUDA, bench refuses with the resolver's reason, not a CUDA error, and allocates
  // nothing.
  const RanWithPeak b =
      moekit_with_peak("bench --preset deepseek-v3,qwen3-30b-a3b --tokens 1,16384");
  EXPECT_EQ(b.ran.code, 1) << b.ran.out << b.ran.err;
  EXPECT_NE(b.ran.err.find("cuda.sm90.cutlass"), std::string::npos) << b.ran.err;
  EXPECT_NE(b.ran.err.find("deepseek-v3"), std::string::npos) << b.ran.err;
  EXPECT_LT(b.peak_kib, 200 * 1024);
  // A host implementation asked for by name is no device implementation either.
  Ran ref = moekit(std::string("bench ") + kSmall + " --tokens 2");
  EXPECT_EQ(ref.code, 1) << ref.out << ref.err;
  EXPECT_NE(ref.err.find("cpu.reference"), std::string::npos) << ref.err;
#endif
}

TEST(Cli, Fp16WeightsWithBf16ActivationsNameTheDtypeNeeded) {
  Ran r = moekit(
      "run --preset qwen3-30b-a3b --experts 8 --hidden 128 --intermediate 64 --weights-format fp16 "
      "--act-dtype bf16 --backend cutlass");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("fp16 weights need fp16 activations, not bf16"), std::string::npos) << r.err;
}

TEST(Cli, RangeErrorsNameTheValue) {
  const struct {
    const char* args;
    const char* names;
  } cases[] = {
      {"run --tokens -1", "--tokens '-1'"},
      {"run --tokens many", "--tokens 'many'"},
      {"run --experts 0", "--experts '0'"},
      {"run --top-k 0", "--top-k '0'"},
      {"run --hidden -5", "--hidden '-5'"},
      {"run --intermediate 0", "--intermediate '0'"},
      {"run --max-tokens 0", "--max-tokens '0'"},
      {"run --tp-size 0", "--tp-size '0'"},
      {"run --tp-size 99999999999", "99999999999"},
      {"run --group-size 0", "--group-size '0'"},
      {"run --clamp-limit x", "--clamp-limit 'x'"},
      {"run --hidden 1.5", "--hidden '1.5'"},
      {"run --hidden 99999999999999999999", "99999999999999999999"},
      {"bench --trace -1", "--trace '-1'"},
      {"bench --tokens 0", "--tokens '0'"},
      {"bench --tokens 1,,2", "--tokens ''"},
      // Absurd sizes: refused by the spec's size bound, naming the value, not attempted.
      {"run --hidden 1e12", "1000000000000"},
      {"run --tokens 1e15", "1000000000000000"},
      {"bench --tokens 1e15", "1000000000000000"},
      {"run --experts 2000000000 --top-k 1", "2000000000"},
      // Within the bound but past any host's memory: 65536 experts of bf16 weights, 618 GB.
      {"run --experts 65536", "618475290624"},
  };
  for (const auto& c : cases) {
    const RanWithPeak r = moekit_with_peak(c.args);
    EXPECT_EQ(r.ran.code, 1) << c.args << "\n" << r.ran.out << r.ran.err;
    EXPECT_NE(r.ran.err.find(c.names), std::string::npos) << c.args << ": " << r.ran.err;
    EXPECT_EQ(std::count(r.ran.err.begin(), r.ran.err.end(), '\n'), 1)
        << c.args << ": " << r.ran.err;
    EXPECT_LT(r.peak_kib, kRefusedPeakKib) << c.args;
  }
}

TEST(Cli, EmptyBatchRuns) {
  const std::string out = tmp_dir() + "/empty.safetensors";
  Ran r = moekit(std::string("run ") + kSmall + " --tokens 0 --output " + out);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("tokens 0 "), std::string::npos) << r.out;
  EXPECT_EQ(moekit::read_tensor(out, "output").shape, (std::vector<int64_t>{0, 128}));
  Ran ext = moekit(std::string("run ") + kSmall + " --routing external --tokens 0");
  EXPECT_EQ(ext.code, 0) << ext.out << ext.err;
}

TEST(Cli, CheckAgainstItselfSaysSo) {
  Ran r = moekit(std::string("run ") + kSmall + " --tokens 2 --check");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("nothing to compare"), std::string::npos) << r.out;
}

TEST(Cli, InputFileAndTokensMustAgree) {
  using namespace moekit;
  const std::string d = tmp_dir();
  std::vector<float> h(3 * 128, 0.5f), logits(3 * 8, 0.25f);
  write_tensors(
      d + "/in.safetensors",
      {named_tensor_from_floats("hidden", DType::kBFloat16, {3, 128}, h.data()),
       named_tensor_from_floats("router_logits", DType::kFloat32, {3, 8}, logits.data())});
  Ran bad = moekit(std::string("run ") + kSmall + " --tokens 5 --input " + d + "/in.safetensors");
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("--tokens 5"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("3 tokens"), std::string::npos) << bad.err;
  Ran same = moekit(std::string("run ") + kSmall + " --tokens 3 --input " + d + "/in.safetensors");
  EXPECT_EQ(same.code, 0) << same.err;
  Ran implied = moekit(std::string("run ") + kSmall + " --input " + d + "/in.safetensors");
  EXPECT_EQ(implied.code, 0) << implied.err;
  EXPECT_NE(implied.out.find("tokens 3 "), std::string::npos) << implied.out;
}

// A flag that changes the routing method, activation kind or weight format drops the preset's
// parameters of that kind; one that keeps it keeps them.
TEST(Cli, OverridesReplaceThePresetsParametersOfThatKind) {
  nlohmann::json s = resolved_spec("--preset deepseek-v3 --routing softmax_topk");
  EXPECT_EQ(s["routing"]["method"], "softmax_topk");
  EXPECT_EQ(s["routing"]["n_group"], 1);
  EXPECT_EQ(s["routing"]["topk_group"], 1);
  EXPECT_EQ(s["routing"]["correction_bias"], false);
  EXPECT_EQ(s["routing"]["routed_scaling_factor"], 1.0);
  s = resolved_spec("--preset deepseek-v3 --routing deepseek_v3");
  EXPECT_EQ(s["routing"]["n_group"], 8) << "the same method keeps the preset's groups";
  s = resolved_spec(
      "--preset deepseek-v3 --n-group 4 --topk-group 2 --routed-scaling 1.5 --no-correction-bias "
      "--no-renormalize");
  EXPECT_EQ(s["routing"]["n_group"], 4);
  EXPECT_EQ(s["routing"]["topk_group"], 2);
  EXPECT_EQ(s["routing"]["routed_scaling_factor"], 1.5);
  EXPECT_EQ(s["routing"]["correction_bias"], false);
  EXPECT_EQ(s["routing"]["renormalize"], false);

  s = resolved_spec("--preset gpt-oss-120b --activation swiglu");
  EXPECT_EQ(s["activation"], (nlohmann::json{{"kind", "swiglu"}}));
  s = resolved_spec("--preset gpt-oss-120b --activation gelu_tanh");
  EXPECT_EQ(s["gate_up_layout"], "halves") << "no interleaved rows without a gate";
  s = resolved_spec("--preset gpt-oss-120b --activation swiglu_clamped --clamp-limit 5 --beta 0.5");
  EXPECT_EQ(s["activation"]["limit"], 5.0);
  EXPECT_EQ(s["activation"]["beta"], 0.5);
  EXPECT_NEAR(s["activation"]["alpha"].get<double>(), 1.702, 1e-6) << "the same kind keeps alpha";

  s = resolved_spec(
      "--preset qwen3-30b-a3b --weights-format int4_group --group-size 64 --zero-points "
      "--pre-quant-scale");
  EXPECT_EQ(s["weights"], (nlohmann::json{{"format", "int4_group"},
                                          {"group_size", 64},
                                          {"zero_points", true},
                                          {"pre_quant_scale", true},
                                          {"dynamic_activations", false}}));
  s = resolved_spec("--preset qwen3-30b-a3b --weights-format fp8 --dynamic-activations");
  EXPECT_EQ(s["weights"]["dynamic_activations"], true);
  s = resolved_spec(
      "--preset qwen3-30b-a3b --router-weight-on input --gate-up-layout interleaved --fc1-bias "
      "--fc2-bias --tp-size 2 --tp-rank 1 --ep-size 4 --ep-rank 3");
  EXPECT_EQ(s["routing"]["weight_placement"], "input");
  EXPECT_EQ(s["gate_up_layout"], "interleaved");
  EXPECT_EQ(s["fc1_bias"], true);
  EXPECT_EQ(s["fc2_bias"], true);
  EXPECT_EQ(s["tp_rank"], 1);
  EXPECT_EQ(s["ep_rank"], 3);
}

TEST(Cli, SpecFileReplacesThePreset) {
  const std::string d = tmp_dir();
  // What resolve --json prints under "spec" is what --spec reads.
  for (const char* preset : {"gpt-oss-120b", "deepseek-v3", "llama4-maverick"}) {
    const nlohmann::json s = resolved_spec(std::string("--preset ") + preset);
    std::ofstream(d + "/spec.json") << s.dump(2);
    EXPECT_EQ(resolved_spec("--spec " + d + "/spec.json"), s) << preset;
  }
  // A small layer from a file, run, and a flag overriding one of its fields.
  nlohmann::json small = resolved_spec(kSmall);
  small["max_tokens"] = 64;
  std::ofstream(d + "/small.json") << small.dump();
  Ran r = moekit("run --spec " + d + "/small.json --backend reference --tokens 3");
  ASSERT_EQ(r.code, 0) << r.err;
  Ran flags = moekit(std::string("run ") + kSmall + " --tokens 3 --max-tokens 64");
  ASSERT_EQ(flags.code, 0) << flags.err;
  auto checksum = [](const std::string& out) {
    const size_t a = out.find("checksum"), b = out.find(" time");
    return a == std::string::npos || b == std::string::npos ? out : out.substr(a, b - a);
  };
  EXPECT_EQ(checksum(r.out), checksum(flags.out)) << "the same layer from the file and from flags";
  // A batch past the file's max_tokens is refused, naming both.
  Ran past = moekit("run --spec " + d + "/small.json --backend reference --tokens 65");
  EXPECT_EQ(past.code, 1);
  EXPECT_NE(past.err.find("65"), std::string::npos) << past.err;
  EXPECT_NE(past.err.find("64"), std::string::npos) << past.err;
  EXPECT_EQ(resolved_spec("--spec " + d + "/small.json --hidden 256")["hidden"], 256);

  // Refused: --spec with --preset, a malformed file, a missing file, --weights without --family.
  Ran both = moekit("resolve --spec " + d + "/small.json --preset mixtral-8x7b");
  EXPECT_EQ(both.code, 1);
  EXPECT_NE(both.err.find("mixtral-8x7b"), std::string::npos) << both.err;
  std::ofstream(d + "/bad.json") << R"({"hidden": 128, "colour": "blue"})";
  Ran bad = moekit("resolve --spec " + d + "/bad.json");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("colour"), std::string::npos) << bad.err;
  EXPECT_EQ(moekit("resolve --spec " + d + "/missing.json").code, 1);
  Ran nofamily = moekit("run --spec " + d + "/small.json --weights " + d + "/small.json");
  EXPECT_EQ(nofamily.code, 1);
  EXPECT_NE(nofamily.err.find("--family"), std::string::npos) << nofamily.err;
}

}  // namespace
