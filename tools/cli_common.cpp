#include "cli_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "common/checked.hpp"
#include "common/numeric.hpp"
#include "moekit/environment.hpp"
#include "quant/quant.hpp"
#include "moekit/status.hpp"

namespace moekit::cli {
namespace {

void store(DType t, float x, uint8_t* p) {
  uint16_t h;
  switch (t) {
    case DType::kBFloat16:
      h = numeric::float_to_bf16(x);
      std::memcpy(p, &h, 2);
      break;
    case DType::kFloat16:
      h = numeric::float_to_fp16(x);
      std::memcpy(p, &h, 2);
      break;
    default:
      std::memcpy(p, &x, 4);
      break;
  }
}

float load(DType t, const uint8_t* p) {
  uint16_t h;
  float f;
  switch (t) {
    case DType::kBFloat16:
      std::memcpy(&h, p, 2);
      return numeric::bf16_to_float(h);
    case DType::kFloat16:
      std::memcpy(&h, p, 2);
      return numeric::fp16_to_float(h);
    default:
      std::memcpy(&f, p, 4);
      return f;
  }
}

// splitmix64: portable, so the same seed gives the same inputs on every machine.
uint64_t mix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
float uniform_pm1(uint64_t& s) {
  return static_cast<float>(mix(s) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

}  // namespace

int64_t parse_integer(const std::string& flag, const std::string& text, int64_t min) {
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument, flag + " '" + text + "' " + why);
  };
  if (text.empty()) bad("is empty, not an integer");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0') {
    // 1e6 and the like: exact integers only.
    errno = 0;
    const double d = std::strtod(text.c_str(), &end);
    if (*end != '\0' || !std::isfinite(d) || d != std::floor(d)) bad("is not an integer");
    if (std::fabs(d) >= 9.2e18) bad("does not fit a 64-bit integer");
    v = static_cast<long long>(d);
  } else if (errno == ERANGE) {
    bad("does not fit a 64-bit integer");
  }
  if (v < min)
    bad(min == 0 ? "is negative; it must be 0 or more" : "must be at least " + std::to_string(min));
  return v;
}

int parse_int(const std::string& flag, const std::string& text, int min) {
  const int64_t v = parse_integer(flag, text, min);
  if (v > std::numeric_limits<int>::max())
    throw Error(ErrorCode::kInvalidArgument, flag + " '" + text + "' is too large (at most " +
                                                 std::to_string(std::numeric_limits<int>::max()) +
                                                 ")");
  return static_cast<int>(v);
}

float parse_real(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw Error(ErrorCode::kInvalidArgument, flag + " '" + text + "' is not a finite 32-bit float");
  return v;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::kIo, "cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void check_host_bytes(int64_t bytes, const std::string& what) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: let the allocation decide
  const int64_t memory = static_cast<int64_t>(pages) * page;
  if (bytes > memory)
    throw Error(ErrorCode::kInvalidArgument,
                what + " need " + std::to_string(bytes) +
                    " bytes of host memory, more than this machine's " + std::to_string(memory));
}

int64_t forward_host_bytes(const MoeSpec& spec, int64_t tokens) {
  const int64_t es = static_cast<int64_t>(dtype_size(spec.act_dtype));
  // hidden and output in the act dtype, the output again as fp32, logits or ids and weights.
  const int64_t per_token =
      spec.hidden * (2 * es + 4) + 4 * std::max(spec.num_experts, 2 * spec.top_k);
  return product_or_throw({tokens, per_token},
                          "the inputs and output of " + std::to_string(tokens) + " tokens");
}

int64_t weight_host_bytes(const MoeSpec& spec) {
  const LocalProblem lp = derive_local(spec);
  // The experts are drawn unsharded along the intermediate, then sliced.
  return lp.num_experts * (expert_matrix_bytes(spec.weights, spec.fc1_rows(), spec.hidden) +
                           expert_matrix_bytes(spec.weights, spec.hidden, spec.intermediate));
}

