// Times every built grouped-GEMM tactic on the FC1 and FC2 shapes of real presets at the token
// counts of serving, with random top-k routing: the data behind GroupedGemm::pick_tactic.
// "fc1+act" rows time FC1's "+act" kernels, which apply SwiGLU (gpt-oss: clamped, with bias)
// in their epilogue, as the engine's FC1 does for gated kinds.
// Usage: moekit_gemm_sweep [tokens,...] [preset,...]   (prints one table; GPU only)
// MOEKIT_SWEEP_ROUTING=even gives every expert the same rows (T * k / E, the remainder to the
// first experts) instead of random routing's spread: at T=16384 a whole number of 128-row tiles
// per expert on every preset, so the difference to random routing is what its last, partly
// filled tiles cost.
// MOEKIT_SWEEP_TACTICS (tactic names as in the header, comma-separated) and MOEKIT_SWEEP_GEMMS
// (fc1, fc1+act, fc2) keep only those columns and rows: for A/B runs of a few kernels, and for
// ncu on one of them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/event_timing.hpp"
#include "gemm/grouped_gemm.hpp"

namespace {

using moekit::gemm::Elem;
using moekit::gemm::GroupedGemm;
using moekit::gemm::GroupedShape;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "moekit_gemm_sweep: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Random bf16 in [-1, 1) from a hash of the index: no host traffic for 15 GB of weights.
__global__ void fill_random(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    x *= 0x297a2d39u;
    x ^= x >> 15;
    const float f = (x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    p[i] = uint16_t(__float_as_uint(f * 0.05f) >> 16);
  }
}

struct Preset {
  const char* name;
  int experts, top_k, hidden, intermediate;
};
const Preset kPresets[] = {{"qwen3-30b-a3b", 128, 8, 2048, 768},
                           {"mixtral-8x7b", 8, 2, 4096, 14336},
                           {"deepseek-v3", 256, 8, 7168, 2048},
                           {"gpt-oss-120b", 128, 4, 2880, 2880}};

// "a,b,c" -> {"a", "b", "c"}; empty fields are kept (and then refused as unknown names).
std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  if (list.empty() || list.back() == ',') out.push_back("");
  return out;
}

