// The exact CPU reference forward of one MoE layer.
//
// Per local expert: decode its FC1/FC2 once (bit-exact, quant::dequantize_expert), gather its
// tokens, round the activations as the format's kernels see them (prepare_activations), FC1
// (+bias) rounded to act_dtype, activation rounded to act_dtype, FC2 (+bias on TP rank 0), then
// the weighted sum over the top-k slots in slot order. fp32 everywhere.
// With the routing weight on the expert's input (RouterWeightPlacement::kInput, Llama-4), each
// slot's expert reads its token's row times the slot's own weight, rounded to act_dtype, and
// the slots' outputs are summed with weight 1 (spec.hpp, RoutingParams::weight_placement).
//
// Determinism: every dot product is computed by one thread with one fixed summation order, and
// each expert's output row is stored per (token, slot) and summed in slot order afterwards, so
// the result does not depend on the thread count or on which thread ran what.
#include "reference/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "activation/activation_math.hpp"
#include "moekit/types.hpp"
#include "quant/quant.hpp"
#include "routing/routing.hpp"

namespace moekit::reference {
namespace {

// Explicit 4-lane vectors: a float dot product is a reduction, which the compiler may not
// vectorise without reassociating; with explicit lanes the order is ours and still fast.
using V4 = float __attribute__((vector_size(16)));

inline V4 load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// y[t * ldy + r] = sum_k x[t * K + k] * w[r * K + k] for a TN x TR tile. The summation order of
// one element does not depend on TN / TR, so a value is the same whichever tile computed it.
template <int TN, int TR>
void dot_tile(const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
  V4 acc[TN][TR] = {};
  const int64_t k4 = K & ~int64_t{3};
  for (int64_t k = 0; k < k4; k += 4) {
    V4 wv[TR];
#pragma GCC unroll 4
    for (int r = 0; r < TR; ++r) wv[r] = load4(w + r * K + k);
#pragma GCC unroll 4
    for (int t = 0; t < TN; ++t) {
      const V4 xv = load4(x + t * K + k);
#pragma GCC unroll 4
      for (int r = 0; r < TR; ++r) acc[t][r] += xv * wv[r];
    }
  }
  for (int t = 0; t < TN; ++t) {
    for (int r = 0; r < TR; ++r) {
      float s = (acc[t][r][0] + acc[t][r][1]) + (acc[t][r][2] + acc[t][r][3]);
      for (int64_t k = k4; k < K; ++k) s += x[t * K + k] * w[r * K + k];
      y[t * ldy + r] = s;
    }
  }
}

template <int TN>
void dot_tile_rows(int tr, const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
  if (tr == 2) {
    dot_tile<TN, 2>(x, w, K, y, ldy);
  } else {
    dot_tile<TN, 1>(x, w, K, y, ldy);
  }
}

// y [n, rows] = x [n, K] * w [rows, K]^T, all row-major.
void matmul_nt(const float* x, int64_t n, int64_t K, const float* w, int64_t rows, float* y) {
  // A block of weight rows stays in L2 while every token tile passes over it.
  const int64_t row_block =
      std::max<int64_t>(2, (int64_t{32} * 1024 / std::max<int64_t>(K, 1)) & ~1);
  for (int64_t r0 = 0; r0 < rows; r0 += row_block) {
    const int64_t r1 = std::min(rows, r0 + row_block);
    for (int64_t t = 0; t < n; t += 4) {
      const int64_t tn = std::min<int64_t>(4, n - t);
      const float* xt = x + t * K;
      for (int64_t r = r0; r < r1; r += 2) {
        const int tr = static_cast<int>(std::min<int64_t>(2, r1 - r));
        float* yt = y + t * rows + r;
        const float* wr = w + r * K;
        switch (tn) {
          case 4:
            dot_tile_rows<4>(tr, xt, wr, K, yt, rows);
            break;
          case 3:
            dot_tile_rows<3>(tr, xt, wr, K, yt, rows);
            break;
          case 2:
            dot_tile_rows<2>(tr, xt, wr, K, yt, rows);
            break;
          default:
            dot_tile_rows<1>(tr, xt, wr, K, yt, rows);
            break;
        }
      }
    }
  }
}

// Pairs (token, slot) of one expert handled by one task: at most kItemPairs, so a heavily
// loaded expert is spread over threads while its decode cost stays small beside the matmuls.
constexpr int64_t kItemPairs = 256;
// Upper bound on the per-(token, slot) output rows kept before the weighted sum (allocated only
// for the tokens actually passed). Past it the tokens are processed in chunks, each decoding its
// experts again, so it is generous: 4096 tokens of a Qwen3-30B-A3B layer fit in one chunk.
constexpr int64_t kContribBudgetBytes = int64_t{512} << 20;

struct Item {
  int64_t local_expert;
  int64_t begin, end;  // range in the expert's pair list
};

struct Buffers {
  int64_t decoded_expert = -1;
  std::vector<float> w1, w2, x, y, a, z;
};

class Forward {
 public:
  Forward(const MoeSpec& spec, const LocalProblem& lp, const MoeWeights& w, const float* hidden,
          const int32_t* ids, const float* route_weights, float* out)
      : spec_(spec),
        lp_(lp),
        w_(w),
        hidden_(hidden),
        ids_(ids),
        rw_(route_weights),
        out_(out),
        weight_on_input_(spec.routing.weight_placement == RouterWeightPlacement::kInput) {
    act_.kind = static_cast<activation::Kind>(spec.activation.kind);
    act_.limit = spec.activation.limit.value_or(INFINITY);
    act_.alpha = spec.activation.alpha_or_default();
    act_.beta = spec.activation.beta_or_default();
    gated_ = activation::is_gated(act_.kind);
  }