int64_t local_expert_bytes(const MoeSpec& spec) {
  const LocalProblem lp = derive_local(spec);
  return expert_matrix_bytes(spec.weights, lp.fc1_rows, lp.hidden) +
         expert_matrix_bytes(spec.weights, lp.hidden, lp.intermediate);
}

Resolution resolve_or_refuse(const MoeSpec& spec, const std::string& backend) {
  Resolution r = resolve(spec, Environment::detected(), backend);
  if (r.ok()) return r;
  std::string why;
  if (r.degraded_from) {
    why = r.degraded_from->reason.reason;
  } else {
    for (const CandidateReport& c : r.candidates)
      if (c.rejection) {
        why = c.rejection->reason;
        break;
      }
  }
  throw Error(ErrorCode::kUnsupported,
              "no implementation can run this layer for backend '" + backend + "': " + why);
}

HostInputs random_inputs(const MoeSpec& spec, int64_t tokens, uint64_t seed) {
  HostInputs in;
  in.tokens = tokens;
  const std::size_t es = dtype_size(spec.act_dtype);
  const int64_t n_hidden =
      product_or_throw({tokens, spec.hidden}, "the random hidden [tokens, hidden]");
  check_host_bytes(forward_host_bytes(spec, tokens), "the random inputs and output");
  in.hidden.resize(n_hidden * es);
  uint64_t s = seed * 7919 + 17;
  for (int64_t i = 0; i < n_hidden; ++i)
    store(spec.act_dtype, uniform_pm1(s) * 1.7f, &in.hidden[i * es]);
  if (spec.routing.method == RoutingMethod::kExternal) {
    // Distinct random experts per token, weights summing to 1.
    const int64_t n_ids =
        product_or_throw({tokens, spec.top_k}, "the random topk_ids [tokens, top_k]");
    in.topk_ids.resize(n_ids);
    in.topk_weights.resize(n_ids);
    std::vector<int32_t> perm(spec.num_experts);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < spec.num_experts; ++e) perm[e] = static_cast<int32_t>(e);
      float sum = 0;
      for (int64_t j = 0; j < spec.top_k; ++j) {
        std::swap(perm[j], perm[j + mix(s) % (spec.num_experts - j)]);
        in.topk_ids[t * spec.top_k + j] = perm[j];
        sum += in.topk_weights[t * spec.top_k + j] = 0.1f + std::fabs(uniform_pm1(s));
      }
      for (int64_t j = 0; j < spec.top_k; ++j) in.topk_weights[t * spec.top_k + j] /= sum;
    }
  } else {
    in.router_logits.resize(
        product_or_throw({tokens, spec.num_experts}, "the random router_logits [tokens, experts]"));
    for (auto& v : in.router_logits) v = uniform_pm1(s) * 3.0f;
  }
  return in;
}

