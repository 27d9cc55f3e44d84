// The per-token routing of one warp, shared by route_device() and the fused permute kernels so
// the selection rules exist once on the device. Semantics: routing_host.cpp (route_host), which
// it mirrors operation for operation (the weights' terms in fp32 through routing/weight_math.hpp,
// their sums in double), so ids and weights match the host bit for bit (up to the summation order
// of the full softmax's sum).
// Lane l holds experts l, l + 32, ...; after route_token() lane s < top_k holds slot s.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "moekit/types.hpp"
#include "routing/routing_device.hpp"
#include "routing/weight_math.hpp"

namespace moekit::routing::warp {

constexpr unsigned kFull = 0xffffffffu;

// NaN counts as -inf; -0 becomes +0 so that equal values tie (and go to the lower id).
__device__ __forceinline__ float clean(float x) {
  if (isnan(x)) return -INFINITY;
  return x == 0.0f ? 0.0f : x;
}

// Order-preserving map of a non-NaN float onto uint32 in which every value, -inf included, is
// above 0: key 0 means "not a candidate".
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Shared-memory index of expert e among the group scores: skewed by one word per 32 so that
// lanes scanning different groups hit different banks.
__device__ __forceinline__ int skew(int e) { return e + (e >> 5); }

// Warp-wide argmax over per-lane keys (0 = none); ties go to the lower id. Returns the winning
// id, or -1 when no lane has a candidate.
__device__ __forceinline__ int warp_argmax(uint32_t key, int id) {
  const uint32_t m = __reduce_max_sync(kFull, key);
  if (m == 0) return -1;
  const uint32_t cand = key == m ? static_cast<uint32_t>(id) : 0xffffffffu;
  return static_cast<int>(__reduce_min_sync(kFull, cand));
}

// DeepSeek-V3 selection score of expert e from its sigmoid s (also its weight's term): s plus
// the correction bias.
__device__ __forceinline__ float selection_score(const DeviceRouting& r, float s, int e) {
  if (r.correction_bias != nullptr && e < r.experts) s += __ldg(r.correction_bias + e);
  return clean(s);
}

// One token's DeepSeek-V3 scores computed beforehand by the whole block (the fused permute at a
// few tokens), so the routing warp's chain skips the sigmoids and the group scan. Null: the
// warp computes them.
struct PreScores {
  const float* sel = nullptr;      // [E] selection scores (selection_score)
  const float* sigmoid = nullptr;  // [E] sigmoids (the weights before renormalization)
  const float* groups = nullptr;   // [n_group] group scores (group_top_two); null when 1 group
};

// The group score of `values` [group_size] (selection scores) by one warp: the sum of the two
// largest, equal values counted twice (the host's scan), or the largest alone for groups of
// one. Every lane returns it.
__device__ __forceinline__ float group_top_two(const float* values, int group_size, int lane) {
  float best = -INFINITY, second = -INFINITY;
  for (int i = lane; i < group_size; i += 32) {
    const float v = values[i];
    if (v > best) {
      second = best;
      best = v;
    } else if (v > second) {
      second = v;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {  // the two largest of two pairs' four values
    const float ob = __shfl_xor_sync(kFull, best, o), os = __shfl_xor_sync(kFull, second, o);
    second = fmaxf(fminf(best, ob), fmaxf(second, os));
    best = fmaxf(best, ob);
  }
  return group_size >= 2 ? best + second : best;
}

struct Slot {
  int32_t id = -1;  // global expert id, -1 when the token has fewer candidates than top_k
  float weight = 0.0f;
};

// DeepSeek-V3 group selection: a group scores the sum of its two best selection scores (its
// best alone when it holds one expert); the topk_group best groups stay. Returns the bit mask
// of kept groups. `scores` is this warp's shared scratch (routing_smem_per_warp());
// `group_scores`, when not null, the token's group scores summed beforehand by the block
// (group_top_two), and the scratch goes unused.
template <int kPerLane>
__device__ uint32_t select_groups(const DeviceRouting& r, const float (&sel)[kPerLane],
                                  float* scores, int lane, const float* group_scores) {
  const int group_size = r.experts / r.n_group;
  uint32_t key = 0;
  if (group_scores != nullptr) {
    if (lane < r.n_group) key = order_key(clean(group_scores[lane]));
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < r.experts) scores[skew(e)] = sel[j];
    }
    __syncwarp();
    if (lane < r.n_group) {
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < group_size; ++i) {
        const float v = scores[skew(lane * group_size + i)];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      key = order_key(clean(group_size >= 2 ? best + second : best));
    }
    __syncwarp();  // the scratch is rewritten by the next token
  }
  uint32_t mask = 0;
  for (int i = 0; i < r.topk_group; ++i) {
    const int g = warp_argmax(key, lane);
    if (g < 0) break;
    mask |= 1u << g;
    if (lane == g) key = 0;
  }
  return mask;
}

// This lane's logits of one token (`row`: its logits [E]); -inf past the last expert.
template <int kPerLane>
struct Logits {
  float v[kPerLane];
  __device__ __forceinline__ void load(const DeviceRouting& r, const float* __restrict__ row,
                                       int lane) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      v[j] = e < r.experts ? __ldg(row + e) : -INFINITY;
    }
  }
};

