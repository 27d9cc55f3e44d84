// The `moekit` command: presets, run, resolve, bench. Every error is one line on stderr and a
// non-zero exit (1: moekit refused or failed; 2: bad command line, from CLI11).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "cli_common.hpp"
#include "moekit/environment.hpp"
#include "moekit/io.hpp"
#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "quant/quant.hpp"
#include "routing/routing.hpp"

namespace moekit::cli {
namespace {

// Options shared by run, resolve and bench: a preset and what to change in it.
struct LayerOpts {
  std::string preset = "qwen3-30b-a3b";
  std::string weights_format, act_dtype, activation, routing, backend = "auto";
  int64_t experts = 0, top_k = 0, hidden = 0, intermediate = 0, max_tokens = 0;
  int group_size = 0;
  int tp_size = 1, tp_rank = 0, ep_size = 1, ep_rank = 0;
  uint64_t seed = 1;

  void add_to(CLI::App* app) {
    app->add_option("--preset", preset, "built-in layer shape (see `moekit presets`)")->capture_default_str();
    app->add_option("--weights-format", weights_format, "bf16, fp16, fp32, fp8, fp8_block128, int8_group, int4_group, mxfp4, nvfp4, mxfp8");
    app->add_option("--group-size", group_size, "group size of int8_group / int4_group (32, 64, 128)");
    app->add_option("--act-dtype", act_dtype, "activation dtype: bf16, fp16, fp32");
    app->add_option("--activation", activation, "swiglu, swiglu_clamped, geglu_tanh, geglu_erf, silu, gelu_tanh, gelu_erf, relu2, identity");
    app->add_option("--routing", routing, "softmax_topk, topk_softmax, deepseek_v3, llama4, external");
    app->add_option("--experts", experts, "override the preset's expert count");
    app->add_option("--top-k", top_k, "override top-k");
    app->add_option("--hidden", hidden, "override hidden size");
    app->add_option("--intermediate", intermediate, "override intermediate size");
    app->add_option("--max-tokens", max_tokens, "workspace size in tokens (default: the largest token count asked for)");
    app->add_option("--tp-size", tp_size, "tensor-parallel size")->capture_default_str();
    app->add_option("--tp-rank", tp_rank, "tensor-parallel rank")->capture_default_str();
    app->add_option("--ep-size", ep_size, "expert-parallel size")->capture_default_str();
    app->add_option("--ep-rank", ep_rank, "expert-parallel rank")->capture_default_str();
    app->add_option("--backend", backend, "auto, a family (reference, cutlass) or an implementation id")->capture_default_str();
    app->add_option("--seed", seed, "seed of the random weights and inputs")->capture_default_str();
  }

  MoeSpec spec(int64_t tokens_hint) const {
    MoeSpec s = find_preset(preset).spec;
    auto parse = [](auto parsed, const std::string& what, const std::string& v) {
      if (!parsed) throw Error(ErrorCode::kInvalidArgument, "unknown " + what + " '" + v + "'");
      return *parsed;
    };
    if (!weights_format.empty()) {
      s.weights.format = parse(weight_format_from_string(weights_format), "weight format", weights_format);
    }
    if (group_size) s.weights.group_size = group_size;
    if (!act_dtype.empty()) s.act_dtype = parse(dtype_from_string(act_dtype), "activation dtype", act_dtype);
    if (!activation.empty()) s.activation.kind = parse(activation_from_string(activation), "activation", activation);
    if (!routing.empty()) s.routing.method = parse(routing_from_string(routing), "routing", routing);
    if (experts) s.num_experts = experts;
    if (top_k) s.top_k = top_k;
    if (hidden) s.hidden = hidden;
    if (intermediate) s.intermediate = intermediate;
    s.max_tokens = max_tokens ? max_tokens : std::max<int64_t>(tokens_hint, 1);
    s.tp_size = tp_size; s.tp_rank = tp_rank; s.ep_size = ep_size; s.ep_rank = ep_rank;
    s.validate_or_throw();
    return s;
  }
  LayerOptions options() const {
    LayerOptions o;
    o.backend = backend;
    return o;
  }
};

std::vector<int64_t> parse_tokens(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 1)
      throw Error(ErrorCode::kInvalidArgument, "token count '" + item + "' is not a positive integer");
    out.push_back(v);
  }
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "no token count given");
  return out;
}

double checksum(const std::vector<float>& v, double* abs_sum) {
  double s = 0, a = 0;
  for (float x : v) { s += x; a += std::fabs(x); }
  *abs_sum = a;
  return s;
}