HostInputs inputs_from_tensors(const MoeSpec& spec, const std::vector<NamedTensor>& tensors,
                               const std::string& file) {
  auto find = [&](const char* name) -> const NamedTensor* {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  };
  auto need = [&](const char* name, std::vector<int64_t> shape) -> const NamedTensor& {
    const NamedTensor* t = find(name);
    if (!t) throw Error(ErrorCode::kBadFile, file + ": no tensor '" + name + "'");
    if (t->shape != shape) {
      std::string want, got;
      for (auto d : shape) want += (want.empty() ? "" : ",") + std::to_string(d);
      for (auto d : t->shape) got += (got.empty() ? "" : ",") + std::to_string(d);
      throw Error(ErrorCode::kBadFile, file + ": tensor '" + name + "' has shape [" + got +
                                           "], expected [" + want + "]");
    }
    return *t;
  };
  const NamedTensor* h = find("hidden");
  if (!h || h->shape.size() != 2)
    throw Error(ErrorCode::kBadFile, file + ": needs a 2-D tensor 'hidden' [tokens, hidden]");
  HostInputs in;
  in.tokens = h->shape[0];
  const std::vector<float> hidden =
      named_tensor_to_floats(need("hidden", {in.tokens, spec.hidden}));
  const std::size_t es = dtype_size(spec.act_dtype);
  in.hidden.resize(hidden.size() * es);
  for (std::size_t i = 0; i < hidden.size(); ++i)
    store(spec.act_dtype, hidden[i], &in.hidden[i * es]);
  if (spec.routing.method == RoutingMethod::kExternal) {
    const NamedTensor& ids = need("topk_ids", {in.tokens, spec.top_k});
    if (ids.dtype != DType::kInt32)
      throw Error(ErrorCode::kBadFile, file + ": tensor 'topk_ids' must be int32");
    in.topk_ids.resize(ids.numel());
    std::memcpy(in.topk_ids.data(), ids.bytes.data(), ids.bytes.size());
    in.topk_weights = named_tensor_to_floats(need("topk_weights", {in.tokens, spec.top_k}));
  } else {
    in.router_logits = named_tensor_to_floats(need("router_logits", {in.tokens, spec.num_experts}));
  }
  return in;
}

NamedTensor output_tensor(const MoeSpec& spec, const std::vector<float>& output, int64_t tokens) {
  return named_tensor_from_floats("output", spec.act_dtype, {tokens, spec.hidden}, output.data());
}

MoeWeights bench_random_weights(const MoeSpec& spec, uint64_t seed) {
  const WeightFormat f = spec.weights.format;
  if (f != WeightFormat::kBF16 && f != WeightFormat::kFP16)
    return quant::make_random_weights(spec, seed);
  const LocalProblem lp = derive_local(spec);
  const DType t = f == WeightFormat::kBF16 ? DType::kBFloat16 : DType::kFloat16;
  auto make = [&](int64_t rows, int64_t cols, uint64_t salt) {
    QuantizedTensor q;
    q.format = f;
    q.experts = lp.num_experts;
    q.rows = rows;
    q.cols = cols;
    const int64_t n =
        product_or_throw({q.experts, rows, cols}, "the random weights [experts, rows, cols]");
    q.values.resize(static_cast<std::size_t>(n) * 2);
    const float amp = std::sqrt(3.0f / static_cast<float>(cols));  // variance 1/fan_in
    const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < workers; ++w) {
      pool.emplace_back([&, w] {
        const int64_t lo = n * w / workers, hi = n * (w + 1) / workers;
        uint64_t s = seed * 1000003 + salt * 7777 + w;
        for (int64_t i = lo; i < hi; ++i) store(t, uniform_pm1(s) * amp, &q.values[i * 2]);
      });
    }
    for (auto& th : pool) th.join();
    return q;
  };
  MoeWeights w;
  w.fc1 = make(lp.fc1_rows, lp.hidden, 1);
  w.fc2 = make(lp.hidden, lp.intermediate, 2);
  uint64_t s = seed + 99;
  if (spec.fc1_bias) {
    w.fc1_bias.resize(lp.num_experts * lp.fc1_rows);
    for (auto& v : w.fc1_bias) v = uniform_pm1(s) * 0.1f;
  }
  if (spec.fc2_bias) {
    w.fc2_bias.resize(lp.num_experts * lp.hidden);
    for (auto& v : w.fc2_bias) v = uniform_pm1(s) * 0.1f;
  }
  if (spec.routing.correction_bias) {
    w.routing_bias.resize(spec.num_experts);
    for (auto& v : w.routing_bias) v = uniform_pm1(s) * 0.1f;
  }
  return w;
}

L2Flush parse_l2_flush(const std::string& text) {
  if (text == "read") return L2Flush::kRead;
  if (text == "write") return L2Flush::kWrite;
  if (text == "none") return L2Flush::kNone;
  throw Error(ErrorCode::kInvalidArgument,
              "L2 flush '" + text + "' is not one of read, write, none");
}

