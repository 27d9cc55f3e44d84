// cpu.reference: the exact CPU forward (routing::route_host + reference::forward). It runs every
// problem moekit can describe, without a GPU, so it is the fallback of "auto".
#include <algorithm>
#include <vector>

#include "common/host_activations.hpp"
#include "moekit/registry.hpp"
#include "reference/reference.hpp"
#include "registry/impls/impls.hpp"
#include "routing/routing.hpp"

namespace moekit::registry::impls {

std::vector<WeightFormat> all_weight_formats() {
  return {WeightFormat::kBF16,         WeightFormat::kFP16,        WeightFormat::kFP32,
          WeightFormat::kFP8PerTensor, WeightFormat::kFP8Block128, WeightFormat::kInt8Group,
          WeightFormat::kInt4Group,    WeightFormat::kMXFP4,       WeightFormat::kNVFP4,
          WeightFormat::kMXFP8};
}

std::vector<DType> all_act_dtypes() { return {DType::kFloat32, DType::kBFloat16, DType::kFloat16}; }

std::vector<ActivationKind> all_activations() {
  return {ActivationKind::kSwiGLU,   ActivationKind::kSwiGLUClamped, ActivationKind::kGeGLUTanh,
          ActivationKind::kGeGLUErf, ActivationKind::kSiLU,          ActivationKind::kGeLUTanh,
          ActivationKind::kGeLUErf,  ActivationKind::kReLU2,         ActivationKind::kIdentity};
}

std::vector<RoutingMethod> all_routings() {
  return {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax, RoutingMethod::kDeepSeekV3,
          RoutingMethod::kLlama4, RoutingMethod::kExternal};
}

namespace {

Capability reference_capability() {
  Capability c;
  c.weight_formats = all_weight_formats();
  c.act_dtypes = all_act_dtypes();
  c.int_group_sizes = {32, 64, 128};
  c.int_zero_points = c.int_pre_quant_scale = true;
  c.activations = all_activations();
  c.routings = all_routings();
  c.router_weight_on_input = true;
  c.clamp = c.alpha_beta = c.fc1_bias = c.fc2_bias = true;
  c.tensor_parallel = c.expert_parallel = true;  // computes this rank's partial output
  return c;
}

class ReferenceEngine final : public Engine {
 public:
  // Views are checked by MoeLayer::forward; the buffers are sized once here, from max_tokens.
  ReferenceEngine(const MoeSpec& spec, const MoeWeights& weights)
      : spec_(spec),
        weights_(weights),
        hidden_(static_cast<size_t>(spec.max_tokens * spec.hidden)),
        out_(hidden_.size()),
        ids_(static_cast<size_t>(spec.max_tokens * spec.top_k)),
        route_weights_(ids_.size()) {}

  void forward(const ForwardArgs& a) override {
    const int64_t tokens = a.hidden.shape.at(0);
    if (tokens > spec_.max_tokens)
      throw Error(ErrorCode::kInvalidArgument, "tokens " + std::to_string(tokens) +
                                                   " exceed the layer's max_tokens " +
                                                   std::to_string(spec_.max_tokens) + ".");
    const int64_t k = spec_.top_k, pairs = tokens * k;
    view_to_f32(a.hidden, hidden_.data());
    if (spec_.routing.method == RoutingMethod::kExternal) {
      std::copy_n(a.topk_ids.as<const int32_t>(), pairs, ids_.data());
      throw_if_error(routing::validate_ids_host(tokens, spec_.num_experts, k, ids_.data()));
      // The caller's weights are final: it routed, so routed_scaling_factor is already in them
      // (as reference.hpp and the device routing have it).
      std::copy_n(a.topk_weights.as<const float>(), pairs, route_weights_.data());
    } else {
      const float* bias = spec_.routing.correction_bias ? weights_.routing_bias.data() : nullptr;
      throw_if_error(routing::route_host(spec_.routing, tokens, spec_.num_experts, k,
                                         a.router_logits.as<const float>(), bias, ids_.data(),
                                         route_weights_.data()));
    }
    throw_if_error(reference::forward(spec_, weights_, tokens, hidden_.data(), ids_.data(),
                                      route_weights_.data(), out_.data()));
    f32_to_view(out_.data(), a.output);
  }

  std::size_t workspace_bytes() const override {
    return (hidden_.size() + out_.size() + route_weights_.size()) * sizeof(float) +
           ids_.size() * sizeof(int32_t);
  }

 private:
  MoeSpec spec_;
  MoeWeights weights_;  // the layer owns its prepared weights; the caller's may go away
  std::vector<float> hidden_, out_;
  std::vector<int32_t> ids_;
  std::vector<float> route_weights_;
};

class CpuReference final : public Implementation {
 public:
  std::string id() const override { return "cpu.reference"; }
  std::string family() const override { return "reference"; }
  Device device() const override { return Device::kHost; }
  const Capability& capability() const override { return cap_; }
  std::unique_ptr<Engine> create_engine(const MoeSpec& spec, const MoeWeights& weights,
                                        int /*device_index*/) const override {
    return std::make_unique<ReferenceEngine>(spec, weights);
  }

 private:
  Capability cap_ = reference_capability();
};

}  // namespace

const Implementation& cpu_reference() {
  static const CpuReference impl;
  return impl;
}

}  // namespace moekit::registry::impls