  void run(int64_t tokens, int threads) {
    const int64_t k = lp_.top_k, H = lp_.hidden;
    const int64_t chunk = std::clamp<int64_t>(kContribBudgetBytes / (k * H * 4), 1, tokens);
    pairs_.assign(lp_.num_experts, {});
    for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
      const int64_t t1 = std::min(tokens, t0 + chunk);
      run_chunk(t0, t1, threads);
    }
  }

 private:
  void run_chunk(int64_t t0, int64_t t1, int threads) {
    const int64_t k = lp_.top_k, H = lp_.hidden;
    for (auto& p : pairs_) p.clear();
    for (int64_t slot = t0 * k; slot < t1 * k; ++slot) {
      const int64_t le = ids_[slot] - lp_.first_expert;
      if (le >= 0 && le < lp_.num_experts) pairs_[le].push_back(slot);
    }
    items_.clear();
    for (int64_t e = 0; e < lp_.num_experts; ++e) {
      const int64_t n = static_cast<int64_t>(pairs_[e].size());
      for (int64_t b = 0; b < n; b += kItemPairs)
        items_.push_back({e, b, std::min(n, b + kItemPairs)});
    }
    contrib_base_ = t0 * k;
    contrib_.resize(static_cast<size_t>((t1 - t0) * k * H));

    next_.store(0);
    parallel(std::min<int64_t>(threads, static_cast<int64_t>(items_.size())), [this] {
      Buffers buf;
      for (size_t i; (i = next_.fetch_add(1)) < items_.size();) run_item(items_[i], buf);
    });

    // Weighted sum over the slots, in slot order; slots of other EP ranks add nothing.
    const int64_t per = std::max<int64_t>(1, (t1 - t0 + threads - 1) / threads);
    const int64_t nthreads = (t1 - t0 + per - 1) / per;
    std::atomic<int64_t> next_block{0};
    parallel(nthreads, [&] {
      for (int64_t b; (b = next_block.fetch_add(1)) < nthreads;) {
        for (int64_t t = t0 + b * per; t < std::min(t1, t0 + (b + 1) * per); ++t) combine(t);
      }
    });
  }

  void combine(int64_t t) {
    const int64_t k = lp_.top_k, H = lp_.hidden;
    float* o = out_ + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t s = t * k; s < (t + 1) * k; ++s) {
      const int64_t le = ids_[s] - lp_.first_expert;
      if (le < 0 || le >= lp_.num_experts) continue;
      const float wgt = weight_on_input_ ? 1.0f : rw_[s];  // kInput: applied to the input
      const float* c = contrib_.data() + (s - contrib_base_) * H;
      for (int64_t h = 0; h < H; ++h) o[h] += wgt * c[h];
    }
  }

