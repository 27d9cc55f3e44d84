// Routing on the host: the reference every device routing kernel is checked against.
//
// The methods and the model code whose semantics each follows (the weights as that code computes
// them before they multiply the experts; routed_scaling_factor then multiplies every method's):
// - kSoftmaxTopK: softmax over all E logits, the k largest, not renormalized. transformers'
//   Qwen2MoeSparseMoeBlock.forward (models/qwen2_moe/modeling_qwen2_moe.py) and
//   OlmoeSparseMoeBlock.forward (models/olmoe/modeling_olmoe.py) with norm_topk_prob false, as
//   Qwen1.5-MoE-A2.7B and OLMoE-1B-7B ship.
// - kTopKSoftmax: the k largest logits, softmax over those k. gpt-oss's MLPBlock.forward
//   (gpt_oss/torch/model.py: topk of the gate, softmax of its values); also what transformers'
//   MixtralSparseMoeBlock.forward (models/mixtral/modeling_mixtral.py: softmax, topk, divide by
//   the sum) and Qwen3MoeSparseMoeBlock.forward (models/qwen3_moe/modeling_qwen3_moe.py,
//   norm_topk_prob true) compute: softmax then renormalizing the top k equals a softmax over
//   the top k logits.
// - kDeepSeekV3: the model authors' Gate.forward (DeepSeek-V3 inference/model.py, score_func
//   sigmoid, the bias added for selection only, groups scored by their top-2 sum, route_scale)
//   and the MoEGate.forward of the checkpoint's modeling_deepseek.py (topk_method noaux_tc,
//   whose renormalization divides by sum + 1e-20).
// - kLlama4: transformers' Llama4Router.forward (models/llama4/modeling_llama4.py): the k
//   largest logits, each slot's weight sigmoid(its logit), not renormalized (any k: the router
//   takes topk of num_experts_per_tok and the sigmoid of each). Llama4TextMoe.forward then
//   multiplies the experts' input by it (RouterWeightPlacement::kInput, set by the preset).
//
// Conventions shared with the device kernels:
// - Selection order: descending selection score, ties to the lower expert id (for DeepSeek-V3
//   groups: the lower group id). Slots are written in that order. (torch.topk leaves the order
//   of ties unspecified; moekit fixes it so that host and device agree bit for bit.)
// - A NaN logit (or a NaN correction bias) is treated as -inf, for selection and for the
//   weights: it is chosen last, and its softmax / sigmoid weight is 0. When every logit a
//   softmax sees is -inf (or NaN) the weights of that token are 0 rather than NaN. +inf logits
//   are outside the contract (their softmax is NaN, as in IEEE arithmetic). A token's logits
//   never reach another token's routing.
// - kSoftmaxTopK selects on the logits, not on the probabilities: softmax is monotonic, so the
//   choice is the same, and it does not depend on how a given exp() rounds near a tie.
// - kDeepSeekV3: a group's score is the sum of its two best selection scores (its one score when
//   a group holds a single expert); weights are the plain sigmoid scores (no bias), divided by
//   (their sum + 1e-20) when renormalize.
// - Weights (routing/weight_math.hpp, the same bits as the device's): each term in fp32 (softmax:
//   exp(logit - max); DeepSeek-V3 and Llama-4: the sigmoid), the sum that normalizes them in
//   double, then term / sum * routed_scaling_factor in fp32. The scaling factor multiplies the
//   weights of every method.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "routing/routing.hpp"
#include "routing/weight_math.hpp"

namespace moekit::routing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float key_of(float x) { return std::isnan(x) ? kNegInf : x; }

Status invalid(std::string msg) { return Status(ErrorCode::kInvalidArgument, std::move(msg)); }

// Writes to `out` the k candidates with the largest key, descending, ties to the lower index.
// `cand` holds the candidate indices (any order) and is reordered.
void top_k_of(const float* key, std::vector<int32_t>& cand, int64_t k, int32_t* out) {
  auto better = [key](int32_t a, int32_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
  };
  std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
  std::copy(cand.begin(), cand.begin() + k, out);
}

