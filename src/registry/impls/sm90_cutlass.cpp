#include "registry/impls/sm90_cutlass.hpp"

#include "registry/impls/impls.hpp"

namespace moekit::registry::impls {

namespace {
bool is_fp8(WeightFormat f) {
  return f == WeightFormat::kFP8Block128 || f == WeightFormat::kFP8PerTensor;
}
}  // namespace

Sm90CutlassImpl::Sm90CutlassImpl(std::string id, WeightFormat weights, DType activations)
    : id_(std::move(id)) {
  Capability& c = cap_;
  c.sm_min = c.sm_max = 90;  // sm_90a: wgmma and TMA exist nowhere else in this form
  c.needs_cuda = c.needs_cutlass = true;
  c.weight_formats = {weights};
  c.act_dtypes = {activations};
  c.activations = all_activations();
  c.routings = all_routings();
  c.router_weight_on_input = true;  // the permute's rows scaled before FC1 (apply_weights_to_rows)
  c.clamp = c.alpha_beta = c.fc1_bias = c.fc2_bias = true;
  c.cuda_graph_safe = true;  // no host sync, no allocation in forward
  c.tensor_parallel = c.expert_parallel = true;
  // TMA needs 16-byte aligned rows: the K extent of FC1 (hidden) and of FC2 (local intermediate).
  c.hidden_multiple = 8;
  c.intermediate_multiple = 8;
  if (is_fp8(weights)) {
    // FP8: both GEMMs' n and k are covered by whole 128x128 weight scale blocks and 1x128
    // activation groups (gemm/fp8_grouped_gemm.hpp).
    c.hidden_multiple = 128;
    c.intermediate_multiple = 128;
    // The FP8 engine reads the checkpoint's gate/up order itself (no blocked reorder, which
    // would mix 128-row scale blocks), so every layout runs as the BF16 engine's do.
  }
  c.max_top_k = 32;     // routing and finalize kernels keep a token's slots in one warp
  c.max_experts = 512;  // routing holds 16 experts per lane of one warp
}

Eligibility Sm90CutlassImpl::extra_checks(const MoeSpec& spec, const Environment&) const {
  if (spec.routing.method == RoutingMethod::kDeepSeekV3 && spec.routing.n_group > 32)
    return Eligibility::rejected(
        RejectStage::kLimits, id_ +
                                  " groups experts for DeepSeek-V3 routing in one warp: n_group " +
                                  std::to_string(spec.routing.n_group) + " is over 32.");
  return Eligibility::eligible();
}

std::unique_ptr<Engine> Sm90CutlassImpl::create_engine(const MoeSpec& spec,
                                                       const MoeWeights& weights,
                                                       int device_index) const {
  if (is_fp8(spec.weights.format)) return create_sm90_fp8_engine(spec, weights, device_index);
  return create_sm90_engine(spec, weights, device_index);
}

}  // namespace moekit::registry::impls
