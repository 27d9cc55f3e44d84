// The `moekit` command: presets, run, resolve, bench, tune. Every error is one line on stderr and a
// non-zero exit (1: moekit refused or failed; 2: bad command line, from CLI11).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <unistd.h>

#include "cli_common.hpp"
#include "cli_ep.hpp"
#include "moekit/environment.hpp"
#include "moekit/io.hpp"
#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "moekit/version.hpp"
#include "quant/quant.hpp"
#include "routing/routing.hpp"

namespace moekit::cli {
namespace {

// Options shared by run, resolve and bench: a preset (or a spec file) and what to change in it.
// Values are taken as text and parsed here, so that a bad one is refused with a sentence naming
// it (not CLI11's terse conversion error), and so that "not given" differs from every value.
struct LayerOpts {
  std::string preset = "qwen3-30b-a3b";
  std::string spec_file;
  std::string backend = "auto";
  std::string ep_strategy = "auto";  // with --ep-size N under a launcher
  uint64_t seed = 1;
  // bench only: the weight format and activation dtype of a preset when none is given.
  std::string default_weights_format, default_act_dtype;
  CLI::App* app = nullptr;
  std::map<std::string, std::string> text;  // each valued option, by its long name
  std::map<std::string, bool> flags;        // each on/off flag, by its long name

  void add_to(CLI::App* sub) {
    app = sub;
    auto opt = [&](const std::string& name, const std::string& help) {
      sub->add_option(name, text[name], help);
    };
    auto on_off = [&](const std::string& name, const std::string& help) {
      sub->add_flag(name + ",!--no-" + name.substr(2), flags[name],
                    help + " (--no-" + name.substr(2) + ": off)");
    };
    sub->add_option("--preset", preset, "built-in layer shape (see `moekit presets`)")
        ->capture_default_str();
    sub->add_option(
        "--spec", spec_file,
        "JSON file holding the whole layer spec (as `moekit resolve --json` prints under "
        "\"spec\"); replaces --preset, and the flags below override its fields");
    opt("--weights-format",
        "bf16, fp16, fp32, fp8, fp8_block128, int8_group, int4_group, mxfp4, nvfp4, mxfp8; another "
        "format than the preset's resets group size, zero points and pre-quant scale to defaults");
    opt("--group-size", "group size of int8_group / int4_group (32, 64, 128)");
    on_off("--zero-points", "int8_group / int4_group with zero points");
    on_off("--pre-quant-scale", "int8_group / int4_group with an AWQ pre-quant scale");
    on_off("--dynamic-activations",
           "fp8 (per-tensor) with activations quantized per token, not by a static input scale");
    opt("--act-dtype", "activation dtype: bf16, fp16, fp32");
    opt("--activation",
        "swiglu, swiglu_clamped, geglu_tanh, geglu_erf, silu, gelu_tanh, gelu_erf, relu2, "
        "identity; "
        "another kind than the preset's drops its clamp limit, alpha and beta");
    opt("--clamp-limit", "swiglu_clamped: clamp limit");
    opt("--alpha", "swiglu_clamped: sigmoid slope");
    opt("--beta", "swiglu_clamped: added to up");
    opt("--gate-up-layout", "halves (gate rows then up rows) or interleaved (gate, up, gate, ...)");
    on_off("--fc1-bias", "FC1 has a bias");
    on_off("--fc2-bias", "FC2 has a bias");
    opt("--routing",
        "softmax_topk, topk_softmax, deepseek_v3, llama4, external; another method than the "
        "preset's resets groups, scaling, correction bias, renormalization and placement to "
        "defaults");
    opt("--n-group", "deepseek_v3: expert groups");
    opt("--topk-group", "deepseek_v3: groups kept per token");
    opt("--routed-scaling", "factor on the routing weights moekit computes");
    on_off("--correction-bias", "deepseek_v3: selection correction bias");
    on_off("--renormalize", "deepseek_v3: normalize the k selected weights to sum 1");
    opt("--router-weight-on",
        "where the routing weight multiplies: output (the expert's output) or input");
    opt("--experts", "expert count (the preset's unless given)");
    opt("--top-k", "experts per token");
    opt("--hidden", "hidden size");
    opt("--intermediate", "intermediate size per expert, unsharded");
    opt("--max-tokens",
        "workspace size in tokens (default: the spec file's, else the largest token count asked "
        "for)");
    opt("--tp-size", "tensor-parallel size (default 1)");
    opt("--tp-rank", "tensor-parallel rank (default 0)");
    opt("--ep-size",
        "expert-parallel size (default 1); run, above 1 and without --ep-rank: this process is "
        "one rank of a run started by torchrun or mpirun (one process per GPU)");
    opt("--ep-rank", "expert-parallel rank (default 0): that rank's partial output alone");
    sub->add_option("--backend", backend,
                    "auto, a family (reference, cutlass) or an implementation id")
        ->capture_default_str();
    sub->add_option("--ep-strategy", ep_strategy,
                    "with --ep-size N under a launcher: auto, all_to_all_low_latency, all_to_all "
                    "or all_gather_reduce_scatter (a forced one that cannot run is refused with "
                    "its reason before anything is allocated)")
        ->capture_default_str();
    sub->add_option("--seed", seed, "seed of the random weights and inputs")->capture_default_str();
  }
  // run, resolve and bench: a tuning file (`moekit tune --out`) the layer reads.
  void add_tuning_file_to(CLI::App* sub) {
    sub->add_option("--tuning-file", tuning_file,
                    std::string("tuning file whose tactics the layer runs (default: $") +
                        kTuningFileEnv + "); problems with it are reported and fall back");
  }
  std::string tuning_file;
  // The option, else the environment variable, else empty.
  std::string tuning_path() const {
    if (!tuning_file.empty()) return tuning_file;
    const char* env = std::getenv(kTuningFileEnv);
    return env ? env : "";
  }