// The entries of `known` that environment variable `var` lists (all when it is unset), or false
// after naming the first listed one that is not known.
bool chosen(const char* var, const std::vector<std::string>& known, const char* what,
            std::vector<bool>& keep) {
  keep.assign(known.size(), true);
  const char* list = std::getenv(var);
  if (list == nullptr) return true;
  keep.assign(known.size(), false);
  for (const std::string& name : split(list)) {
    const auto it = std::find(known.begin(), known.end(), name);
    if (it == known.end()) {
      std::string all;
      for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "moekit_gemm_sweep: %s names '%s', which is not %s (%s)\n", var,
                   name.c_str(), what, all.c_str());
      return false;
    }
    keep[it - known.begin()] = true;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> tokens = {1, 8, 64, 512, 4096, 16384};
  if (argc > 1) {
    tokens.clear();
    for (const std::string& t : split(argv[1])) {
      // Up to 2^20 tokens: T x top_k rows then fit the int32 row offsets with room to spare
      // (the large presets run out of memory first, which cudaMalloc's error names).
      char* end = nullptr;
      const long v = std::strtol(t.c_str(), &end, 10);
      if (t.empty() || *end != '\0' || v < 1 || v > (1 << 20)) {
        std::fprintf(stderr, "moekit_gemm_sweep: token count '%s' is not an integer in [1, 2^20]\n",
                     t.c_str());
        return 2;
      }
      tokens.push_back(static_cast<int>(v));
    }
  }
  std::vector<std::string> only;  // presets to run; all when empty
  if (argc > 2) {
    for (const std::string& name : split(argv[2])) {
      if (std::none_of(std::begin(kPresets), std::end(kPresets),
                       [&](const Preset& p) { return name == p.name; })) {
        std::fprintf(stderr, "moekit_gemm_sweep: unknown preset '%s'\n", name.c_str());
        return 2;
      }
      only.push_back(name);
    }
  }
  bool even = false;
  if (const char* r = std::getenv("MOEKIT_SWEEP_ROUTING")) {
    if (std::string(r) != "even" && std::string(r) != "random") {
      std::fprintf(stderr,
                   "moekit_gemm_sweep: MOEKIT_SWEEP_ROUTING '%s' is neither 'even' nor 'random'\n",
                   r);
      return 2;
    }
    even = std::string(r) == "even";
  }
  std::vector<std::string> tactics = moekit::gemm::tactic_names(Elem::kBF16);
  const std::vector<std::string> gemms = {"fc1", "fc1+act", "fc2"};
  std::vector<bool> run_tactic, run_gemm;
  if (!chosen("MOEKIT_SWEEP_TACTICS", tactics, "a built tactic", run_tactic) ||
      !chosen("MOEKIT_SWEEP_GEMMS", gemms, "a GEMM", run_gemm))
    return 2;
  for (size_t i = tactics.size(); i-- > 0;)
    if (!run_tactic[i]) tactics.erase(tactics.begin() + i);
  const int max_t = *std::max_element(tokens.begin(), tokens.end());
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  void* flush;
  check(cudaMalloc(&flush, 256u << 20), "cudaMalloc");
  std::printf(
      "# grouped GEMM tactic sweep, bf16, median us of >= 15 runs, L2 flushed before each, %s "
      "routing\n",
      even ? "even" : "random");
  std::printf("%-14s %-7s %6s %7s", "preset", "gemm", "T", "rows/e");
  for (const auto& t : tactics) std::printf(" %14s", t.substr(5).c_str());
  std::printf("  best\n");
  std::mt19937 rng(1);
  for (const Preset& p : kPresets) {
    if (!only.empty() && std::find(only.begin(), only.end(), p.name) == only.end()) continue;
    for (int which = 0; which < 3; ++which) {  // fc1, fc1+act, fc2
      if (!run_gemm[which]) continue;
      const bool fc1 = which < 2;
      GroupedShape s;
      s.elem = Elem::kBF16;
      s.groups = p.experts;
      s.n = fc1 ? 2 * p.intermediate : p.hidden;
      s.k = fc1 ? p.hidden : p.intermediate;
      s.max_rows = int64_t(max_t) * p.top_k;
      float* bias = nullptr;
      std::optional<moekit::gemm::EpilogueActivation> act;
      if (which == 1) {
        act.emplace();
        if (std::string(p.name) == "gpt-oss-120b") {
          act->params.kind = moekit::activation::Kind::kSwiGLUClamped;
          act->params.limit = 7.0f;
          act->params.alpha = 1.702f;
          act->params.beta = 1.0f;
          check(cudaMalloc(&bias, s.groups * s.n * 4), "cudaMalloc bias");
          check(cudaMemset(bias, 0, s.groups * s.n * 4), "cudaMemset bias");
          act->bias = bias;
        }
      }
      GroupedGemm gemm(s, 0, act);
      // FC1+act: the store kernels' "+act" twins, in the columns' order (every tactic has one:
      // GroupedGemmShape.EveryTacticHasAnActivationKernel).
      std::vector<std::string> names;
      for (const auto& n : tactics) names.push_back(which == 1 ? n + "+act" : n);
      uint16_t *a, *b, *d;
      const size_t b_elems = size_t(s.groups) * s.n * s.k;
      check(cudaMalloc(&a, s.max_rows * s.k * 2), "cudaMalloc A");
      check(cudaMalloc(&b, b_elems * 2), "cudaMalloc B");
      check(cudaMalloc(&d, s.max_rows * s.n * 2), "cudaMalloc D");
      fill_random<<<4096, 256>>>(a, s.max_rows * s.k, 1);
      fill_random<<<4096, 256>>>(b, b_elems, 2);
      int32_t* offsets;
      check(cudaMalloc(&offsets, (p.experts + 1) * 4), "cudaMalloc offsets");
      for (int t : tokens) {
        // Uniform random top-k routing (k distinct experts per token), or the same rows each.
        std::vector<int> count(p.experts, 0), perm(p.experts);
        for (int e = 0; even && e < p.experts; ++e)
          count[e] = t * p.top_k / p.experts + (e < t * p.top_k % p.experts ? 1 : 0);
        for (int tok = 0; !even && tok < t; ++tok) {
          for (int e = 0; e < p.experts; ++e) perm[e] = e;
          for (int j = 0; j < p.top_k; ++j) {
            std::swap(perm[j], perm[j + rng() % (p.experts - j)]);
            ++count[perm[j]];
          }
        }
        std::vector<int32_t> off(p.experts + 1, 0);
        for (int e = 0; e < p.experts; ++e) off[e + 1] = off[e] + count[e];
        check(cudaMemcpy(offsets, off.data(), off.size() * 4, cudaMemcpyHostToDevice),
              "copy offsets");
        const double hint = double(t) * p.top_k / p.experts;
        std::printf("%-14s %-7s %6d %7.1f", p.name, gemms[which].c_str(), t, hint);
        double best = 1e30;
        std::string best_name;
        for (const auto& name : names) {
          // Decode tactics re-read the weights per token chunk: hopeless (and slow) on prefill.
          if ((name.find("gemv") != std::string::npos && hint > 64) ||
              (name.find("swapab") != std::string::npos && hint > 512)) {
            std::printf(" %14s", "-");
            continue;
          }
          bool ok = true;
          int rep = 0;
          const double us = moekit::event_median_us(
              stream, 2, 15,
              [&] { ok = ok && gemm.run(a, b, d, offsets, hint, stream, name).ok(); },
              [&] { check(cudaMemsetAsync(flush, rep++, 256u << 20, stream), "flush"); });
          const double m = ok ? us : -1;
          std::printf(" %14.1f", m);
          if (ok && m < best) {
            best = m;
            best_name = name;
          }
        }
        std::printf("  %s (heuristic: %s)\n", best_name.c_str(), gemm.pick_tactic(hint).c_str());
        std::fflush(stdout);
      }
      cudaFree(a);
      cudaFree(b);
      cudaFree(d);
      cudaFree(offsets);
      cudaFree(bias);
    }
  }
  return 0;
}