void print_degradation(const Resolution& r) {
  if (!r.degraded_from) return;
  const Degradation& d = *r.degraded_from;
  if (d.chosen.empty())
    std::cout << "cannot run '" << d.requested << "': [" << to_string(d.reason.stage) << "] " << d.reason.reason << "\n";
  else
    std::cout << "degraded from '" << d.requested << "' to '" << d.chosen << "': [" << to_string(d.reason.stage)
              << "] " << d.reason.reason << "\n";
}

int cmd_presets() {
  std::printf("%-18s %5s %4s %6s %6s  %-13s %-15s %-12s  %s\n", "name", "E", "k", "H", "I", "routing",
              "activation", "weights", "description");
  for (const Preset& p : list_presets()) {
    const MoeSpec& s = p.spec;
    std::printf("%-18s %5lld %4lld %6lld %6lld  %-13s %-15s %-12s  %s\n", p.name.c_str(), (long long)s.num_experts,
                (long long)s.top_k, (long long)s.hidden, (long long)s.intermediate, to_string(s.routing.method),
                to_string(s.activation.kind), to_string(s.weights.format), p.description.c_str());
  }
  return 0;
}

struct RunOpts {
  int64_t tokens = 16;
  std::vector<std::string> weight_files;
  std::string family;
  int layer = 0;
  std::string input, output;
  bool check = false;
};

int cmd_run(const LayerOpts& lo, const RunOpts& ro) {
  HostInputs in;
  int64_t tokens = ro.tokens;
  std::vector<NamedTensor> input_tensors;
  if (!ro.input.empty()) {
    input_tensors = read_tensors(ro.input);
    auto it = std::find_if(input_tensors.begin(), input_tensors.end(), [](auto& t) { return t.name == "hidden"; });
    if (it == input_tensors.end() || it->shape.size() != 2)
      throw Error(ErrorCode::kBadFile, ro.input + ": needs a 2-D tensor 'hidden' [tokens, hidden]");
    tokens = it->shape[0];
  }
  const MoeSpec spec = lo.spec(tokens);
  if (!ro.input.empty()) in = inputs_from_tensors(spec, input_tensors, ro.input);
  else in = random_inputs(spec, tokens, lo.seed);

  MoeWeights w;
  if (!ro.weight_files.empty()) {
    // The preset's own family unless --family names another.
    const std::string family = ro.family.empty() ? find_preset(lo.preset).family : ro.family;
    std::vector<std::string> files;
    for (const auto& path : ro.weight_files)
      for (auto& f : checkpoint_files(path)) files.push_back(std::move(f));
    w = load_layer_weights(files, find_model_family(family), ro.layer, spec);
  } else {
    w = quant::make_random_weights(spec, lo.seed);
  }
  auto layer = MoeLayer::create(spec, w, lo.options());
  const Resolution& r = layer->resolution();
  std::cout << "implementation: " << r.chosen->id() << "\n";
  print_degradation(r);
  RunResult res = run_layer(*layer, in);
  double abs_sum = 0;
  const double sum = checksum(res.output, &abs_sum);
  std::printf("tokens %lld  hidden %lld  checksum sum=%.6e abs=%.6e  time %.3f ms\n", (long long)tokens,
              (long long)spec.hidden, sum, abs_sum, res.milliseconds);
  if (ro.check && r.chosen->id() != "cpu.reference") {
    LayerOptions ref_opts = lo.options();
    ref_opts.backend = "reference";
    auto ref_layer = MoeLayer::create(spec, w, ref_opts);
    RunResult ref = run_layer(*ref_layer, in);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < ref.output.size(); ++i) {
      const double d = double(res.output[i]) - ref.output[i];
      num += d * d;
      den += double(ref.output[i]) * ref.output[i];
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    std::printf("check against cpu.reference: relative error %.3e\n", rel);
    if (!(rel < 1e-2)) throw Error(ErrorCode::kInternal, "output differs from the CPU reference: relative error " + std::to_string(rel));
  }
  if (!ro.output.empty()) {
    write_tensors(ro.output, {output_tensor(spec, res.output, tokens)});
    std::cout << "wrote " << ro.output << "\n";
  }
  return 0;
}

int cmd_resolve(const LayerOpts& lo, bool json) {
  const MoeSpec spec = lo.spec(1);
  const Resolution r = resolve(spec, Environment::detected(), lo.backend);
  if (json) {
    std::cout << r.json() << "\n";
  } else {
    std::cout << r.table();  // the table already says what was not given, and why
  }
  return r.ok() ? 0 : 1;
}