  bool given(const std::string& name) const { return app != nullptr && app->count(name) > 0; }
  const std::string& value(const std::string& name) const { return text.at(name); }
  int64_t count(const std::string& name, int64_t min) const {
    return parse_integer(name, value(name), min);
  }
  int small(const std::string& name, int min) const { return parse_int(name, value(name), min); }
  template <class E, class Parse>
  E named(const std::string& name, Parse parse, const std::string& fallback) const {
    const std::string& v = given(name) ? value(name) : fallback;
    const auto parsed = parse(v);
    if (!parsed)
      throw Error(ErrorCode::kInvalidArgument,
                  name + " '" + v + "' is not a known value (see --help)");
    return *parsed;
  }

  // The spec: the --spec file or the preset, then each flag given. A flag that changes the
  // weight format, activation kind or routing method first resets the parameters of that kind
  // (the preset's belong to its own format, activation or routing).
  MoeSpec spec(int64_t tokens_hint) const {
    MoeSpec s;
    if (!spec_file.empty()) {
      if (given("--preset"))
        throw Error(ErrorCode::kInvalidArgument, "--spec " + spec_file + " and --preset " + preset +
                                                     " both name the layer; give one of them");
      s = spec_from_json(read_text_file(spec_file));
    } else {
      s = find_preset(preset).spec;
    }
    const bool from_preset = spec_file.empty();
    const std::string fmt = given("--weights-format") ? value("--weights-format")
                            : from_preset             ? default_weights_format
                                                      : "";
    if (!fmt.empty()) {
      const WeightFormat f =
          named<WeightFormat>("--weights-format", weight_format_from_string, fmt);
      if (f != s.weights.format) {
        s.weights = WeightQuant{};
        s.weights.format = f;
      }
    }
    if (given("--group-size")) s.weights.group_size = small("--group-size", 1);
    if (given("--zero-points")) s.weights.zero_points = flags.at("--zero-points");
    if (given("--pre-quant-scale")) s.weights.pre_quant_scale = flags.at("--pre-quant-scale");
    if (given("--dynamic-activations"))
      s.weights.dynamic_activations = flags.at("--dynamic-activations");
    const std::string act = given("--act-dtype") ? value("--act-dtype")
                            : from_preset        ? default_act_dtype
                                                 : "";
    if (!act.empty()) s.act_dtype = named<DType>("--act-dtype", dtype_from_string, act);

    if (given("--activation")) {
      const ActivationKind k = named<ActivationKind>("--activation", activation_from_string, "");
      if (k != s.activation.kind) {
        s.activation = ActivationParams{};
        s.activation.kind = k;
        // The interleaved gate/up rows exist only for gated activations.
        if (!activation_is_gated(k)) s.gate_up_layout = GateUpLayout::kHalves;
      }
    }
    if (given("--clamp-limit")) s.activation.limit = real("--clamp-limit");
    if (given("--alpha")) s.activation.alpha = real("--alpha");
    if (given("--beta")) s.activation.beta = real("--beta");
    if (given("--gate-up-layout"))
      s.gate_up_layout = named<GateUpLayout>("--gate-up-layout", gate_up_layout_from_string, "");
    if (given("--fc1-bias")) s.fc1_bias = flags.at("--fc1-bias");
    if (given("--fc2-bias")) s.fc2_bias = flags.at("--fc2-bias");

    if (given("--routing")) {
      const RoutingMethod m = named<RoutingMethod>("--routing", routing_from_string, "");
      if (m != s.routing.method) {
        s.routing = RoutingParams{};
        s.routing.method = m;
      }
    }
    if (given("--n-group")) s.routing.n_group = small("--n-group", 1);
    if (given("--topk-group")) s.routing.topk_group = small("--topk-group", 1);
    if (given("--routed-scaling")) s.routing.routed_scaling_factor = real("--routed-scaling");
    if (given("--correction-bias")) s.routing.correction_bias = flags.at("--correction-bias");
    if (given("--renormalize")) s.routing.renormalize = flags.at("--renormalize");
    if (given("--router-weight-on"))
      s.routing.weight_placement = named<RouterWeightPlacement>(
          "--router-weight-on", router_weight_placement_from_string, "");

    if (given("--experts")) s.num_experts = count("--experts", 1);
    if (given("--top-k")) s.top_k = count("--top-k", 1);
    if (given("--hidden")) s.hidden = count("--hidden", 1);
    if (given("--intermediate")) s.intermediate = count("--intermediate", 1);
    if (given("--max-tokens"))
      s.max_tokens = count("--max-tokens", 1);
    else if (from_preset)
      s.max_tokens = std::max<int64_t>(tokens_hint, 1);
    if (given("--tp-size")) s.tp_size = small("--tp-size", 1);
    if (given("--tp-rank")) s.tp_rank = small("--tp-rank", 0);
    if (given("--ep-size")) s.ep_size = small("--ep-size", 1);
    if (given("--ep-rank")) s.ep_rank = small("--ep-rank", 0);
    s.validate_or_throw();
    return s;
  }
  // --ep-strategy chooses among expert-parallel strategies: given to a run that is not one rank
  // of an expert-parallel world (--ep-size N > 1 without --ep-rank), it would do nothing.
  void refuse_ep_strategy_outside_ep() const {
    if (ep_strategy != "auto")
      throw Error(ErrorCode::kInvalidArgument,
                  "--ep-strategy " + ep_strategy +
                      " applies to expert-parallel runs (--ep-size N > 1 without --ep-rank, "
                      "under torchrun or mpirun)");
  }
  // What names the layer in messages and bench rows: the spec file or the preset.
  std::string layer_name() const { return spec_file.empty() ? preset : spec_file; }
  LayerOptions options() const {
    LayerOptions o;
    o.backend = backend;
    o.tuning_file = tuning_file;
    return o;
  }

