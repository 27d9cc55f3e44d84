// The problem description of one MoE layer, its validation, and the sharded problem derived
// from it. Everything an implementation needs to decide eligibility is here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moekit/types.hpp"

namespace moekit {

struct ActivationParams {
  ActivationKind kind = ActivationKind::kSwiGLU;
  std::optional<float> limit;  // clamp (kSwiGLUClamped only)
  std::optional<float> alpha;  // sigmoid slope, neutral 1
  std::optional<float> beta;   // added to up, neutral 0
  float alpha_or_default() const { return alpha.value_or(1.0f); }
  float beta_or_default() const { return beta.value_or(0.0f); }
};

struct RoutingParams {
  RoutingMethod method = RoutingMethod::kTopKSoftmax;
  int n_group = 1;                     // DeepSeek-V3 expert groups
  int topk_group = 1;                  // groups kept per token
  float routed_scaling_factor = 1.0f;  // multiplies the weights moekit computes (not kExternal's)
  bool correction_bias = false;        // DeepSeek-V3 e_score_correction_bias [E], selection only
  bool renormalize = true;             // DeepSeek-V3: normalize the k selected weights to sum 1
  // Llama-4: kInput (each slot's expert reads its row times the slot's weight, rounded to
  // act_dtype; the slots' outputs sum with weight 1: types.hpp, RouterWeightPlacement).
  RouterWeightPlacement weight_placement = RouterWeightPlacement::kOutput;
};

struct WeightQuant {
  WeightFormat format = WeightFormat::kBF16;
  int group_size = 128;          // kInt8Group / kInt4Group only: 32, 64 or 128
  bool zero_points = false;      // kInt8Group / kInt4Group only
  bool pre_quant_scale = false;  // AWQ input smoothing, kInt8Group / kInt4Group only
  // kFP8PerTensor only: the activations are quantized per token (one scale per row, amax / 448)
  // instead of with the checkpoint's static input_scale, which such weights do not hold
  // (compressed-tensors' dynamic "token" activation strategy, the FP8-Dynamic checkpoints).
  bool dynamic_activations = false;
};

// The most elements one tensor of a layer may hold: validate() refuses a spec whose FC1 or FC2
// weights (all experts), [max_tokens, hidden] activations, [max_tokens, num_experts] logits or
// [max_tokens * top_k, fc1 rows] intermediate would hold more (2^48; DeepSeek-V3's FC1, the
// largest preset tensor, holds about 2^43). Every size product of a valid spec is then exact in
// int64.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 48;

struct MoeSpec {
  int64_t num_experts = 0;  // global expert count E
  int64_t top_k = 0;
  int64_t hidden = 0;                  // H
  int64_t intermediate = 0;            // I, per expert, unsharded
  DType act_dtype = DType::kBFloat16;  // input / output element type: bf16, fp16, fp32
  WeightQuant weights;
  ActivationParams activation;
  GateUpLayout gate_up_layout = GateUpLayout::kHalves;
  bool fc1_bias = false;
  bool fc2_bias = false;
  RoutingParams routing;
  int64_t max_tokens = 4096;  // workspace is sized from this
  int tp_size = 1, tp_rank = 0;
  int ep_size = 1, ep_rank = 0;

  // Every violation at once, each one sentence naming the field and the value (sizes
  // included: see kMaxTensorElements).
  std::vector<std::string> validate() const;
  // Throws Error(kInvalidSpec) with all violations joined, when there are any.
  void validate_or_throw() const;
  // Rows of FC1 per expert (2I for gated activations, I otherwise), unsharded; exact for a
  // valid spec.
  int64_t fc1_rows() const;
};

// What one rank actually runs after TP/EP sharding. Derived in one place: derive_local().
struct LocalProblem {
  int64_t num_experts_global = 0;
  int64_t num_experts = 0;   // local experts
  int64_t first_expert = 0;  // global id of local expert 0
  int64_t top_k = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;         // local intermediate I / tp
  int64_t intermediate_offset = 0;  // first column of the unsharded intermediate owned here
  int64_t fc1_rows = 0;             // 2 * local I (gated) or local I
  bool adds_fc2_bias = false;       // only TP rank 0 adds the FC2 bias, so the TP sum is exact
};
LocalProblem derive_local(const MoeSpec& spec);

// The spec as JSON, every field (what `moekit resolve --json` prints under "spec" and
// `moekit ... --spec FILE.json` reads): enums by name, nested objects "weights", "activation"
// (limit / alpha / beta only when present) and "routing"; floats as their shortest exact text,
// inf / -inf / nan as those strings. spec_from_json(spec_to_json(s)) == s field by field, floats
// bit for bit. spec_from_json reads any name *_from_string knows; keys left out keep MoeSpec's
// defaults. It throws Error(kInvalidArgument) naming the field and value on malformed text, an
// unknown key, a value of the wrong type, an unknown enum name or an integer or float that does
// not fit its field; it does not validate (call validate()).
std::string spec_to_json(const MoeSpec& spec);
MoeSpec spec_from_json(const std::string& text);

}  // namespace moekit