// Softmax weights of `n` keys (NaN already mapped to -inf), scaled; all -inf gives zeros.
void softmax_weights(const float* keys, int64_t n, const float* all_keys, int64_t all_n,
                     double scale, float* w) {
  float mx = kNegInf;
  for (int64_t i = 0; i < all_n; ++i) mx = std::max(mx, all_keys[i]);
  if (mx == kNegInf) {
    std::fill(w, w + n, 0.0f);
    return;
  }
  double denom = 0.0;
  for (int64_t i = 0; i < all_n; ++i) denom += exp_nonpositive(all_keys[i] - mx);
  for (int64_t i = 0; i < n; ++i)
    w[i] = normalized_weight(exp_nonpositive(keys[i] - mx), denom, static_cast<float>(scale));
}

Status check_args(const RoutingParams& p, int64_t tokens, int64_t experts, int64_t top_k,
                  const float* logits, const float* bias, const int32_t* ids,
                  const float* weights) {
  const int m = static_cast<int>(p.method);
  if (m < 1 || m > 5) return invalid("routing method " + std::to_string(m) + " is not known");
  if (p.method == RoutingMethod::kExternal) {
    return invalid(
        "routing method external takes the caller's ids and weights; route_host "
        "cannot compute them");
  }
  if (tokens < 0) return invalid("tokens " + std::to_string(tokens) + " is negative");
  if (experts < 1 || experts > std::numeric_limits<int32_t>::max()) {
    return invalid("experts " + std::to_string(experts) + " is not in [1, 2^31)");
  }
  if (top_k < 1 || top_k > experts) {
    return invalid("top_k " + std::to_string(top_k) + " is not in [1, experts " +
                   std::to_string(experts) + "]");
  }
  if (tokens > 0 && (!logits || !ids || !weights)) {
    return invalid("route_host needs non-null logits, ids and weights for " +
                   std::to_string(tokens) + " tokens");
  }
  if (p.method == RoutingMethod::kDeepSeekV3) {
    if (p.n_group < 1 || experts % p.n_group != 0) {
      return invalid("routing n_group " + std::to_string(p.n_group) + " does not divide experts " +
                     std::to_string(experts));
    }
    if (p.topk_group < 1 || p.topk_group > p.n_group) {
      return invalid("routing topk_group " + std::to_string(p.topk_group) +
                     " is not in [1, n_group " + std::to_string(p.n_group) + "]");
    }
    const int64_t reachable = int64_t{p.topk_group} * (experts / p.n_group);
    if (top_k > reachable) {
      return invalid("top_k " + std::to_string(top_k) + " exceeds the " +
                     std::to_string(reachable) + " experts of the kept groups");
    }
    if (p.correction_bias && !bias) {
      return invalid("routing asks for a correction bias but none was passed");
    }
  }
  return Status::ok_status();
}

void route_deepseek_v3(const RoutingParams& p, int64_t experts, int64_t top_k, const float* logits,
                       const float* bias, std::vector<float>& score, std::vector<float>& sel,
                       std::vector<int32_t>& cand, int32_t* ids, float* w) {
  for (int64_t e = 0; e < experts; ++e) {
    score[e] = sigmoid_fp32(key_of(logits[e]));
    sel[e] = key_of(p.correction_bias ? score[e] + bias[e] : score[e]);
  }
  const int64_t n_group = p.n_group, per_group = experts / n_group;
  std::vector<float> group_score(n_group);
  for (int64_t g = 0; g < n_group; ++g) {
    const float* s = sel.data() + g * per_group;
    float best = kNegInf, second = kNegInf;
    for (int64_t i = 0; i < per_group; ++i) {
      if (s[i] > best) {
        second = best;
        best = s[i];
      } else if (s[i] > second) {
        second = s[i];
      }
    }
    group_score[g] = per_group >= 2 ? key_of(best + second) : best;
  }
  std::vector<int32_t> groups(n_group), kept(p.topk_group);
  for (int64_t g = 0; g < n_group; ++g) groups[g] = static_cast<int32_t>(g);
  top_k_of(group_score.data(), groups, p.topk_group, kept.data());
  cand.clear();
  for (int32_t g : kept) {
    for (int64_t i = 0; i < per_group; ++i) cand.push_back(static_cast<int32_t>(g * per_group + i));
  }
  top_k_of(sel.data(), cand, top_k, ids);
  double sum = 0.0;
  for (int64_t j = 0; j < top_k; ++j) sum += score[ids[j]];
  const double denom = p.renormalize ? sum + 1e-20 : 1.0;
  for (int64_t j = 0; j < top_k; ++j)
    w[j] = normalized_weight(score[ids[j]], denom, p.routed_scaling_factor);
}

}  // namespace