int cmd_bench(LayerOpts lo, const std::string& tokens_list, const std::string& flush_text,
              const std::string& json_path, int trace_replays) {
  const std::vector<int64_t> tokens = parse_tokens(tokens_list);
  const L2Flush flush = parse_l2_flush(flush_text);
  // The workspace: --max-tokens where given (as a server sizes it for its largest batch; the
  // decode GEMVs' grids follow it), else the largest count asked for.
  const int64_t largest = *std::max_element(tokens.begin(), tokens.end());
  if (lo.max_tokens != 0 && lo.max_tokens < largest)
    throw Error(ErrorCode::kInvalidArgument, "--max-tokens " + std::to_string(lo.max_tokens) +
                                                 " is below the token count " +
                                                 std::to_string(largest));
  const int64_t max_t = lo.max_tokens != 0 ? lo.max_tokens : largest;
  std::vector<std::string> presets;
  {
    std::stringstream ss(lo.preset);
    std::string p;
    while (std::getline(ss, p, ',')) presets.push_back(p);
  }
  const Floors floors = measure_floors(flush);
  std::printf("# moekit bench on %s; floors: copy %.2f TB/s (read+write), BF16 GEMM %.0f TFLOP/s (cuBLAS 8192^3), "
              "graph launch %.1f us (an empty kernel's replay, timed as the rows)\n",
              floors.gpu_name.c_str(), floors.copy_bytes_per_s / 1e12, floors.gemm_flops_per_s / 1e12,
              floors.launch_us);
  std::printf(
      "# median of graph replays, L2 flush before each: %s; routing included; random routing; "
      "workspace for %lld tokens\n",
      flush == L2Flush::kRead    ? "256 MiB read (L2 left clean)"
      : flush == L2Flush::kWrite ? "256 MiB written (L2 left dirty)"
                                 : "none",
      static_cast<long long>(max_t));
  std::printf("%-16s %6s %10s %9s %9s %6s %8s %6s %8s %6s %10s  %s\n", "preset", "T", "median_us", "p10", "p90",
              "hit", "GB/s", "%bw", "TFLOP/s", "%gemm", "floor_us", "implementation");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : presets) {
    lo.preset = name;
    if (lo.weights_format.empty()) lo.weights_format = "bf16";
    if (lo.act_dtype.empty()) lo.act_dtype = "bf16";
    LayerOpts one = lo;
    one.max_tokens = max_t;
    MoeSpec spec = one.spec(max_t);
    MoeWeights w = fast_random_weights(spec, lo.seed);
    auto layer = MoeLayer::create(spec, w, lo.options());
    std::vector<float> bias = w.routing_bias;
    if (bias.empty()) bias.assign(spec.num_experts, 0.0f);
    w = MoeWeights{};  // the engine holds its own copy
    const LocalProblem lp = derive_local(spec);
    const double es = dtype_size(spec.act_dtype);
    const double expert_bytes = (lp.fc1_rows * lp.hidden + lp.hidden * lp.intermediate) * es;
    for (int64_t t : tokens) {
      HostInputs in = random_inputs(spec, t, lo.seed + t);
      BenchRow row;
      row.preset = name;
      row.tokens = t;
      // Experts actually hit (the weights that must be read), from the same routing on the host.
      std::vector<int32_t> ids(t * spec.top_k);
      std::vector<float> wts(t * spec.top_k);
      throw_if_error(routing::route_host(spec.routing, t, spec.num_experts, spec.top_k, in.router_logits.data(),
                                         spec.routing.correction_bias ? bias.data() : nullptr, ids.data(), wts.data()));
      std::set<int32_t> hit(ids.begin(), ids.end());
      row.experts_hit = static_cast<int64_t>(hit.size());
      row.bytes = row.experts_hit * expert_bytes + 2.0 * t * spec.hidden * es + 4.0 * t * spec.num_experts;
      row.flops = 2.0 * t * spec.top_k * (lp.fc1_rows * lp.hidden + lp.hidden * lp.intermediate);
      bench_layer_on_device(*layer, in, flush, row, trace_replays);
      const double s = row.median_us * 1e-6;
      const double floor_us = std::max(row.bytes / floors.copy_bytes_per_s, row.flops / floors.gemm_flops_per_s) * 1e6;
      std::printf("%-16s %6lld %10.1f %9.1f %9.1f %6lld %8.0f %5.0f%% %8.1f %5.0f%% %10.1f  %s\n", name.c_str(),
                  (long long)t, row.median_us, row.p10_us, row.p90_us, (long long)row.experts_hit, row.bytes / s / 1e9,
                  100.0 * row.bytes / s / floors.copy_bytes_per_s, row.flops / s / 1e12,
                  100.0 * row.flops / s / floors.gemm_flops_per_s, floor_us, layer->resolution().chosen->id().c_str());
      if (row.trace.replays > 0) print_trace(row.trace);
      std::fflush(stdout);
      nlohmann::json traced = nlohmann::json::array();
      for (const TracedKernel& k : row.trace.kernels)
        traced.push_back({{"kernel", k.name}, {"median_us", k.median_us}, {"median_gap_us", k.median_gap_us}});
      rows.push_back({{"preset", name}, {"tokens", t}, {"median_us", row.median_us}, {"p10_us", row.p10_us},
                      {"p90_us", row.p90_us}, {"reps", row.reps}, {"experts_hit", row.experts_hit},
                      {"bytes", row.bytes}, {"flops", row.flops}, {"floor_us", floor_us},
                      {"implementation", layer->resolution().chosen->id()}, {"l2_flush", to_string(flush)},
                      {"max_tokens", max_t}, {"trace", traced}});
    }
  }
  if (!json_path.empty()) {
    nlohmann::json doc = {{"gpu", floors.gpu_name},
                          {"environment", Environment::detected().fingerprint()},
                          {"floors", {{"copy_bytes_per_s", floors.copy_bytes_per_s}, {"gemm_flops_per_s", floors.gemm_flops_per_s},
                                      {"graph_launch_us", floors.launch_us}}},
                          {"rows", rows}};
    std::ofstream f(json_path);
    if (!f) throw Error(ErrorCode::kIo, "cannot write " + json_path);
    f << doc.dump(1) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace moekit::cli

int main(int argc, char** argv) {
  using namespace moekit::cli;
  CLI::App app{"moekit: the Mixture-of-Experts layer of LLM inference, on NVIDIA GPUs and the CPU"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help of every subcommand");

  auto* presets = app.add_subcommand("presets", "list the built-in layer shapes of real models");

  LayerOpts run_lo;
  RunOpts ro;
  auto* run = app.add_subcommand("run", "one forward of a preset or of a layer loaded from files");
  run_lo.add_to(run);
  run->add_option("--tokens", ro.tokens, "tokens in the batch")->capture_default_str()->check(CLI::PositiveNumber);
  run->add_option("--weights", ro.weight_files, "safetensors files, folders or *.safetensors.index.json holding the layer's experts");
  run->add_option("--family", ro.family, "model family naming the tensors (default: the preset's): mixtral, qwen3_moe, deepseek_v3, gpt_oss, llama4, moekit");
  run->add_option("--layer", ro.layer, "layer index inside the weight files")->capture_default_str();
  run->add_option("--input", ro.input, "safetensors file with 'hidden' [T,H] and 'router_logits' [T,E] (or 'topk_ids','topk_weights')");
  run->add_option("--output", ro.output, "write the output as tensor 'output' [T,H] to this safetensors file");
  run->add_flag("--check", ro.check, "also run the CPU reference and fail if the relative error is 1e-2 or more");

  LayerOpts res_lo;
  bool json = false;
  auto* res = app.add_subcommand("resolve", "which implementation would run this layer here, and why not the others");
  res_lo.add_to(res);
  res->add_flag("--json", json, "print the report as JSON");

  LayerOpts bench_lo;
  bench_lo.preset = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b";
  std::string tokens = "1,8,64,512,4096,16384", json_path, flush = "read";
  int trace_replays = 0;
  auto* bench = app.add_subcommand("bench", "time full forwards (CUDA graph replays) of presets on the GPU");
  bench_lo.add_to(bench);
  bench->add_option("--tokens", tokens, "comma-separated token counts")->capture_default_str();
  bench->add_option("--json", json_path, "also write the rows to this JSON file");
  bench->add_option("--flush", flush,
                    "how L2 is emptied before each replay: read (256 MiB read, L2 left clean), "
                    "write (256 MiB written, L2 left dirty), none")
      ->capture_default_str();
  bench->add_option("--trace", trace_replays,
                    "then replay each forward this many more times with CUPTI recording every "
                    "kernel, and print each kernel's median duration and gap from the one before")
      ->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the one-line reason
    return code == 0 ? 0 : 2;
  }
  try {
    if (*presets) return cmd_presets();
    if (*run) return cmd_run(run_lo, ro);
    if (*res) return cmd_resolve(res_lo, json);
    if (*bench) return cmd_bench(bench_lo, tokens, flush, json_path, trace_replays);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
