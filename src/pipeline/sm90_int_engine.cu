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
#include "pipeline/sm90_int_engine.hpp"
#include "pipeline/sm90_int_layout.hpp"
#include "routing/routing_device.hpp"

namespace moekit::pipeline {
namespace {

// The kernels' K extent: whole 64-deep k tiles of the CUTLASS mainloop.
constexpr int64_t kKMultiple = 64;

// One matrix's device arrays (all local experts): codes, scales, zero terms, pre-quant scale.
struct IntMatrix {
  const void* values = nullptr;
  const float* scales = nullptr;
  const float* zero_terms = nullptr;       // or null
  const float* pre_quant_scale = nullptr;  // [L, cols] or null
};

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

class Sm90IntEngine final : public TwoGemmEngine<gemm::IntGroupedGemm> {
 public:
  Sm90IntEngine(const MoeSpec& spec, const MoeWeights& weights, int device,
                const Sm90IntOptions& options);
  void forward(const ForwardArgs& args) override;

 private:
  MoeSpec spec_;
  Sm90IntOptions options_;
  // The test hook's tactic, else the tuning file's, else empty (IntGroupedGemm::run picks).
  std::string tactic_for(Gemm gemm, int64_t T) const {
    return options_.force_tactic.empty() ? tuned(gemm, T) : options_.force_tactic;
  }
  bool weight_on_input_ = false;
  DType elem_;
  DeviceMemory weight_memory_;
  IntMatrix w1_, w2_;          // FC1's rows in the blocked gate/up order for gated kinds
  const float* b1_ = nullptr;  // FC1's bias [L, fc1_rows], in FC1's row order, or null
  permute::Config pcfg_;
  permute::ColumnScales cs1_, cs2_;  // the pre-quant scales' products (scales null: none)
  activation::DeviceActivation act_;
  finalize::DeviceFinalize fin_;
  void* fc1_out_ = nullptr;   // [P, fc1_rows]
  void* act_out_ = nullptr;   // [P, I]
  void* fc2_out_ = nullptr;   // [P, H], shares the gathered rows (dead after FC1)
  float* staging_ = nullptr;  // fp32 [P, max n] where a GEMM stages its D, or null
};

Sm90IntEngine::Sm90IntEngine(const MoeSpec& spec, const MoeWeights& weights, int device,
                             const Sm90IntOptions& options)
    : TwoGemmEngine(device),
      spec_(spec),
      options_(options),
      weight_on_input_(spec.routing.weight_placement == RouterWeightPlacement::kInput),
      elem_(spec.act_dtype) {
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
  if (q.group_size != 64 && q.group_size != 128)
    throw Error(ErrorCode::kUnsupported,
                "the sm90 int engine runs groups of 64 or 128 columns, not " +
                    std::to_string(q.group_size) +
                    " (CUTLASS's mixed-input mainloop reloads its scales per 64-deep k tile)");
  check_weights(spec, weights);
  lp_ = derive_local(spec);
  const int64_t H = lp_.hidden, I = lp_.intermediate, L = lp_.num_experts, R1 = lp_.fc1_rows;
  const int64_t k = lp_.top_k, E = lp_.num_experts_global;
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
  Carver wsize;
  carve_weights(wsize);
  weight_memory_ = device_alloc(wsize.used(), "expert weights");
  Carver wc(static_cast<char*>(weight_memory_.get()));
  const auto wp = carve_weights(wc);
  std::vector<int64_t> fc1_rows;
  if (gated) fc1_rows = activation::blocked_fc1_source_rows(spec.gate_up_layout, I);
  upload_int_matrix(weights.fc1, gated ? &fc1_rows : nullptr, wp.v1, wp.s1, zero ? wp.z1 : nullptr,
                    "fc1 weights");
  upload_int_matrix(weights.fc2, nullptr, wp.v2, wp.s2, zero ? wp.z2 : nullptr, "fc2 weights");
  if (pre) {
    upload(wp.p1, weights.fc1.pre_quant_scale.data(), sizeof(float) * L * H, "fc1 pre-quant scale");
    upload(wp.p2, weights.fc2.pre_quant_scale.data(), sizeof(float) * L * I, "fc2 pre-quant scale");
  }
  if (biases.fc1) {
    std::vector<float> bias(weights.fc1_bias);
    if (gated)
      for (int64_t e = 0; e < L; ++e)
        activation::gather_rows(fc1_rows, weights.fc1_bias.data() + e * R1, bias.data() + e * R1,
                                sizeof(float));
    upload(wp.b1, bias.data(), sizeof(float) * bias.size(), "fc1 bias");
  }
  if (biases.fc2) upload(wp.b2, weights.fc2_bias.data(), sizeof(float) * L * H, "fc2 bias");
  if (biases.routing) upload(wp.rb, weights.routing_bias.data(), sizeof(float) * E, "routing bias");
  w1_ = IntMatrix{wp.v1, wp.s1, zero ? wp.z1 : nullptr, pre ? wp.p1 : nullptr};
  w2_ = IntMatrix{wp.v2, wp.s2, zero ? wp.z2 : nullptr, pre ? wp.p2 : nullptr};
  b1_ = biases.fc1 ? wp.b1 : nullptr;

  // Stage configurations.
  const int64_t es = 2;  // bf16 / fp16
  pcfg_ = permute_config(spec, lp_, biases.routing ? wp.rb : nullptr, H * es);
  const int64_t P = pcfg_.max_rows();

  act_.elem = elem_;
  act_.params = activation_params(spec.activation);
  act_.intermediate = I;
  act_.fc1_bias = nullptr;  // FC1's GEMM adds it, before its one rounding
  act_.local_experts = static_cast<int>(L);
  if (act_.fc1_rows() != R1)
    throw Error(ErrorCode::kInternal, "fc1 rows " + std::to_string(R1) +
                                          " do not match the activation's " +
                                          std::to_string(act_.fc1_rows()));
  fin_.elem = elem_;
  fin_.hidden = H;
  fin_.top_k = static_cast<int>(k);
  fin_.fc2_bias = biases.fc2 ? wp.b2 : nullptr;

  const gemm::IntGroupedShape s1{static_cast<int>(L), R1,   H,         P, elem_, bits,
                                 static_cast<int>(g), zero, biases.fc1};
  const gemm::IntGroupedShape s2{static_cast<int>(L), H,    I,    P, elem_, bits,
                                 static_cast<int>(g), zero, false};
  fc1_ = std::make_unique<gemm::IntGroupedGemm>(s1, device_);
  fc2_ = std::make_unique<gemm::IntGroupedGemm>(s2, device_);
  const std::size_t staging_bytes = std::max(fc1_->staging_bytes(), fc2_->staging_bytes());

  // Workspace: one allocation; the poisoned span (gathered rows .. staging) is carved last.
  const permute::BufferCounts n = permute::buffer_counts(pcfg_);
  auto carve = [&](Carver& c) {
    permute::Buffers b = carve_permute_buffers(c, n, L);
    b.expert_done = nullptr;   // no GEMV counts or hands out items here
    b.offsets_flag = nullptr;  // nor starts at the permute's flag
    const std::size_t poison_at = c.used();
    b.permuted = c.take<char>(std::max(n.permuted_bytes, P * H * es));
    fc1_out_ = c.take<char>(P * R1 * es);
    act_out_ = c.take<char>(P * I * es);
    fc2_out_ = b.permuted;
    staging_ = staging_bytes > 0 ? c.take<float>(static_cast<int64_t>(staging_bytes / 4)) : nullptr;
    return std::make_pair(b, poison_at);
  };
  allocate_workspace(carve);

  cs1_ = permute::ColumnScales{
      pbuf_.offsets, pbuf_.row_expert, w1_.pre_quant_scale, static_cast<int>(L), H, elem_};
  cs2_ = permute::ColumnScales{
      pbuf_.offsets, pbuf_.row_expert, w2_.pre_quant_scale, static_cast<int>(L), I, elem_};

  // Load every kernel forward() may launch, so its first call can be captured in a graph.
  throw_if_error(permute::prepare(pcfg_));
  if (weight_on_input_) throw_if_error(permute::prepare_apply_weights_to_rows(elem_));
  if (pre) {
    throw_if_error(permute::prepare_apply_column_scales(cs1_));
    throw_if_error(permute::prepare_apply_column_scales(cs2_));
  }
  throw_if_error(activation::prepare_device(act_));
  throw_if_error(finalize::prepare(fin_));
  if (!options_.force_tactic.empty())
    for (const auto* gm : {fc1_.get(), fc2_.get()}) {
      const std::vector<std::string> names = gm->tactics();
      if (std::find(names.begin(), names.end(), options_.force_tactic) == names.end())
        throw Error(ErrorCode::kNotFound,
                    "forced tactic \"" + options_.force_tactic + "\" is not built");
    }
  check_cuda(cudaDeviceSynchronize(), "finishing the engine's set-up");
}

void Sm90IntEngine::forward(const ForwardArgs& args) {
  const int64_t T = check_forward_views(args, spec_, lp_, elem_, device_);
  if (T == 0) return;
  DeviceGuard guard(device_);
  cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
  if (options_.poison) poison_workspace(stream);  // the gathered rows .. the staging
  throw_if_error(permute::run(pcfg_, pbuf_, T, permute_inputs(args, spec_), stream));
  // The reference's order on FC1's input: the routing weight (kInput), then the pre-quant scale,
  // each product rounded to the activation type.
  if (weight_on_input_)
    throw_if_error(permute::apply_weights_to_rows(pcfg_, pbuf_, T, elem_, stream));
  const int64_t rows = rows_bound(T);
  if (w1_.pre_quant_scale != nullptr)
    throw_if_error(permute::apply_column_scales(cs1_, pbuf_.permuted, rows, stream));
  gemm::IntGroupedGemm::Call fc1;
  fc1.a = pbuf_.permuted;
  fc1.w = w1_.values;
  fc1.scales = w1_.scales;
  fc1.zeros = w1_.zero_terms;
  fc1.bias = b1_;
  fc1.d = fc1_out_;
  fc1.staging = staging_;
  fc1.tactic = tactic_for(Gemm::kFc1, T);
  fc1.rows_per_group_hint = rows_hint(T);
  fc1.rows_bound = rows;
  throw_if_error(fc1_->run(fc1, pbuf_.offsets, stream));
  throw_if_error(activation::run_device(act_, fc1_out_, act_out_, pbuf_.row_expert, pbuf_.offsets,
                                        rows, stream));
  if (w2_.pre_quant_scale != nullptr)
    throw_if_error(permute::apply_column_scales(cs2_, act_out_, rows, stream));
  gemm::IntGroupedGemm::Call fc2 = fc1;
  fc2.a = act_out_;
  fc2.w = w2_.values;
  fc2.scales = w2_.scales;
  fc2.zeros = w2_.zero_terms;
  fc2.bias = nullptr;  // the finalize adds FC2's
  fc2.d = fc2_out_;
  fc2.tactic = tactic_for(Gemm::kFc2, T);
  throw_if_error(fc2_->run(fc2, pbuf_.offsets, stream));
  // The slots were final (weights included) before FC2 started.
  throw_if_error(finalize::run(fin_, T, fc2_out_, pbuf_.slot_row, pbuf_.topk_weights,
                               pbuf_.slot_expert, args.output.data, stream, true));
}

}  // namespace

std::unique_ptr<Engine> make_sm90_int_engine(const MoeSpec& spec, const MoeWeights& weights,
                                             int device, const Sm90IntOptions& options) {
  return std::make_unique<Sm90IntEngine>(spec, weights, device, options);
}

}  // namespace moekit::pipeline