Status route_host(const RoutingParams& params, int64_t tokens, int64_t experts, int64_t top_k,
                  const float* logits, const float* correction_bias, int32_t* ids, float* weights) {
  Status st = check_args(params, tokens, experts, top_k, logits, correction_bias, ids, weights);
  if (!st.ok()) return st;
  const double scale = params.routed_scaling_factor;
  std::vector<float> key(experts), aux(experts), sel_keys(top_k);
  std::vector<int32_t> cand;
  cand.reserve(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    int32_t* id = ids + t * top_k;
    float* w = weights + t * top_k;
    if (params.method == RoutingMethod::kDeepSeekV3) {
      route_deepseek_v3(params, experts, top_k, l, correction_bias, key, aux, cand, id, w);
      continue;
    }
    for (int64_t e = 0; e < experts; ++e) key[e] = key_of(l[e]);
    cand.resize(experts);
    for (int64_t e = 0; e < experts; ++e) cand[e] = static_cast<int32_t>(e);
    top_k_of(key.data(), cand, top_k, id);
    for (int64_t j = 0; j < top_k; ++j) sel_keys[j] = key[id[j]];
    switch (params.method) {
      case RoutingMethod::kSoftmaxTopK:  // softmax over all experts, not renormalized
        softmax_weights(sel_keys.data(), top_k, key.data(), experts, scale, w);
        break;
      case RoutingMethod::kTopKSoftmax:  // softmax over the k selected logits
        softmax_weights(sel_keys.data(), top_k, sel_keys.data(), top_k, scale, w);
        break;
      default:  // kLlama4: each slot's own sigmoid, not renormalized
        for (int64_t j = 0; j < top_k; ++j)
          w[j] = normalized_weight(sigmoid_fp32(sel_keys[j]), 1.0, static_cast<float>(scale));
        break;
    }
  }
  return Status::ok_status();
}

Status validate_ids_host(int64_t tokens, int64_t experts, int64_t top_k, const int32_t* ids) {
  if (tokens < 0 || top_k < 1) {
    return invalid("tokens " + std::to_string(tokens) + " / top_k " + std::to_string(top_k) +
                   " do not describe an id table");
  }
  if (tokens > 0 && !ids) return invalid("ids is null for " + std::to_string(tokens) + " tokens");
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* row = ids + t * top_k;
    for (int64_t j = 0; j < top_k; ++j) {
      if (row[j] < 0 || row[j] >= experts) {
        return invalid("expert id " + std::to_string(row[j]) + " of token " + std::to_string(t) +
                       " slot " + std::to_string(j) + " is not in [0, " + std::to_string(experts) +
                       ")");
      }
      for (int64_t i = 0; i < j; ++i) {
        if (row[i] == row[j]) {
          return invalid("expert id " + std::to_string(row[j]) + " of token " + std::to_string(t) +
                         " slot " + std::to_string(j) + " repeats slot " + std::to_string(i));
        }
      }
    }
  }
  return Status::ok_status();
}

}  // namespace moekit::routing