const char* to_string(L2Flush f) {
  switch (f) {
    case L2Flush::kRead:
      return "read";
    case L2Flush::kWrite:
      return "write";
    case L2Flush::kNone:
      return "none";
  }
  return "?";
}

double gemm_floor_rate(const Floors& floors, WeightFormat f, const char** name) {
  // The FP8 formats' implementations multiply e4m3 by e4m3; MXFP8's rounds its activations
  // through e4m3 too (W8A8) but multiplies in bf16 (no per-32 K scales in CUTLASS 4.2's FP8
  // kernels), so its FLOPs are held to the BF16 rate.
  const bool fp8 = f == WeightFormat::kFP8PerTensor || f == WeightFormat::kFP8Block128;
  *name = fp8 ? "FP8" : "BF16";
  return fp8 ? floors.fp8_gemm_flops_per_s : floors.gemm_flops_per_s;
}

RunResult run_layer(MoeLayer& layer, const HostInputs& in) {
  if (layer.implementation().device() == Device::kCuda) return run_layer_on_device(layer, in);
  const MoeSpec& spec = layer.spec();
  std::vector<uint8_t> out_raw(in.tokens * spec.hidden * dtype_size(spec.act_dtype), 0xff);
  HostInputs copy = in;  // views are non-const
  ForwardArgs a;
  a.hidden = host_view(copy.hidden.data(), spec.act_dtype, {in.tokens, spec.hidden});
  a.output = host_view(out_raw.data(), spec.act_dtype, {in.tokens, spec.hidden});
  // By the routing method, not by emptiness: a batch of 0 tokens has empty inputs of shape [0, n].
  if (spec.routing.method != RoutingMethod::kExternal) {
    a.router_logits =
        host_view(copy.router_logits.data(), DType::kFloat32, {in.tokens, spec.num_experts});
  } else {
    a.topk_ids = host_view(copy.topk_ids.data(), DType::kInt32, {in.tokens, spec.top_k});
    a.topk_weights = host_view(copy.topk_weights.data(), DType::kFloat32, {in.tokens, spec.top_k});
  }
  const auto t0 = std::chrono::steady_clock::now();
  layer.forward(a);
  const auto t1 = std::chrono::steady_clock::now();
  RunResult r;
  r.milliseconds = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const std::size_t es = dtype_size(spec.act_dtype);
  r.output.resize(in.tokens * spec.hidden);
  for (std::size_t i = 0; i < r.output.size(); ++i)
    r.output[i] = load(spec.act_dtype, &out_raw[i * es]);
  return r;
}

void apply_routing_profile(HostInputs& in, const MoeSpec& spec, const tune::RoutingProfile& profile,
                           uint64_t seed) {
  if (profile.zipf_s == 0.0) return;  // uniform: random_inputs' routing
  tune::draw_zipf_routing(spec, in.tokens, profile.zipf_s, seed, &in.router_logits, &in.topk_ids,
                          &in.topk_weights);
}

std::vector<TacticTime> time_tactics(MoeLayer& layer, Gemm gemm, int64_t bucket,
                                     const HostInputs& in, L2Flush flush, double budget_us) {
  const std::vector<std::string> names = layer.tactics(gemm);
  std::vector<TacticChoices> choices;
  for (const std::string& tactic : names)
    choices.push_back(TacticChoices{{TacticChoice{gemm, bucket, tactic}}});
  const std::vector<double> us = time_choices_on_device(layer, in, flush, choices, budget_us);
  std::vector<TacticTime> times;
  for (std::size_t i = 0; i < names.size(); ++i) times.push_back({names[i], us[i]});
  return tune::rank_tactics(std::move(times), layer.builtin_tactic(gemm, bucket));
}

}  // namespace moekit::cli
