#include "registry/impls/sm90_cutlass.hpp"

#include "registry/impls/impls.hpp"

namespace moekit::registry::impls {

namespace {
bool is_fp8(WeightFormat f) {
  return f == WeightFormat::kFP8Block128 || f == WeightFormat::kFP8PerTensor;
}
bool is_int_group(WeightFormat f) {
  return f == WeightFormat::kInt4Group || f == WeightFormat::kInt8Group;
}
bool is_mx(WeightFormat f) {
  return f == WeightFormat::kMXFP4 || f == WeightFormat::kNVFP4 || f == WeightFormat::kMXFP8;
}
}  // namespace

Sm90CutlassImpl::Sm90CutlassImpl(std::string id, WeightFormat weights,
                                 std::vector<DType> activations, std::string family)
    : id_(std::move(id)), family_(std::move(family)) {
  Capability& c = cap_;
  c.sm_min = c.sm_max = 90;  // sm_90a: wgmma and TMA exist nowhere else in this form
  c.needs_cuda = true;
  c.needs_cutlass = !is_mx(weights);  // the mx engine runs moekit's kernels only
  c.weight_formats = {weights};
  c.act_dtypes = std::move(activations);
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
  if (is_int_group(weights)) {
    // W4A16 / W8A16 (gemm/int_grouped_gemm.hpp): groups of 64 and 128 on the tensor cores
    // (CUTLASS 4.2's Hopper mixed-input mainloop, which reloads the group scales once per 64-deep
    // k tile, and the tensor-core GEMV's 64-wide spans); groups of 32 on the streaming GEMV at
    // every token count (correct, slow at prefill). Zero points run (the scale-only kernel plus
    // an fp32 correction; CUTLASS's grouped zero-point mode does not update its scale
    // descriptors per group), and so does the AWQ pre-quant scale (a product on the rows before
    // each GEMM, as the reference rounds it).
    c.int_group_sizes = {32, 64, 128};
    c.int_zero_points = c.int_pre_quant_scale = true;
    // K (hidden for FC1, the local intermediate for FC2) in whole 64-deep k tiles; N (FC1's rows,
    // hidden) a multiple of 8 for the 16-byte output rows and of 4 for the scales' TMA rows,
    // which the same multiple of 64 covers.
    c.hidden_multiple = 64;
    c.intermediate_multiple = 64;
  }
  if (is_mx(weights)) {
    // MXFP4 / NVFP4 / MXFP8 (gemm/mx_grouped_gemm.hpp, pipeline/sm90_mx_layout.hpp): K (hidden
    // for FC1, the local intermediate for FC2) a multiple of 32, a GEMV lane's 16-byte chunk of
    // 32 e2m1 or 16 e4m3 values and the MX blocks' width; N (FC1's 2 x I rows, hidden) a
    // multiple of 8 for the 16-byte output rows, which the same multiple of 32 covers.
    c.hidden_multiple = 32;
    c.intermediate_multiple = 32;
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
  if (is_int_group(spec.weights.format)) return create_sm90_int_engine(spec, weights, device_index);
  if (is_mx(spec.weights.format)) return create_sm90_mx_engine(spec, weights, device_index);
  return create_sm90_engine(spec, weights, device_index);
}

}  // namespace moekit::registry::impls