 private:
  float real(const std::string& name) const { return parse_real(name, value(name)); }
};

std::vector<int64_t> parse_tokens(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(parse_integer("--tokens", item, 1));
  if (out.empty())
    throw Error(ErrorCode::kInvalidArgument, "--tokens '" + list + "' names no token count");
  return out;
}

double checksum(const std::vector<float>& v, double* abs_sum) {
  double s = 0, a = 0;
  for (float x : v) {
    s += x;
    a += std::fabs(x);
  }
  *abs_sum = a;
  return s;
}

// A tuning file's problems (each fell back to the built-in pick) on stderr, one line each.
void print_tuning_problems(const Resolution& r) {
  for (const TuningProblem& p : r.tuning.problems)
    std::fprintf(stderr, "moekit: tuning file problem, built-in tactic used: %s\n",
                 p.text().c_str());
}

// ||got - want|| / ||want|| over every element (what --check prints).
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void print_degradation(const Resolution& r) {
  if (!r.degraded_from) return;
  const Degradation& d = *r.degraded_from;
  if (d.chosen.empty())
    std::cout << "cannot run '" << d.requested << "': [" << to_string(d.reason.stage) << "] "
              << d.reason.reason << "\n";
  else
    std::cout << "degraded from '" << d.requested << "' to '" << d.chosen << "': ["
              << to_string(d.reason.stage) << "] " << d.reason.reason << "\n";
}

int cmd_presets() {
  std::printf("%-18s %5s %4s %6s %6s  %-13s %-15s %-12s  %s\n", "name", "E", "k", "H", "I",
              "routing", "activation", "weights", "description");
  for (const Preset& p : list_presets()) {
    const MoeSpec& s = p.spec;
    std::printf("%-18s %5lld %4lld %6lld %6lld  %-13s %-15s %-12s  %s\n", p.name.c_str(),
                (long long)s.num_experts, (long long)s.top_k, (long long)s.hidden,
                (long long)s.intermediate, to_string(s.routing.method),
                to_string(s.activation.kind), to_string(s.weights.format), p.description.c_str());
  }
  return 0;
}

struct RunOpts {
  std::string tokens = "16";
  bool tokens_given = false;
  std::vector<std::string> weight_files;
  std::string family;
  std::string layer = "0";
  std::string input, output;
  bool check = false;
};

int cmd_run_ep(const LayerOpts& lo, const RunOpts& ro, const MoeSpec& spec, int64_t tokens) {
  if (!ro.input.empty() || !ro.weight_files.empty() || !ro.output.empty())
    throw Error(ErrorCode::kInvalidArgument,
                "--input, --weights and --output are not supported with --ep-size " +
                    std::to_string(spec.ep_size) +
                    " under a launcher yet (random weights and tokens)");
  if (tokens > spec.max_tokens)
    throw Error(ErrorCode::kInvalidArgument, "the batch of " + std::to_string(tokens) +
                                                 " tokens exceeds max_tokens " +
                                                 std::to_string(spec.max_tokens));
  const EpRunResult r =
      run_expert_parallel(spec, lo.options(), lo.ep_strategy, lo.seed, tokens, ro.check);
  double abs_sum = 0;
  const double sum = checksum(r.run.output, &abs_sum);
  std::printf(
      "rank %d of %d  ep strategy %s  tokens %lld  checksum sum=%.6e abs=%.6e  time %.3f ms\n",
      r.rank, r.world_size, r.strategy.c_str(), (long long)tokens, sum, abs_sum,
      r.run.milliseconds);
  std::printf(
      "rank %d  dispatch %.3f ms  experts %.3f ms (%lld rows)  combine %.3f ms  "
      "sent %lld bytes  received %lld bytes\n",
      r.rank, r.stats.dispatch_ms, r.stats.experts_ms, (long long)r.stats.rows_computed,
      r.stats.combine_ms, (long long)r.stats.bytes_sent, (long long)r.stats.bytes_received);
  if (ro.check) {
    const double rel = relative_error(r.run.output, r.reference);
    std::printf("rank %d check against the single-rank cpu.reference: relative error %.3e\n",
                r.rank, rel);
    if (!(rel < 1e-2))
      throw Error(ErrorCode::kInternal,
                  "output differs from the CPU reference: relative error " + std::to_string(rel));
  }
  return 0;
}

int cmd_run(const LayerOpts& lo, const RunOpts& ro) {
  int64_t tokens = parse_integer("--tokens", ro.tokens, 0);  // 0 tokens: a valid, empty batch
  const int layer_index = parse_int("--layer", ro.layer, 0);
  std::vector<NamedTensor> input_tensors;
  if (!ro.input.empty()) {
    input_tensors = read_tensors(ro.input);
    auto it = std::find_if(input_tensors.begin(), input_tensors.end(),
                           [](auto& t) { return t.name == "hidden"; });
    if (it == input_tensors.end() || it->shape.size() != 2)
      throw Error(ErrorCode::kBadFile, ro.input + ": needs a 2-D tensor 'hidden' [tokens, hidden]");
    if (ro.tokens_given && it->shape[0] != tokens)
      throw Error(ErrorCode::kInvalidArgument,
                  "--tokens " + std::to_string(tokens) + " differs from the " +
                      std::to_string(it->shape[0]) + " tokens of 'hidden' in " + ro.input +
                      "; give one of them");
    tokens = it->shape[0];
  }
  const MoeSpec spec = lo.spec(tokens);
  // --ep-size N without --ep-rank: one rank of an expert-parallel run under torchrun / mpirun.
  // A spec file's ep_size and ep_rank name one rank's partial output, as --ep-rank does.
  if (lo.given("--ep-size") && spec.ep_size > 1 && !lo.given("--ep-rank"))
    return cmd_run_ep(lo, ro, spec, tokens);
  lo.refuse_ep_strategy_outside_ep();
  if (tokens > spec.max_tokens)
    throw Error(ErrorCode::kInvalidArgument, "the batch of " + std::to_string(tokens) +
                                                 " tokens exceeds max_tokens " +
                                                 std::to_string(spec.max_tokens));
  // The resolver decides first: nothing is built for a layer that cannot run here.
  resolve_or_refuse(spec, lo.backend);
  HostInputs in;
  if (!ro.input.empty())
    in = inputs_from_tensors(spec, input_tensors, ro.input);
  else
    in = random_inputs(spec, tokens, lo.seed);

  check_host_bytes(weight_host_bytes(spec), "the weights of " + lo.layer_name());
  MoeWeights w;
  if (!ro.weight_files.empty()) {
    // The preset's own family unless --family names another (a spec file has none).
    if (ro.family.empty() && !lo.spec_file.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "--weights with --spec " + lo.spec_file + " needs --family to name the tensors");
    const std::string family = ro.family.empty() ? find_preset(lo.preset).family : ro.family;
    std::vector<std::string> files;
    for (const auto& path : ro.weight_files)
      for (auto& f : checkpoint_files(path)) files.push_back(std::move(f));
    w = load_layer_weights(files, find_model_family(family), layer_index, spec);
  } else {
    w = quant::make_random_weights(spec, lo.seed);
  }
  auto layer = MoeLayer::create(spec, w, lo.options());
  const Resolution& r = layer->resolution();
  std::cout << "implementation: " << r.chosen->id() << "\n";
  print_degradation(r);
  print_tuning_problems(r);
  RunResult res = run_layer(*layer, in);
  double abs_sum = 0;
  const double sum = checksum(res.output, &abs_sum);
  std::printf("tokens %lld  hidden %lld  checksum sum=%.6e abs=%.6e  time %.3f ms\n",
              (long long)tokens, (long long)spec.hidden, sum, abs_sum, res.milliseconds);
  if (ro.check && r.chosen->id() == "cpu.reference") {
    std::cout
        << "check: cpu.reference ran this layer itself; there is nothing to compare it against\n";
  } else if (ro.check) {
    LayerOptions ref_opts = lo.options();
    ref_opts.backend = "reference";
    auto ref_layer = MoeLayer::create(spec, w, ref_opts);
    const double rel = relative_error(res.output, run_layer(*ref_layer, in).output);
    std::printf("check against cpu.reference: relative error %.3e\n", rel);
    if (!(rel < 1e-2))
      throw Error(ErrorCode::kInternal,
                  "output differs from the CPU reference: relative error " + std::to_string(rel));
  }
  if (!ro.output.empty()) {
    write_tensors(ro.output, {output_tensor(spec, res.output, tokens)});
    std::cout << "wrote " << ro.output << "\n";
  }
  return 0;
}

int cmd_resolve(const LayerOpts& lo, bool json) {
  const MoeSpec spec = lo.spec(1);
  Resolution r = resolve(spec, Environment::detected(), lo.backend);
  // No engine is built here, so tactic names are checked only when a layer is.
  const std::string tuning = lo.tuning_path();
  if (r.ok() && !tuning.empty())
    r.tuning = read_tuning(tuning, r.environment_fingerprint, spec, r.chosen->id(), nullptr, 1);
  if (json) {
    std::cout << resolution_json_with_spec(spec, r) << "\n";
  } else {
    const std::string table = r.table();  // it already says what was not given, and why
    std::cout << table << (table.empty() || table.back() != '\n' ? "\n" : "");
  }
  return r.ok() ? 0 : 1;
}

// The layers named by --spec, or by each preset of a comma-separated --preset.
std::vector<std::pair<std::string, MoeSpec>> named_layers(const LayerOpts& lo, int64_t max_t) {
  std::vector<std::pair<std::string, MoeSpec>> layers;
  if (!lo.spec_file.empty()) {
    layers.emplace_back(lo.spec_file, lo.spec(max_t));
  } else {
    std::stringstream ss(lo.preset);
    std::string p;
    while (std::getline(ss, p, ',')) {
      LayerOpts one = lo;
      one.preset = p;
      layers.emplace_back(p, one.spec(max_t));
    }
  }
  return layers;
}

// bench and tune time a device implementation: the resolver's choice for the request, refused
// with its reason when there is none or when it is a host implementation.
void refuse_unless_device(const MoeSpec& spec, const std::string& name, const std::string& backend,
                          const char* command) {
  const Resolution r = resolve_or_refuse(spec, backend);
  if (r.chosen->device() == Device::kCuda) return;
  std::string why = r.chosen->id() + " runs on the host";
  if (backend == "auto") {
    // Why no device implementation took it: ask the resolver for the first device family.
    for (const Implementation* impl : all_implementations()) {
      if (impl->device() != Device::kCuda) continue;
      const Resolution d = resolve(spec, Environment::detected(), impl->family());
      if (d.degraded_from) why = d.degraded_from->reason.reason;
      break;
    }
  }
  throw Error(ErrorCode::kUnsupported,
              std::string(command) + " times a CUDA implementation, but none can run " + name +
                  " here (backend '" + backend + "' gives " + r.chosen->id() + "): " + why);
}

// `moekit bench --ep-size N` under torchrun / mpirun: each rank prints its own rows.
constexpr int kEpBenchReps = 20;
int cmd_bench_ep(const LayerOpts& lo, const std::vector<std::pair<std::string, MoeSpec>>& layers,
                 const std::vector<int64_t>& tokens, const std::string& json_path) {
  if (!json_path.empty())
    throw Error(ErrorCode::kInvalidArgument, "--json is not supported with --ep-size yet");
  bool header = false;
  for (const auto& [name, spec] : layers) {
    const std::vector<EpBenchRow> rows =
        bench_expert_parallel(spec, lo.options(), lo.ep_strategy, lo.seed, tokens, kEpBenchReps);
    if (!header && !rows.empty()) {
      std::printf(
          "# moekit bench --ep-size %d, rank %d of %d: medians of %d forwards after one warm-up. "
          "dispatch: routing, packing, the all-to-alls (all_gather_reduce_scatter: all-gathers) "
          "of rows, ids and weights (all_to_all: and of the counts, with its one host wait); "
          "experts: the local layer; combine: the results back and their sum (the fp32 "
          "reduce-scatter); bytes: this rank's across the links; link GB/s: bytes sent + "
          "received over dispatch + combine time\n",
          spec.ep_size, rows.front().rank, rows.front().world_size, kEpBenchReps);
      std::printf("%-5s %-16s %6s %-24s %11s %10s %10s %9s %9s %9s %9s\n", "rank", "preset", "T",
                  "strategy", "dispatch_us", "experts_us", "combine_us", "total_us", "sent_MB",
                  "recv_MB", "link_GB/s");
      header = true;
    }
    for (const EpBenchRow& r : rows)
      std::printf("%-5d %-16s %6lld %-24s %11.1f %10.1f %10.1f %9.1f %9.3f %9.3f %9.1f\n", r.rank,
                  name.c_str(), static_cast<long long>(r.tokens), r.strategy.c_str(), r.dispatch_us,
                  r.experts_us, r.combine_us, r.total_us, r.bytes_sent / 1e6,
                  r.bytes_received / 1e6, r.link_bytes_per_s() / 1e9);
  }
  return 0;
}

// "fc1 <tactic>, fc2 <tactic>": what `chosen` runs at `tokens` tokens ("built-in": no entry).
std::string tuned_at(const TacticChoices& chosen, int64_t tokens) {
  std::string out;
  for (const Gemm g : {Gemm::kFc1, Gemm::kFc2}) {
    const std::string* t = chosen.find(g, tokens);
    out += std::string(out.empty() ? "" : ", ") + to_string(g) + " " + (t ? *t : "built-in");
  }
  return out;
}

// What each GEMM runs at `tokens` tokens: the tuning file's tactic where `chosen` has one, else
// the engine's own pick ("-" where the engine has no GEMM tactics, e.g. the CPU reference).
std::pair<std::string, std::string> tactics_at(const MoeLayer& layer, const TacticChoices& chosen,
                                               int64_t tokens) {
  std::string out[2];
  for (const Gemm g : {Gemm::kFc1, Gemm::kFc2}) {
    const std::string* t = chosen.find(g, tokens);
    std::string name = t ? *t : layer.builtin_tactic(g, tokens);
    out[g == Gemm::kFc1 ? 0 : 1] = name.empty() ? "-" : name;
  }
  return {out[0], out[1]};
}

int cmd_bench(LayerOpts lo, const std::string& tokens_list, const std::string& flush_text,
              const std::string& json_path, const std::string& trace_text,
              const std::string& profile_text, bool compare_tuning) {
  const int trace_replays = parse_int("--trace", trace_text, 0);
  // The routing the timed batches follow, as `moekit tune` draws it: a tuning file measured
  // under skew is judged under the same skew.
  const tune::RoutingProfile profile = tune::parse_routing_profile(profile_text);
  const std::vector<int64_t> tokens = parse_tokens(tokens_list);
  const L2Flush flush = parse_l2_flush(flush_text);
  if (compare_tuning && lo.tuning_path().empty())
    throw Error(ErrorCode::kInvalidArgument,
                std::string("--compare-tuning needs a tuning file (--tuning-file or $") +
                    kTuningFileEnv + ")");
  if (compare_tuning && (trace_replays > 0 || !json_path.empty()))
    throw Error(ErrorCode::kInvalidArgument, "--compare-tuning takes neither --trace nor --json");
  // The workspace: --max-tokens where given (as a server sizes it for its largest batch; the
  // decode GEMVs' grids follow it), else the largest count asked for.
  const int64_t largest = *std::max_element(tokens.begin(), tokens.end());
  const int64_t max_t = lo.given("--max-tokens") ? lo.count("--max-tokens", 1) : largest;
  if (max_t < largest)
    throw Error(ErrorCode::kInvalidArgument, "--max-tokens " + std::to_string(max_t) +
                                                 " is below the token count " +
                                                 std::to_string(largest));
  // bench draws bf16 weights and inputs unless told otherwise (a spec file says its own).
  lo.default_weights_format = "bf16";
  lo.default_act_dtype = "bf16";
  // Every layer is resolved before anything touches the GPU or allocates weights.
  const std::vector<std::pair<std::string, MoeSpec>> layers = named_layers(lo, max_t);
  // --ep-size N without --ep-rank: one rank of an expert-parallel benchmark under a launcher.
  if (lo.given("--ep-size") && layers.front().second.ep_size > 1 && !lo.given("--ep-rank"))
    return cmd_bench_ep(lo, layers, tokens, json_path);
  lo.refuse_ep_strategy_outside_ep();
  for (const auto& [name, spec] : layers) {
    if (spec.max_tokens < largest)
      throw Error(ErrorCode::kInvalidArgument, "max_tokens " + std::to_string(spec.max_tokens) +
                                                   " of " + name + " is below the token count " +
                                                   std::to_string(largest));
    refuse_unless_device(spec, name, lo.backend, "bench");
    check_host_bytes(weight_host_bytes(spec), "the random weights of " + name);
  }
  const int64_t workspace = layers.front().second.max_tokens;  // max_t, or the spec file's
  const Floors floors = measure_floors(flush);
  std::printf(
      "# moekit bench on %s; floors: read stream %.2f TB/s (2 GiB, 16-byte loads), copy %.2f TB/s "
      "(read+write), BF16 GEMM %.0f TFLOP/s (cuBLAS 8192^3), FP8 GEMM %.0f TFLOP/s (cuBLASLt "
      "e4m3 8192^3, fast accumulation), graph launch %.1f us (an empty kernel's replay, timed as "
      "the rows)\n",
      floors.gpu_name.c_str(), floors.read_bytes_per_s / 1e12, floors.copy_bytes_per_s / 1e12,
      floors.gemm_flops_per_s / 1e12, floors.fp8_gemm_flops_per_s / 1e12, floors.launch_us);
  std::printf(
      "# median of graph replays, L2 flush before each: %s; routing included; %s router "
      "logits; workspace for %lld tokens\n",
      flush == L2Flush::kRead    ? "256 MiB read (L2 left clean)"
      : flush == L2Flush::kWrite ? "256 MiB written (L2 left dirty)"
                                 : "none",
      profile.zipf_s == 0.0 ? "random" : (profile.text() + "-skewed").c_str(),
      static_cast<long long>(workspace));
  std::printf(
      "# hit: experts the batch routes to; floor_us: the larger of the bytes (the hit experts' "
      "weights and scales, the activations in and out, the logits) over the read stream and the "
      "flops over the GEMM rate of the layer's format\n");
  for (const auto& [name, spec] : layers) {
    const char* gemm_name = nullptr;
    gemm_floor_rate(floors, spec.weights.format, &gemm_name);
    std::printf(
        "# %s: %s weights (%.2f MB per expert, scales included), %s activations, %s routing, "
        "%lld experts, top-%lld; FLOP floor: %s GEMM rate\n",
        name.c_str(), to_string(spec.weights.format), local_expert_bytes(spec) / 1e6,
        to_string(spec.act_dtype), to_string(spec.routing.method),
        static_cast<long long>(spec.num_experts), static_cast<long long>(spec.top_k), gemm_name);
  }
  if (compare_tuning)
    std::printf(
        "# --compare-tuning: each row's forward with the engine's built-in picks and with the "
        "tuning file's, captured apart and replayed in turn (medians of the same rounds)\n"
        "%-16s %6s %10s %10s %8s  %s\n",
        "preset", "T", "builtin_us", "tuned_us", "change", "the file's tactics at T");
  else
    std::printf("%-16s %6s %10s %9s %9s %6s %8s %6s %8s %6s %10s  %s  %s\n", "preset", "T",
                "median_us", "p10", "p90", "hit", "GB/s", "%bw", "TFLOP/s", "%gemm", "floor_us",
                "implementation", "fc1 / fc2 tactic");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [name, spec] : layers) {
    MoeWeights w = bench_random_weights(spec, lo.seed);
    auto layer = MoeLayer::create(spec, w, lo.options());
    print_tuning_problems(layer->resolution());
    std::vector<float> bias = w.routing_bias;
    if (bias.empty()) bias.assign(spec.num_experts, 0.0f);
    w = MoeWeights{};  // the engine holds its own copy
    const LocalProblem lp = derive_local(spec);
    const double es = dtype_size(spec.act_dtype);
    const double expert_bytes = static_cast<double>(local_expert_bytes(spec));
    const char* gemm_name = nullptr;
    const double gemm_rate = gemm_floor_rate(floors, spec.weights.format, &gemm_name);
    const TacticChoices chosen{layer->resolution().tuning.chosen};
    for (int64_t t : tokens) {
      HostInputs in = random_inputs(spec, t, lo.seed + t);
      apply_routing_profile(in, spec, profile, lo.seed + t);
      if (compare_tuning) {
        const std::vector<double> us =
            time_choices_on_device(*layer, in, flush, {TacticChoices{}, chosen}, kBenchBudgetUs);
        layer->set_tactics(chosen);  // as the layer was built
        std::printf("%-16s %6lld %10.1f %10.1f %+7.2f%%  %s\n", name.c_str(), (long long)t, us[0],
                    us[1], 100.0 * (us[1] / us[0] - 1.0), tuned_at(chosen, t).c_str());
        std::fflush(stdout);
        continue;
      }
      BenchRow row;
      row.preset = name;
      row.tokens = t;
      // Experts actually hit (the weights that must be read), from the same routing on the host.
      std::vector<int32_t> ids(t * spec.top_k);
      std::vector<float> wts(t * spec.top_k);
      throw_if_error(routing::route_host(
          spec.routing, t, spec.num_experts, spec.top_k, in.router_logits.data(),
          spec.routing.correction_bias ? bias.data() : nullptr, ids.data(), wts.data()));
      std::set<int32_t> hit(ids.begin(), ids.end());
      row.experts_hit = static_cast<int64_t>(hit.size());
      row.bytes =
          row.experts_hit * expert_bytes + 2.0 * t * spec.hidden * es + 4.0 * t * spec.num_experts;
      row.flops = 2.0 * t * spec.top_k * (lp.fc1_rows * lp.hidden + lp.hidden * lp.intermediate);
      bench_layer_on_device(*layer, in, flush, row, trace_replays);
      const double s = row.median_us * 1e-6;
      const double floor_us =
          std::max(row.bytes / floors.read_bytes_per_s, row.flops / gemm_rate) * 1e6;
      const auto [fc1_tactic, fc2_tactic] = tactics_at(*layer, chosen, t);
      std::printf(
          "%-16s %6lld %10.1f %9.1f %9.1f %6lld %8.0f %5.0f%% %8.1f %5.0f%% %10.1f  %s  %s / %s\n",
          name.c_str(), (long long)t, row.median_us, row.p10_us, row.p90_us,
          (long long)row.experts_hit, row.bytes / s / 1e9,
          100.0 * row.bytes / s / floors.read_bytes_per_s, row.flops / s / 1e12,
          100.0 * row.flops / s / gemm_rate, floor_us, layer->resolution().chosen->id().c_str(),
          fc1_tactic.c_str(), fc2_tactic.c_str());
      if (row.trace.replays > 0) print_trace(row.trace);
      std::fflush(stdout);
      nlohmann::json traced = nlohmann::json::array();
      for (const TracedKernel& k : row.trace.kernels)
        traced.push_back(
            {{"kernel", k.name}, {"median_us", k.median_us}, {"median_gap_us", k.median_gap_us}});
      rows.push_back({{"preset", name},
                      {"tokens", t},
                      {"median_us", row.median_us},
                      {"p10_us", row.p10_us},
                      {"p90_us", row.p90_us},
                      {"reps", row.reps},
                      {"experts_hit", row.experts_hit},
                      {"weights_format", to_string(spec.weights.format)},
                      {"routing", to_string(spec.routing.method)},
                      {"expert_bytes", expert_bytes},
                      {"bytes", row.bytes},
                      {"flops", row.flops},
                      {"gemm_floor", gemm_name},
                      {"floor_us", floor_us},
                      {"implementation", layer->resolution().chosen->id()},
                      {"fc1_tactic", fc1_tactic},
                      {"fc2_tactic", fc2_tactic},
                      {"l2_flush", to_string(flush)},
                      {"routing_profile", profile.text()},
                      {"max_tokens", spec.max_tokens},
                      {"trace", traced}});
    }
  }
  if (!json_path.empty()) {
    nlohmann::json doc = {{"gpu", floors.gpu_name},
                          {"version", moekit::version()},
                          {"environment", Environment::detected().fingerprint()},
                          {"floors",
                           {{"copy_bytes_per_s", floors.copy_bytes_per_s},
                            {"read_bytes_per_s", floors.read_bytes_per_s},
                            {"gemm_flops_per_s", floors.gemm_flops_per_s},
                            {"fp8_gemm_flops_per_s", floors.fp8_gemm_flops_per_s},
                            {"graph_launch_us", floors.launch_us}}},
                          {"rows", rows}};
    std::ofstream f(json_path);
    if (!f) throw Error(ErrorCode::kIo, "cannot write " + json_path);
    f << doc.dump(1) << "\n";
  }
  return 0;
}

// What `moekit tune` shows on stderr: a bar redrawn in place on a terminal, else one line per
// bucket; each with what is being measured and the time left at the pace so far.
class TuneProgress {
 public:
  explicit TuneProgress(int total)
      : total_(total),
        tty_(isatty(fileno(stderr)) != 0),
        start_(std::chrono::steady_clock::now()) {}
  void begin(const std::string& what) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::string left = "estimating";
    if (done_ > 0) {
      const long s = std::lround(elapsed / done_ * (total_ - done_));
      left = "about " + (s >= 60 ? std::to_string(s / 60) + "m" : std::string()) +
             std::to_string(s % 60) + "s left";
    }
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = total_ > 0 ? kWidth * done_ / total_ : kWidth;
      std::fprintf(stderr, "\r\033[K[%s%s] %d/%d %s, %s", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), done_ + 1, total_, what.c_str(),
                   left.c_str());
    } else {
      std::fprintf(stderr, "tune %d/%d: %s (%s)\n", done_ + 1, total_, what.c_str(), left.c_str());
    }
    std::fflush(stderr);
    ++done_;
  }
  ~TuneProgress() {
    if (tty_ && done_ > 0) std::fprintf(stderr, "\n");
  }

 private:
  int total_, done_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// The device implementations `moekit tune` measures for `spec`: with "auto" every eligible one
