// The Hopper microscaling engine (sm90_mx_engine.hpp): weights uploaded once in the device
// layout (sm90_mx_layout.hpp), one workspace sized from max_tokens, and the weight-only engines'
// forward (weight_only_engine.hpp) around two gemm::MxGroupedGemm.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation/gate_up_order.hpp"
#include "gemm/mx_grouped_gemm.hpp"
#include "pipeline/engine_support.hpp"
#include "pipeline/sm90_mx_engine.hpp"
#include "pipeline/sm90_mx_layout.hpp"
#include "pipeline/weight_only_engine.hpp"

namespace moekit::pipeline {
namespace {

// Lays out every expert of `t` (rows in `row_order` when given) and uploads it, one expert at a
// time, so that the host copy stays one expert large.
void upload_mx_matrix(const QuantizedTensor& t, const std::vector<int64_t>* row_order, void* values,
                      void* scales, const char* what) {
  const int64_t vb = mx_expert_value_bytes(t), sb = mx_expert_scale_bytes(t);
  std::vector<uint8_t> v(static_cast<std::size_t>(vb)), s(static_cast<std::size_t>(sb));
  for (int64_t e = 0; e < t.experts; ++e) {
    mx_expert_layout(t, e, row_order, v.data(), s.data());
    upload(static_cast<char*>(values) + e * vb, v.data(), v.size(), what);
    upload(static_cast<char*>(scales) + e * sb, s.data(), s.size(), what);
  }
}

class Sm90MxEngine final : public WeightOnlyEngine<gemm::MxGroupedGemm> {
 public:
  Sm90MxEngine(const MoeSpec& spec, const MoeWeights& weights, int device,
               const Sm90MxOptions& options);
};

Sm90MxEngine::Sm90MxEngine(const MoeSpec& spec, const MoeWeights& weights, int device,
                           const Sm90MxOptions& options)
    : WeightOnlyEngine(spec, device, options.poison, options.force_tactic) {
  spec.validate_or_throw();
  const WeightFormat f = spec.weights.format;
  const bool act_ok = elem_ == DType::kBFloat16 || elem_ == DType::kFloat16;
  if (!is_mx_format(f) || !act_ok)
    throw Error(ErrorCode::kUnsupported,
                std::string("the sm90 mx engine runs bf16 or fp16 activations with mxfp4, nvfp4 "
                            "or mxfp8 weights, not ") +
                    to_string(elem_) + " activations with " + to_string(f) + " weights");
  check_weights(spec, weights);
  lp_ = derive_local(spec);
  const int64_t H = lp_.hidden, I = lp_.intermediate, L = lp_.num_experts, R1 = lp_.fc1_rows;
  const int64_t E = lp_.num_experts_global;
  throw_if_error(mx_check_matrix(f, R1, H, "fc1"));
  throw_if_error(mx_check_matrix(f, H, I, "fc2"));
  const int64_t v1 = mx_expert_value_bytes(weights.fc1), v2 = mx_expert_value_bytes(weights.fc2);
  const int64_t s1 = mx_expert_scale_bytes(weights.fc1), s2 = mx_expert_scale_bytes(weights.fc2);
  check_expert_bytes(weights, L * v1, L * v2);
  const LayerBiases biases = check_biases(spec, lp_, weights);
  check_routing_limits(spec, lp_, "sm90 mx engine");
  const bool nvfp4 = f == WeightFormat::kNVFP4;
  const bool gated = activation::is_gated(static_cast<activation::Kind>(spec.activation.kind));

  DeviceGuard guard(device_);

  // Weights: one allocation, laid out and uploaded once.
  auto carve_weights = [&](Carver& c) {
    struct Pieces {
      char *v1, *v2, *s1, *s2;
      float *g1, *g2, *b1, *b2, *rb;
    } p;
    p.v1 = c.take<char>(L * v1);
    p.v2 = c.take<char>(L * v2);
    p.s1 = c.take<char>(L * s1);
    p.s2 = c.take<char>(L * s2);
    p.g1 = c.take<float>(nvfp4 ? L : 0);
    p.g2 = c.take<float>(nvfp4 ? L : 0);
    p.b1 = c.take<float>(biases.fc1 ? L * R1 : 0);
    p.b2 = c.take<float>(biases.fc2 ? L * H : 0);
    p.rb = c.take<float>(biases.routing ? E : 0);
    return p;
  };
  const auto wp = carve_allocation(weight_memory_, carve_weights, "expert weights");
  std::vector<int64_t> fc1_rows;
  if (gated) fc1_rows = activation::blocked_fc1_source_rows(spec.gate_up_layout, I);
  upload_mx_matrix(weights.fc1, gated ? &fc1_rows : nullptr, wp.v1, wp.s1, "fc1 weights");
  upload_mx_matrix(weights.fc2, nullptr, wp.v2, wp.s2, "fc2 weights");
  if (nvfp4) {
    upload(wp.g1, weights.fc1.global_scale.data(), sizeof(float) * L, "fc1 global scales");
    upload(wp.g2, weights.fc2.global_scale.data(), sizeof(float) * L, "fc2 global scales");
  }
  upload_biases(weights, biases, lp_, gated ? &fc1_rows : nullptr, {wp.b1, wp.b2, wp.rb});
  fc1_call_.w = wp.v1;
  fc1_call_.scales = reinterpret_cast<const uint8_t*>(wp.s1);
  fc1_call_.global_scales = nvfp4 ? wp.g1 : nullptr;
  fc1_call_.bias = biases.fc1 ? wp.b1 : nullptr;  // in FC1's row order
  fc2_call_.w = wp.v2;
  fc2_call_.scales = reinterpret_cast<const uint8_t*>(wp.s2);
  fc2_call_.global_scales = nvfp4 ? wp.g2 : nullptr;
  fc2_call_.bias = nullptr;  // the finalize adds FC2's

  const int64_t P =
      configure_stages(biases.routing ? wp.rb : nullptr, biases.fc2 ? wp.b2 : nullptr);

  fc1_ = std::make_unique<gemm::MxGroupedGemm>(
      gemm::MxGroupedShape{static_cast<int>(L), R1, H, P, elem_, f, biases.fc1}, device_);
  fc2_ = std::make_unique<gemm::MxGroupedGemm>(
      gemm::MxGroupedShape{static_cast<int>(L), H, I, P, elem_, f, false}, device_);

  allocate_stage_buffers(0);  // the GEMV stages nothing

  // MXFP8 is W8A8 (include/moekit/types.hpp): FC1's and FC2's inputs rounded through e4m3 per 32
  // columns as the reference rounds them, then multiplied in bf16 (exact there).
  if (f == WeightFormat::kMXFP8) {
    mx1_ = permute::Mxfp8Rows{pbuf_.offsets, static_cast<int>(L), H, elem_};
    mx2_ = permute::Mxfp8Rows{pbuf_.offsets, static_cast<int>(L), I, elem_};
  }

  prepare_stages();
}

}  // namespace

std::unique_ptr<Engine> make_sm90_mx_engine(const MoeSpec& spec, const MoeWeights& weights,
                                            int device, const Sm90MxOptions& options) {
  return std::make_unique<Sm90MxEngine>(spec, weights, device, options);
}

}  // namespace moekit::pipeline