  void run_item(const Item& it, Buffers& b) {
    const int64_t H = lp_.hidden, I = lp_.intermediate, R1 = lp_.fc1_rows, k = lp_.top_k;
    const int64_t e = it.local_expert, n = it.end - it.begin;
    if (b.decoded_expert != e) {
      b.w1.resize(static_cast<size_t>(R1 * H));
      b.w2.resize(static_cast<size_t>(H * I));
      quant::dequantize_expert(w_.fc1, e, b.w1.data());
      quant::dequantize_expert(w_.fc2, e, b.w2.data());
      b.decoded_expert = e;
    }
    const int64_t* slots = pairs_[e].data() + it.begin;
    b.x.resize(static_cast<size_t>(n * H));
    const DType dt = spec_.act_dtype;
    for (int64_t i = 0; i < n; ++i) {
      const float* src = hidden_ + (slots[i] / k) * H;
      float* x = b.x.data() + i * H;
      if (weight_on_input_) {
        // Llama-4 (transformers' Llama4TextMoe.forward: routed_in = hidden_states *
        // router_scores, each expert its own score). Hugging Face rounds the sigmoid score to
        // bf16 and multiplies in bf16; here the fp32 weight multiplies in fp32 and the product
        // is rounded once to act_dtype: the two are at most one act_dtype ulp apart.
        const float wgt = rw_[slots[i]];
        for (int64_t h = 0; h < H; ++h) x[h] = quant::round_to(dt, src[h] * wgt);
      } else {
        std::copy(src, src + H, x);
      }
    }
    quant::prepare_activations(w_.fc1, e, b.x.data(), n, spec_.act_dtype);

    // FC1 (+bias), rounded to the activation type as the kernels store it.
    b.y.resize(static_cast<size_t>(n * R1));
    matmul_nt(b.x.data(), n, H, b.w1.data(), R1, b.y.data());
    const float* bias1 = w_.fc1_bias.empty() ? nullptr : w_.fc1_bias.data() + e * R1;
    for (int64_t i = 0; i < n; ++i) {
      float* y = b.y.data() + i * R1;
      for (int64_t r = 0; r < R1; ++r) y[r] = quant::round_to(dt, bias1 ? y[r] + bias1[r] : y[r]);
    }

    // Activation, rounded again.
    b.a.resize(static_cast<size_t>(n * I));
    const bool halves = spec_.gate_up_layout == GateUpLayout::kHalves;
    for (int64_t i = 0; i < n; ++i) {
      const float* y = b.y.data() + i * R1;
      float* a = b.a.data() + i * I;
      for (int64_t j = 0; j < I; ++j) {
        float v;
        if (!gated_) {
          v = activation::apply_plain(act_, y[j]);
        } else if (halves) {
          v = activation::apply_gated(act_, y[j], y[I + j]);
        } else {
          v = activation::apply_gated(act_, y[2 * j], y[2 * j + 1]);
        }
        a[j] = quant::round_to(dt, v);
      }
    }
    quant::prepare_activations(w_.fc2, e, b.a.data(), n, spec_.act_dtype);

    // FC2 (+bias on TP rank 0 only, so the TP sum adds it once), kept per (token, slot).
    b.z.resize(static_cast<size_t>(n * H));
    matmul_nt(b.a.data(), n, I, b.w2.data(), H, b.z.data());
    const float* bias2 =
        lp_.adds_fc2_bias && !w_.fc2_bias.empty() ? w_.fc2_bias.data() + e * H : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      const float* z = b.z.data() + i * H;
      float* c = contrib_.data() + (slots[i] - contrib_base_) * H;
      if (bias2) {
        for (int64_t h = 0; h < H; ++h) c[h] = z[h] + bias2[h];
      } else {
        std::copy(z, z + H, c);
      }
    }
  }

  // Runs fn on `n` threads (the calling thread is one of them); rethrows the first exception.
  template <class Fn>
  static void parallel(int64_t n, Fn&& fn) {
    if (n <= 1) {
      if (n == 1) fn();
      return;
    }
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    auto guarded = [&](int64_t i) {
      try {
        fn();
      } catch (...) {
        errors[i] = std::current_exception();
      }
    };
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < n; ++i) pool.emplace_back(guarded, i);
    guarded(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  const MoeSpec& spec_;
  const LocalProblem& lp_;
  const MoeWeights& w_;
  const float* hidden_;
  const int32_t* ids_;
  const float* rw_;
  float* out_;
  const bool weight_on_input_;  // RouterWeightPlacement::kInput
  activation::Params act_;
  bool gated_ = true;

  std::vector<std::vector<int64_t>> pairs_;  // per local expert: global slot indices t * k + s
  std::vector<Item> items_;
  std::atomic<size_t> next_{0};
  std::vector<float> contrib_;  // [(t1 - t0) * k, H] rows of the current chunk
  int64_t contrib_base_ = 0;
};

}  // namespace

Status forward(const MoeSpec& spec, const MoeWeights& weights, int64_t tokens, const float* hidden,
               const int32_t* ids, const float* route_weights, float* out) {
  return forward(spec, weights, tokens, hidden, ids, route_weights, out, 0);
}

Status forward(const MoeSpec& spec, const MoeWeights& weights, int64_t tokens, const float* hidden,
               const int32_t* ids, const float* route_weights, float* out, int num_threads) {
  if (tokens < 0) {
    return Status(ErrorCode::kInvalidArgument, "tokens " + std::to_string(tokens) + " is negative");
  }
  if (tokens > 0 && (!hidden || !ids || !route_weights || !out)) {
    return Status(ErrorCode::kInvalidArgument,
                  "reference forward needs non-null hidden, ids, weights and out for " +
                      std::to_string(tokens) + " tokens");
  }
  if (num_threads < 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "num_threads " + std::to_string(num_threads) + " is negative");
  }
  try {
    const LocalProblem lp = derive_local(spec);  // validates the spec
    check_weights(spec, weights);
    Status st = routing::validate_ids_host(tokens, lp.num_experts_global, lp.top_k, ids);
    if (!st.ok()) return st;
    if (tokens == 0) return Status::ok_status();
    int threads =
        num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(threads, 1);
    Forward(spec, lp, weights, hidden, ids, route_weights, out).run(tokens, threads);
  } catch (const Error& e) {
    return Status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kInternal, "reference forward ran out of host memory");
  }
  return Status::ok_status();
}

}  // namespace moekit::reference