// (each would run the layer on some request), else the request's choice.
std::vector<std::string> implementations_to_tune(const MoeSpec& spec, const std::string& name,
                                                 const std::string& backend) {
  refuse_unless_device(spec, name, backend, "tune");  // says why, where none runs it
  const Resolution r = resolve(spec, Environment::detected(), backend);
  if (backend != "auto") return {r.chosen->id()};
  std::vector<std::string> ids;
  for (const CandidateReport& c : r.candidates) {
    const Implementation* impl = find_implementation(c.id);
    if (c.eligible && impl != nullptr && impl->device() == Device::kCuda) ids.push_back(c.id);
  }
  return ids;
}

struct TuneOpts {
  std::string out;
  std::string routing_profile = "uniform";
  std::string dp_factor = "1";
  std::string flush = "read";
  std::string budget_ms = "200";
};

int cmd_tune(LayerOpts lo, const TuneOpts& to) {
  const tune::RoutingProfile profile = tune::parse_routing_profile(to.routing_profile);
  const L2Flush flush = parse_l2_flush(to.flush);
  const int64_t dp_factor = parse_integer("--dp-factor", to.dp_factor, 1);
  const double budget_us = static_cast<double>(parse_integer("--budget-ms", to.budget_ms, 1)) * 1e3;
  // The layers tuned run on their engines' built-in picks: no tuning file of the environment.
  ::unsetenv(kTuningFileEnv);
  lo.default_weights_format = "bf16";  // as bench: a preset in bf16 unless told otherwise
  lo.default_act_dtype = "bf16";
  const int64_t max_t = lo.given("--max-tokens") ? lo.count("--max-tokens", 1) : 4096;
  struct Plan {
    std::string name;
    MoeSpec spec;
    std::vector<std::string> implementations;
    std::vector<int64_t> buckets;
  };
  // Everything is planned, and refused where it must be, before the GPU is touched.
  std::vector<Plan> plans;
  int total = 0;
  for (const auto& [name, spec] : named_layers(lo, max_t)) {
    Plan p{name, spec, implementations_to_tune(spec, name, lo.backend),
           tuning_buckets(spec.max_tokens, dp_factor)};
    check_host_bytes(weight_host_bytes(spec), "the random weights of " + name);
    check_host_bytes(
        forward_host_bytes(spec, p.buckets.back()),
        "the random inputs of " + name + " at " + std::to_string(p.buckets.back()) + " tokens");
    total += static_cast<int>(p.implementations.size() * 2 * p.buckets.size());
    plans.push_back(std::move(p));
  }
  TuningCache cache;
  cache.fingerprint = Environment::detected().fingerprint();
  cache.moekit_version = moekit::version();
  cache.moekit_commit = moekit::commit();
  cache.routing = profile.text();
  TuneProgress progress(total);
  std::vector<std::pair<std::string, TuningKey>> measured;  // layer name, key: the summary
  std::vector<std::string> fused;  // "layer implementation gemm bucket": nothing to choose
  for (Plan& p : plans) {
    MoeSpec spec = p.spec;
    // The workspace holds the largest bucket (above max_tokens where dp_factor > 1).
    spec.max_tokens = p.buckets.back();
    const MoeWeights weights = bench_random_weights(spec, lo.seed);
    for (const std::string& impl : p.implementations) {
      LayerOptions options = lo.options();
      options.backend = impl;
      options.tuning_file.clear();
      auto layer = MoeLayer::create(spec, weights, options);
      for (const Gemm gemm : {Gemm::kFc1, Gemm::kFc2})
        for (const int64_t bucket : p.buckets) {
          progress.begin(p.name + " " + impl + " " + to_string(gemm) + " at " +
                         std::to_string(bucket) + " tokens");
          // A fused path keeps its own kernels there: every tactic would time the same forward.
          if (!layer->tactics_apply(gemm, bucket)) {
            fused.push_back(p.name + " " + impl + " " + to_string(gemm) + " " +
                            std::to_string(bucket));
            continue;
          }
          HostInputs in = random_inputs(spec, bucket, lo.seed + bucket);
          apply_routing_profile(in, spec, profile, lo.seed + bucket);
          const std::vector<TacticTime> times =
              time_tactics(*layer, gemm, bucket, in, flush, budget_us);
          if (times.empty()) continue;  // an engine without named tactics
          TuningEntry e;
          // Keyed by the layer's own spec: its max_tokens is not part of the key.
          e.key = TuningKey::of(p.spec, impl, gemm, bucket);
          e.tactic = times[0].tactic;
          e.time_us = times[0].median_us;
          if (times.size() > 1) {
            e.runner_up = times[1].tactic;
            e.runner_up_us = times[1].median_us;
          }
          cache.put(e);
          measured.emplace_back(p.name, e.key);
        }
    }
    // Each layer's entries are kept as it finishes: a tune cut short keeps what it measured.
    cache.save(to.out);
  }
  std::printf("%-16s %-32s %4s %7s  %-44s %10s  %s\n", "layer", "implementation", "gemm", "bucket",
              "tactic", "time_us", "runner-up");
  for (const auto& [name, key] : measured) {
    const TuningEntry& e = *cache.lookup(key);
    std::printf("%-16s %-32s %4s %7lld  %-44s %10.1f  %s\n", name.c_str(),
                e.key.implementation.c_str(), to_string(e.key.gemm),
                static_cast<long long>(e.key.bucket), e.tactic.c_str(), e.time_us,
                e.runner_up.c_str());
  }
  if (!fused.empty()) {
    std::printf("fused paths (their own kernels at these buckets; nothing to choose):\n");
    for (const std::string& f : fused) std::printf("  %s\n", f.c_str());
  }
  std::cout << "wrote " << to.out << " (" << cache.entries.size() << " entries)\n";
  return 0;
}

}  // namespace
}  // namespace moekit::cli

