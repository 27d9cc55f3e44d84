// cuda.sm90.cutlass.bf16: the Hopper grouped-GEMM engine (CUTLASS ptr-array, TMA + wgmma) for
// bf16 weights with bf16 activations. Its capability builds in every configuration, so a
// CUDA-less build still explains why it cannot run; only the engine needs CUDA.
#include "moekit/registry.hpp"
#include "registry/impls/impls.hpp"

namespace moekit::registry::impls {
namespace {

Capability sm90_bf16_capability() {
  Capability c;
  c.sm_min = c.sm_max = 90;  // sm_90a: wgmma and TMA multicast do not exist elsewhere
  c.needs_cuda = c.needs_cutlass = true;
  c.weight_formats = {WeightFormat::kBF16};
  c.act_dtypes = {DType::kBFloat16};
  c.activations = {
      ActivationKind::kSwiGLU,   ActivationKind::kSwiGLUClamped, ActivationKind::kGeGLUTanh,
      ActivationKind::kGeGLUErf, ActivationKind::kSiLU,          ActivationKind::kGeLUTanh,
      ActivationKind::kGeLUErf,  ActivationKind::kReLU2,         ActivationKind::kIdentity};
  c.routings = {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                RoutingMethod::kDeepSeekV3, RoutingMethod::kLlama4, RoutingMethod::kExternal};
  c.clamp = c.alpha_beta = c.fc1_bias = c.fc2_bias = true;
  c.lora = false;
  c.all_to_all = false;
  c.cuda_graph_safe = true;  // no host sync, no allocation in forward
  c.tensor_parallel = c.expert_parallel = true;
  // TMA needs 16-byte aligned rows: the K extent of FC1 (hidden) and of FC2 (local intermediate).
  c.hidden_multiple = 8;
  c.intermediate_multiple = 8;
  c.max_top_k = 32;  // the largest top-k the Hopper routing and finalize kernels are built for
  return c;
}

class CudaSm90CutlassBf16 final : public Implementation {
 public:
  std::string id() const override { return "cuda.sm90.cutlass.bf16"; }
  std::string family() const override { return "cutlass"; }
  Device device() const override { return Device::kCuda; }
  const Capability& capability() const override { return cap_; }
  std::unique_ptr<Engine> create_engine(const MoeSpec& spec, const MoeWeights& weights,
                                        int device_index) const override {
    return create_sm90_engine(spec, weights, device_index);
  }

 private:
  Capability cap_ = sm90_bf16_capability();
};

}  // namespace

const Implementation& cuda_sm90_cutlass_bf16() {
  static const CudaSm90CutlassBf16 impl;
  return impl;
}

}  // namespace moekit::registry::impls
