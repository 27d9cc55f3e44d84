// The built-in presets. Shapes and parameters are those of the released configs (config.json);
// routing, activation and where the routing weight multiplies follow the model code cited beside
// each (routing/routing_host.cpp has the routing methods' own citations).
#include "moekit/presets.hpp"

#include "moekit/status.hpp"

namespace moekit {
namespace {

MoeSpec base(int64_t experts, int64_t top_k, int64_t hidden, int64_t inter) {
  MoeSpec s;
  s.num_experts = experts;
  s.top_k = top_k;
  s.hidden = hidden;
  s.intermediate = inter;
  s.act_dtype = DType::kBFloat16;
  s.weights.format = WeightFormat::kBF16;
  s.activation.kind = ActivationKind::kSwiGLU;
  s.gate_up_layout = GateUpLayout::kHalves;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  s.max_tokens = 4096;
  return s;
}

// transformers' Qwen3MoeSparseMoeBlock.forward (models/qwen3_moe/modeling_qwen3_moe.py): softmax,
// topk, and with norm_topk_prob (true in the released configs) divided by the top k's sum,
// which equals a softmax over the top-k logits; experts Qwen3MoeMLP.forward (SwiGLU).
MoeSpec qwen3(int64_t hidden, int64_t inter) { return base(128, 8, hidden, inter); }

// gpt-oss's MLPBlock.forward (gpt_oss/torch/model.py): topk of the gate's logits, softmax over
// those k; swiglu() there: gate and up interleaved (x[..., ::2], x[..., 1::2]), the gate clamped
// above at 7, up clamped to [-7, 7], gate * sigmoid(1.702 gate) * (up + 1); both biases.
MoeSpec gpt_oss(int64_t experts) {
  MoeSpec s = base(experts, 4, 2880, 2880);
  s.weights.format = WeightFormat::kMXFP4;
  s.activation.kind = ActivationKind::kSwiGLUClamped;
  s.activation.limit = 7.0f;
  s.activation.alpha = 1.702f;
  s.activation.beta = 1.0f;
  s.gate_up_layout = GateUpLayout::kInterleaved;
  s.fc1_bias = s.fc2_bias = true;
  return s;
}

std::vector<Preset> build() {
  std::vector<Preset> v;
  {
    MoeSpec s = base(8, 2, 4096, 14336);
    // transformers' MixtralSparseMoeBlock.forward (models/mixtral/modeling_mixtral.py) takes
    // softmax, top-2, then divides by the pair's sum: exactly a softmax over the top-2 logits,
    // so the preset uses that (softmax_topk would leave the two weights summing to less than
    // 1). Experts: MixtralBlockSparseTop2MLP.forward, silu(w1 x) * (w3 x), then w2.
    s.routing.method = RoutingMethod::kTopKSoftmax;
    v.push_back({"mixtral-8x7b",
                 "Mixtral 8x7B: 8 experts, top-2, hidden 4096, intermediate 14336, softmax then "
                 "top-k renormalized (= top-k then softmax), SwiGLU, bf16",
                 s, "mixtral"});
  }
  v.push_back({"qwen3-30b-a3b",
               "Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, intermediate 768, top-k then "
               "softmax, SwiGLU, bf16",
               qwen3(2048, 768), "qwen3_moe"});
  {
    // The model authors' Gate.forward and MoE.forward (DeepSeek-V3 inference/model.py): sigmoid
    // scores, the correction bias for selection only, 4 of 8 groups by their top-2 sums, the
    // selected scores renormalized and scaled by route_scale 2.5; experts Expert.forward
    // (SwiGLU). The checkpoint's modeling_deepseek.py MoEGate.forward (noaux_tc) does the same.
    MoeSpec s = base(256, 8, 7168, 2048);
    s.weights.format = WeightFormat::kFP8Block128;
    s.routing.method = RoutingMethod::kDeepSeekV3;
    s.routing.n_group = 8;
    s.routing.topk_group = 4;
    s.routing.routed_scaling_factor = 2.5f;
    s.routing.correction_bias = true;
    s.routing.renormalize = true;
    v.push_back({"deepseek-v3",
                 "DeepSeek-V3: 256 experts, top-8 of 4 of 8 groups, hidden 7168, intermediate "
                 "2048, sigmoid routing with correction bias, scaling 2.5, SwiGLU, fp8 128x128 "
                 "blocks",
                 s, "deepseek_v3"});
  }
  v.push_back({"gpt-oss-120b",
               "gpt-oss-120b: 128 experts, top-4, hidden 2880, intermediate 2880, top-k then "
               "softmax, clamped SwiGLU (limit 7, alpha 1.702, beta 1), interleaved gate/up, "
               "biases, MXFP4",
               gpt_oss(128), "gpt_oss"});
  v.push_back({"gpt-oss-20b",
               "gpt-oss-20b: 32 experts, top-4, hidden 2880, intermediate 2880, top-k then "
               "softmax, clamped SwiGLU (limit 7, alpha 1.702, beta 1), interleaved gate/up, "
               "biases, MXFP4",
               gpt_oss(32), "gpt_oss"});
  {
    // transformers' Llama4Router.forward (models/llama4/modeling_llama4.py): the top-k logits'
    // sigmoids, not renormalized; Llama4TextMoe.forward multiplies the experts' INPUT by them
    // (routed_in = hidden_states * router_scores) and sums the experts' outputs unweighted, as
    // vLLM's apply_router_weight_on_input. Experts: Llama4TextExperts.forward, gate_up_proj
    // chunked into gate then up (halves), up * silu(gate), down_proj. The shared expert is
    // outside this layer.
    MoeSpec s = base(128, 1, 5120, 8192);
    s.routing.method = RoutingMethod::kLlama4;
    s.routing.weight_placement = RouterWeightPlacement::kInput;
    v.push_back({"llama4-maverick",
                 "Llama-4 Maverick: 128 experts, top-1, hidden 5120, intermediate 8192, sigmoid "
                 "top-1 routing with the weight on the experts' input, SwiGLU, bf16",
                 s, "llama4"});
  }
  v.push_back({"qwen3-235b-a22b",
               "Qwen3-235B-A22B: 128 experts, top-8, hidden 4096, intermediate 1536, top-k then "
               "softmax, SwiGLU, bf16",
               qwen3(4096, 1536), "qwen3_moe"});
  return v;
}

}  // namespace

const std::vector<Preset>& list_presets() {
  static const std::vector<Preset> presets = build();
  return presets;
}

const Preset& find_preset(std::string_view name) {
  for (const Preset& p : list_presets())
    if (p.name == name) return p;
  std::string known;
  for (const Preset& p : list_presets()) known += (known.empty() ? "" : ", ") + p.name;
  throw Error(ErrorCode::kNotFound,
              "unknown preset '" + std::string(name) + "'; known presets: " + known);
}

}  // namespace moekit