int main(int argc, char** argv) {
  using namespace moekit::cli;
  CLI::App app{"moekit: the Mixture-of-Experts layer of LLM inference, on NVIDIA GPUs and the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moekit ") + moekit::version());
  app.set_help_all_flag("--help-all", "help of every subcommand");

  auto* presets = app.add_subcommand("presets", "list the built-in layer shapes of real models");

  LayerOpts run_lo;
  RunOpts ro;
  auto* run = app.add_subcommand("run", "one forward of a preset or of a layer loaded from files");
  run_lo.add_to(run);
  auto* run_tokens =
      run->add_option("--tokens", ro.tokens, "tokens in the batch (0: an empty batch)")
          ->capture_default_str();
  run->add_option(
      "--weights", ro.weight_files,
      "safetensors files, folders or *.safetensors.index.json holding the layer's experts");
  run->add_option("--family", ro.family,
                  "model family naming the tensors (default: the preset's; needed with --spec): "
                  "mixtral, qwen3_moe, deepseek_v3, gpt_oss, llama4, moekit");
  run->add_option("--layer", ro.layer, "layer index inside the weight files")
      ->capture_default_str();
  run->add_option("--input", ro.input,
                  "safetensors file with 'hidden' [T,H] and 'router_logits' [T,E] (or "
                  "'topk_ids','topk_weights'); its T is the token count");
  run->add_option("--output", ro.output,
                  "write the output as tensor 'output' [T,H] to this safetensors file");
  run->add_flag("--check", ro.check,
                "also run the CPU reference and fail if the relative error is 1e-2 or more");

  LayerOpts res_lo;
  bool json = false;
  auto* res = app.add_subcommand(
      "resolve", "which implementation would run this layer here, and why not the others");
  res_lo.add_to(res);
  res->add_flag("--json", json, "print {\"spec\": the spec, then the report} as JSON");

  LayerOpts bench_lo;
  bench_lo.preset = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b";
  std::string tokens = "1,8,64,512,4096,16384", json_path, flush = "read", trace_replays = "0",
              bench_profile = "uniform";
  bool compare_tuning = false;
  auto* bench =
      app.add_subcommand("bench", "time full forwards (CUDA graph replays) of presets on the GPU");
  bench_lo.add_to(bench);
  bench->add_option("--tokens", tokens, "comma-separated token counts")->capture_default_str();
  bench->add_option("--json", json_path, "also write the rows to this JSON file");
  bench
      ->add_option("--flush", flush,
                   "how L2 is emptied before each replay: read (256 MiB read, L2 left clean), "
                   "write (256 MiB written, L2 left dirty), none")
      ->capture_default_str();
  bench
      ->add_option("--routing-profile", bench_profile,
                   "how the timed batches route, as tune: uniform (random logits), zipf or "
                   "zipf:<s>")
      ->capture_default_str();
  bench->add_flag("--compare-tuning", compare_tuning,
                  "time each row with the engine's built-in tactics and with the tuning file's, "
                  "the two forwards replayed in turn, and print both and the change");
  bench->add_option("--trace", trace_replays,
                    "then replay each forward this many more times with CUPTI recording every "
                    "kernel, and print each kernel's median duration and gap from the one before");

  LayerOpts tune_lo;
  tune_lo.preset = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b";
  TuneOpts tune_opts;
  auto* tune = app.add_subcommand(
      "tune",
      "measure the GEMM tactics of presets at every token bucket on the GPU and write a "
      "tuning file");
  tune_lo.add_to(tune);
  tune->add_option("--out", tune_opts.out, "the tuning file to write (JSON)")->required();
  tune->add_option("--routing-profile", tune_opts.routing_profile,
                   "how the timed batches route: uniform, zipf (s = 1) or zipf:<s> (expert e "
                   "drawn with probability ~ 1/(e+1)^s)")
      ->capture_default_str();
  tune->add_option("--dp-factor", tune_opts.dp_factor,
                   "data-parallel ranks sending this rank their tokens: buckets reach "
                   "max_tokens x this")
      ->capture_default_str();
  tune->add_option("--flush", tune_opts.flush, "L2 flush before each replay, as bench")
      ->capture_default_str();
  tune->add_option("--budget-ms", tune_opts.budget_ms,
                   "replays of each tactic go on past 30 until they add up to this")
      ->capture_default_str();

  run_lo.add_tuning_file_to(run);
  res_lo.add_tuning_file_to(res);
  bench_lo.add_tuning_file_to(bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the one-line reason
    return code == 0 ? 0 : 2;
  }
  try {
    if (*presets) return cmd_presets();
    ro.tokens_given = run_tokens->count() > 0;
    if (*run) return cmd_run(run_lo, ro);
    if (*res) return cmd_resolve(res_lo, json);
    if (*bench)
      return cmd_bench(bench_lo, tokens, flush, json_path, trace_replays, bench_profile,
                       compare_tuning);
    if (*tune) return cmd_tune(tune_lo, tune_opts);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
