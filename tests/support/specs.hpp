// MoeSpec pieces that several host and device tests build the same way. C++17: the *_test.cu
// files include it.
#pragma once
#include "moekit/spec.hpp"

namespace moekit::test {

// The Qwen3-30B-A3B layer: E128 k8 H2048 I768, bf16, top-k softmax routing.
inline MoeSpec qwen3_30b_spec() {
  MoeSpec s;
  s.num_experts = 128;
  s.top_k = 8;
  s.hidden = 2048;
  s.intermediate = 768;
  s.act_dtype = DType::kBFloat16;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  return s;
}

// A small fp32 layer (fp32 weights, top-k softmax routing): host tests of the layer's plumbing.
inline MoeSpec small_fp32_spec(int64_t experts, int64_t top_k, int64_t hidden,
                               int64_t intermediate) {
  MoeSpec s;
  s.num_experts = experts;
  s.top_k = top_k;
  s.hidden = hidden;
  s.intermediate = intermediate;
  s.act_dtype = DType::kFloat32;
  s.weights.format = WeightFormat::kFP32;
  return s;
}

// gpt-oss's clamped SwiGLU: alpha 1.702, beta 1, clamped at `limit`.
inline void set_clamped_swiglu(MoeSpec& s, float limit = 7.0f) {
  s.activation.kind = ActivationKind::kSwiGLUClamped;
  s.activation.limit = limit;
  s.activation.alpha = 1.702f;
  s.activation.beta = 1.0f;
}

// DeepSeek-V3 routing: grouped selection with the correction bias, weights scaled by 2.5.
inline void set_deepseek_v3_routing(MoeSpec& s, int n_group, int topk_group) {
  s.routing.method = RoutingMethod::kDeepSeekV3;
  s.routing.n_group = n_group;
  s.routing.topk_group = topk_group;
  s.routing.correction_bias = true;
  s.routing.routed_scaling_factor = 2.5f;
}

}  // namespace moekit::test