// Routes one token from its logits (Logits::load; a warp routing tokens in turn loads the next
// token's while this one runs). Every lane of the warp must call it. `pre`: DeepSeek-V3 scores
// computed beforehand (PreScores), or none.
template <int kPerLane>
__device__ Slot route_token(const DeviceRouting& r, const Logits<kPerLane>& logits, float* scores,
                            int lane, PreScores pre = {}) {
  const int method = r.method;
  const bool deepseek = method == static_cast<int>(RoutingMethod::kDeepSeekV3);
  float x[kPerLane];       // cleaned logits
  uint32_t key[kPerLane];  // selection keys, 0 once taken or not eligible
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) x[j] = clean(logits.v[j]);
  if (deepseek) {
    float sel[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      sel[j] = pre.sel != nullptr ? (e < r.experts ? pre.sel[e] : -INFINITY)
                                  : selection_score(r, sigmoid_fp32(x[j]), e);
      key[j] = e < r.experts ? order_key(sel[j]) : 0u;
    }
    if (r.n_group > 1) {
      const uint32_t mask = select_groups<kPerLane>(r, sel, scores, lane, pre.groups);
      const int group_size = r.experts / r.n_group;
      // Power-of-two groups (DeepSeek-V3: 32) by shift: an integer division is ~20 dependent
      // instructions per expert on this warp's chain.
      const int shift = (group_size & (group_size - 1)) == 0 ? __ffs(group_size) - 1 : -1;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int e = lane + 32 * j;
        const int g = shift >= 0 ? e >> shift : e / group_size;
        if (e < r.experts && !((mask >> g) & 1u)) key[j] = 0;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) key[j] = lane + 32 * j < r.experts ? order_key(x[j]) : 0u;
  }

  // Top-k: each lane sorts its candidates by key, descending (an odd-even transposition sort:
  // its adjacent swaps are stable, so equal keys stay in expert order); the warp then takes the
  // best of the lanes' first candidates k times, and the winner's list moves up by one. So a
  // round is two reductions and a select on every lane, not a rescan by the winner alone while
  // the others wait (H200 timings of 2026-12-01: ~335 cycles per round with the rescan).
  uint32_t sk[kPerLane];
  int sj[kPerLane];
  float sx[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    sk[j] = key[j];
    sj[j] = j;
    sx[j] = x[j];
  }
#pragma unroll
  for (int pass = 0; pass < kPerLane; ++pass) {
#pragma unroll
    for (int j = pass & 1; j + 1 < kPerLane; j += 2) {
      if (sk[j + 1] > sk[j]) {
        const uint32_t k0 = sk[j];
        const int j0 = sj[j];
        const float x0 = sx[j];
        sk[j] = sk[j + 1], sj[j] = sj[j + 1], sx[j] = sx[j + 1];
        sk[j + 1] = k0, sj[j + 1] = j0, sx[j + 1] = x0;
      }
    }
  }
  Slot slot;
  float my_x = -INFINITY;
  for (int i = 0; i < r.top_k; ++i) {
    const int win = warp_argmax(sk[0], lane + 32 * sj[0]);
    if (win < 0) break;
    const float wx = __shfl_sync(kFull, sx[0], win & 31);
    if (lane == i) {
      slot.id = win;
      my_x = wx;
    }
    const bool taken = lane == (win & 31);
#pragma unroll
    for (int j = 0; j + 1 < kPerLane; ++j) {
      sk[j] = taken ? sk[j + 1] : sk[j];
      sj[j] = taken ? sj[j + 1] : sj[j];
      sx[j] = taken ? sx[j + 1] : sx[j];
    }
    sk[kPerLane - 1] = taken ? 0u : sk[kPerLane - 1];
  }

  // Weights as on the host; sums over the k slots run in slot order.
  const bool mine = lane < r.top_k && slot.id >= 0;
  if (method == static_cast<int>(RoutingMethod::kSoftmaxTopK) ||
      method == static_cast<int>(RoutingMethod::kTopKSoftmax)) {
    const float mx = __shfl_sync(kFull, my_x, 0);  // the first pick holds the largest logit
    // The slot's own term, computed once for the sum over the k slots and for its weight.
    const float ex = mine ? exp_nonpositive(my_x - mx) : 0.0f;
    double denom = 0.0;
    if (method == static_cast<int>(RoutingMethod::kSoftmaxTopK)) {  // over all experts
      double part = 0.0;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j < r.experts) part += exp_nonpositive(x[j] - mx);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(kFull, part, o);
      denom = part;
    } else {  // over the k selected; unrolled, so that the shuffles issue ahead of the adds
#pragma unroll 8
      for (int i = 0; i < r.top_k; ++i) denom += __shfl_sync(kFull, ex, i);
    }
    // Every logit -inf (or NaN): zeros, not NaN.
    slot.weight = mine && mx != -INFINITY ? normalized_weight(ex, denom, r.scale) : 0.0f;
    return slot;
  }
  float s = 0.0f;  // the sigmoid methods' term
  double denom = 1.0;
  if (deepseek) {
    s = !mine ? 0.0f : pre.sigmoid != nullptr ? pre.sigmoid[slot.id] : sigmoid_fp32(my_x);
    if (r.renormalize) {
      double sum = 0.0;
#pragma unroll 8
      for (int i = 0; i < r.top_k; ++i) sum += __shfl_sync(kFull, s, i);
      denom = sum + 1e-20;
    }
  } else {  // kLlama4
    s = sigmoid_fp32(my_x);
  }
  slot.weight = mine ? normalized_weight(s, denom, r.scale) : 0.0f;
  return slot;
}

}  // namespace moekit::routing::warp
