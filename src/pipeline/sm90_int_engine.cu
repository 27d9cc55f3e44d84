// The Hopper W4A16 / W8A16 engine (sm90_int_engine.hpp): weights laid out and uploaded once
// (sm90_int_layout.hpp), one workspace sized from max_tokens, and a forward that only enqueues
// kernels on the caller's stream:
//   permute (route + count + scan + permute + gather) [-> routing weights on the rows]
//   [-> FC1's pre-quant scale] -> FC1 (int GEMM, bias inside) -> activation
//   [-> FC2's pre-quant scale] -> FC2 (int GEMM) -> finalize.
// The routing, permute, activation and finalize are the BF16 engine's; only the GEMMs' B
// operand (the int codes and their scales) is this engine's own.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation/activation_device.hpp"
#include "activation/gate_up_order.hpp"
#include "finalize/finalize.hpp"
#include "gemm/int_grouped_gemm.hpp"
#include "permute/permute.hpp"
#include "pipeline/engine_support.hpp"
#include "pipeline/weight_only_engine.hpp"
#include "pipeline/sm90_int_engine.hpp"
#include "pipeline/sm90_int_layout.hpp"
#include "routing/routing_device.hpp"

namespace moekit::pipeline {
namespace {

// The kernels' K extent: whole 64-deep k tiles of the CUTLASS mainloop (also with groups of 32,
// as the capability declares one multiple for the format).
constexpr int64_t kKMultiple = 64;

// Lays out every expert of `t` (rows in `row_order` when given) and uploads it to `m`'s arrays,
// one expert at a time, so that the host copy stays one expert large.
void upload_int_matrix(const QuantizedTensor& t, const std::vector<int64_t>* row_order,
                       void* values, float* scales, float* zero_terms, const char* what) {
  const int64_t vb = int_expert_value_bytes(t), ge = int_expert_group_entries(t);
  std::vector<uint8_t> v(static_cast<std::size_t>(vb));
  std::vector<float> s(static_cast<std::size_t>(ge)), z(zero_terms ? s.size() : 0);
  for (int64_t e = 0; e < t.experts; ++e) {
    int_expert_layout(t, e, row_order, v.data(), s.data(), zero_terms ? z.data() : nullptr);
    upload(static_cast<char*>(values) + e * vb, v.data(), v.size(), what);
    upload(scales + e * ge, s.data(), sizeof(float) * s.size(), what);
    if (zero_terms) upload(zero_terms + e * ge, z.data(), sizeof(float) * z.size(), what);
  }
}

class Sm90IntEngine final : public WeightOnlyEngine<gemm::IntGroupedGemm> {
 public:
  Sm90IntEngine(const MoeSpec& spec, const MoeWeights& weights, int device,
                const Sm90IntOptions& options);
};

Sm90IntEngine::Sm90IntEngine(const MoeSpec& spec, const MoeWeights& weights, int device,
                             const Sm90IntOptions& options)
    : WeightOnlyEngine(spec, device, options.poison, options.force_tactic) {
  spec.validate_or_throw();
  const WeightQuant& q = spec.weights;
  const bool int_format =
      q.format == WeightFormat::kInt4Group || q.format == WeightFormat::kInt8Group;
  const bool act_ok = elem_ == DType::kBFloat16 || elem_ == DType::kFloat16;
  if (!int_format || !act_ok)
    throw Error(ErrorCode::kUnsupported,
                std::string("the sm90 int engine runs bf16 or fp16 activations with int4_group or "
                            "int8_group weights, not ") +
                    to_string(elem_) + " activations with " + to_string(q.format) + " weights");
  check_weights(spec, weights);
  lp_ = derive_local(spec);
  const int64_t H = lp_.hidden, I = lp_.intermediate, L = lp_.num_experts, R1 = lp_.fc1_rows;
  const int64_t E = lp_.num_experts_global;
  if (H % kKMultiple != 0 || I % kKMultiple != 0)
    throw Error(ErrorCode::kUnsupported,
                "hidden " + std::to_string(H) + " and local intermediate " + std::to_string(I) +
                    " must be multiples of 64 for the sm90 int engine (its 64-deep k tiles)");
  const int bits = int_group_bits(q.format);
  const int64_t g = q.group_size;
  check_expert_bytes(weights, L * R1 * H * bits / 8, L * H * I * bits / 8);
  const LayerBiases biases = check_biases(spec, lp_, weights);
  check_routing_limits(spec, lp_, "sm90 int engine");
  const bool zero = q.zero_points, pre = q.pre_quant_scale;
  const bool gated = activation::is_gated(static_cast<activation::Kind>(spec.activation.kind));

  DeviceGuard guard(device_);

  // Weights: one allocation, laid out and uploaded once.
  auto carve_weights = [&](Carver& c) {
    struct Pieces {
      char *v1, *v2;
      float *s1, *s2, *z1, *z2, *p1, *p2, *b1, *b2, *rb;
    } p;
    p.v1 = c.take<char>(L * R1 * H * bits / 8);
    p.v2 = c.take<char>(L * H * I * bits / 8);
    p.s1 = c.take<float>(L * (H / g) * R1);
    p.s2 = c.take<float>(L * (I / g) * H);
    p.z1 = c.take<float>(zero ? L * (H / g) * R1 : 0);
    p.z2 = c.take<float>(zero ? L * (I / g) * H : 0);
    p.p1 = c.take<float>(pre ? L * H : 0);
    p.p2 = c.take<float>(pre ? L * I : 0);
    p.b1 = c.take<float>(biases.fc1 ? L * R1 : 0);
    p.b2 = c.take<float>(biases.fc2 ? L * H : 0);
    p.rb = c.take<float>(biases.routing ? E : 0);
    return p;
  };
  const auto wp = carve_allocation(weight_memory_, carve_weights, "expert weights");
  std::vector<int64_t> fc1_rows;
  if (gated) fc1_rows = activation::blocked_fc1_source_rows(spec.gate_up_layout, I);
  upload_int_matrix(weights.fc1, gated ? &fc1_rows : nullptr, wp.v1, wp.s1, zero ? wp.z1 : nullptr,
                    "fc1 weights");
  upload_int_matrix(weights.fc2, nullptr, wp.v2, wp.s2, zero ? wp.z2 : nullptr, "fc2 weights");
  if (pre) {
    upload(wp.p1, weights.fc1.pre_quant_scale.data(), sizeof(float) * L * H, "fc1 pre-quant scale");
    upload(wp.p2, weights.fc2.pre_quant_scale.data(), sizeof(float) * L * I, "fc2 pre-quant scale");
  }
  upload_biases(weights, biases, lp_, gated ? &fc1_rows : nullptr, {wp.b1, wp.b2, wp.rb});
  fc1_call_.w = wp.v1;
  fc1_call_.scales = wp.s1;
  fc1_call_.zeros = zero ? wp.z1 : nullptr;
  fc1_call_.bias = biases.fc1 ? wp.b1 : nullptr;  // in FC1's row order
  fc2_call_.w = wp.v2;
  fc2_call_.scales = wp.s2;
  fc2_call_.zeros = zero ? wp.z2 : nullptr;
  fc2_call_.bias = nullptr;  // the finalize adds FC2's

  const int64_t P =
      configure_stages(biases.routing ? wp.rb : nullptr, biases.fc2 ? wp.b2 : nullptr);

  const gemm::IntGroupedShape s1{static_cast<int>(L), R1,   H,         P, elem_, bits,
                                 static_cast<int>(g), zero, biases.fc1};
  const gemm::IntGroupedShape s2{static_cast<int>(L), H,    I,    P, elem_, bits,
                                 static_cast<int>(g), zero, false};
  fc1_ = std::make_unique<gemm::IntGroupedGemm>(s1, device_);
  fc2_ = std::make_unique<gemm::IntGroupedGemm>(s2, device_);
  const std::size_t staging_bytes = std::max(fc1_->staging_bytes(), fc2_->staging_bytes());

  fc1_call_.staging = fc2_call_.staging = allocate_stage_buffers(staging_bytes);

  cs1_ = permute::ColumnScales{
      pbuf_.offsets, pbuf_.row_expert, pre ? wp.p1 : nullptr, static_cast<int>(L), H, elem_};
  cs2_ = permute::ColumnScales{
      pbuf_.offsets, pbuf_.row_expert, pre ? wp.p2 : nullptr, static_cast<int>(L), I, elem_};

  prepare_stages();
}

}  // namespace

std::unique_ptr<Engine> make_sm90_int_engine(const MoeSpec& spec, const MoeWeights& weights,
                                             int device, const Sm90IntOptions& options) {
  return std::make_unique<Sm90IntEngine>(spec, weights, device, options);
}

}  // namespace moekit::pipeline
