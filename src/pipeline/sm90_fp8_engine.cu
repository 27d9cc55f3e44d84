// The Hopper FP8 engine (sm90_fp8_engine.hpp): weights uploaded once as the checkpoint holds them
// (e4m3 values, fp32 block scales; per-tensor scales spread over the blocks), one workspace sized
// from max_tokens, and a forward that only enqueues kernels on the caller's stream:
//   permute (route + count + scan + permute, no gather) -> quantizing gather (e4m3 rows and their
//   scales in expert order) -> FC1 (fp8 grouped GEMM, bf16 out; fp32 with a bias) -> activation +
//   quantization -> FC2 (fp8 grouped GEMM, bf16 out) -> finalize.
// The routing, permute and finalize are the BF16 engine's; only the experts stage is FP8's own.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation/activation_device.hpp"
#include "finalize/finalize.hpp"
#include "gemm/fp8_grouped_gemm.hpp"
#include "permute/permute.hpp"
#include "pipeline/engine_support.hpp"
#include "pipeline/sm90_fp8_engine.hpp"
#include "routing/routing_device.hpp"

namespace moekit::pipeline {
namespace {

constexpr int64_t kBlock = gemm::Fp8GroupedGemm::kBlock;

// One matrix's block scales on the device: [L, rows / 128, cols / 128], as kFP8Block128 stores
// them, or each expert's per-tensor weight scale repeated over its blocks.
std::vector<float> block_scales(const QuantizedTensor& t, int64_t experts) {
  const int64_t blocks = (t.rows / kBlock) * (t.cols / kBlock);
  if (t.format == WeightFormat::kFP8Block128) return t.scales;
  std::vector<float> s(static_cast<std::size_t>(experts * blocks));
  for (int64_t e = 0; e < experts; ++e)
    std::fill_n(s.begin() + e * blocks, blocks, t.weight_scale[static_cast<std::size_t>(e)]);
  return s;
}

class Sm90Fp8Engine final : public TwoGemmEngine<gemm::Fp8GroupedGemm> {
 public:
  Sm90Fp8Engine(const MoeSpec& spec, const MoeWeights& weights, int device,
                const Sm90Fp8Options& options);
  void forward(const ForwardArgs& args) override;

 private:
  MoeSpec spec_;
  Sm90Fp8Options options_;
  DeviceMemory weight_memory_;
  const void* w1_ = nullptr;          // e4m3 [L, fc1_rows, H]
  const float* w1_scales_ = nullptr;  // [L, fc1_rows / 128, H / 128]
  const void* w2_ = nullptr;          // e4m3 [L, H, I]
  const float* w2_scales_ = nullptr;  // [L, H / 128, I / 128]
  permute::Config pcfg_;
  permute::QuantizedRows rows_;  // FC1's input
  activation::DeviceActivation act_;
  activation::QuantizedActivations acts_;  // FC2's input
  finalize::DeviceFinalize fin_;
  // FC1's output [P, fc1_rows]: bf16, or fp32 where the activation adds FC1's bias to it (so
  // that it rounds once, as the reference does).
  DType fc1_dtype_ = DType::kBFloat16;
  void* fc1_out_ = nullptr;
  void* fc2_out_ = nullptr;  // bf16 [P, H]
};

Sm90Fp8Engine::Sm90Fp8Engine(const MoeSpec& spec, const MoeWeights& weights, int device,
                             const Sm90Fp8Options& options)
    : TwoGemmEngine(device), spec_(spec), options_(options) {
  spec.validate_or_throw();
  const WeightFormat wf = spec.weights.format;
  if (spec.act_dtype != DType::kBFloat16 ||
      (wf != WeightFormat::kFP8Block128 && wf != WeightFormat::kFP8PerTensor))
    throw Error(ErrorCode::kUnsupported,
                std::string("the sm90 fp8 engine runs bf16 activations with fp8_block128 or fp8 "
                            "weights, not ") +
                    to_string(spec.act_dtype) + " activations with " + to_string(wf) + " weights");
  check_weights(spec, weights);
  lp_ = derive_local(spec);
  const int64_t H = lp_.hidden, I = lp_.intermediate, L = lp_.num_experts, R1 = lp_.fc1_rows;
  const int64_t k = lp_.top_k, E = lp_.num_experts_global;
  if (H % kBlock != 0 || I % kBlock != 0)
    throw Error(ErrorCode::kUnsupported,
                "hidden " + std::to_string(H) + " and local intermediate " + std::to_string(I) +
                    " must be multiples of 128 for the sm90 fp8 engine (its scale blocks)");
  const int64_t w1_bytes = L * R1 * H, w2_bytes = L * H * I;
  check_expert_bytes(weights, w1_bytes, w2_bytes);
  const std::vector<float> s1 = block_scales(weights.fc1, L), s2 = block_scales(weights.fc2, L);
  if (static_cast<int64_t>(s1.size()) != L * (R1 / kBlock) * (H / kBlock) ||
      static_cast<int64_t>(s2.size()) != L * (H / kBlock) * (I / kBlock))
    throw Error(ErrorCode::kInvalidArgument, "weight scales hold " + std::to_string(s1.size()) +
                                                 " / " + std::to_string(s2.size()) +
                                                 " values, expected one per 128x128 block");
  const bool per_tensor = wf == WeightFormat::kFP8PerTensor;
  const bool per_token = per_tensor && spec.weights.dynamic_activations;
  const LayerBiases biases = check_biases(spec, lp_, weights);
  check_routing_limits(spec, lp_, "sm90 fp8 engine");

  DeviceGuard guard(device_);

  // Weights: one allocation, uploaded once, in the checkpoint's order.
  auto carve_weights = [&](Carver& c) {
    struct Pieces {
      char *w1, *w2;
      float *s1, *s2, *b1, *b2, *rb, *in1, *in2;
    } p;
    p.w1 = c.take<char>(w1_bytes);
    p.w2 = c.take<char>(w2_bytes);
    p.s1 = c.take<float>(static_cast<int64_t>(s1.size()));
    p.s2 = c.take<float>(static_cast<int64_t>(s2.size()));
    p.b1 = c.take<float>(biases.fc1 ? L * R1 : 0);
    p.b2 = c.take<float>(biases.fc2 ? L * H : 0);
    p.rb = c.take<float>(biases.routing ? E : 0);
    p.in1 = c.take<float>(per_tensor && !per_token ? L : 0);
    p.in2 = c.take<float>(per_tensor && !per_token ? L : 0);
    return p;
  };
  const auto wp = carve_allocation(weight_memory_, carve_weights, "expert weights");
  upload(wp.w1, weights.fc1.values.data(), w1_bytes, "fc1 weights");
  upload(wp.w2, weights.fc2.values.data(), w2_bytes, "fc2 weights");
  upload(wp.s1, s1.data(), sizeof(float) * s1.size(), "fc1 weight scales");
  upload(wp.s2, s2.data(), sizeof(float) * s2.size(), "fc2 weight scales");
  upload_biases(weights, biases, lp_, nullptr, {wp.b1, wp.b2, wp.rb});
  if (!weights.fc1.input_scale.empty()) {  // per-tensor weights with static input scales
    upload(wp.in1, weights.fc1.input_scale.data(), sizeof(float) * L, "fc1 input scales");
    upload(wp.in2, weights.fc2.input_scale.data(), sizeof(float) * L, "fc2 input scales");
  }
  w1_ = wp.w1;
  w2_ = wp.w2;
  w1_scales_ = wp.s1;
  w2_scales_ = wp.s2;

  // Stage configurations.
  pcfg_ = permute_config(spec, lp_, biases.routing ? wp.rb : nullptr, H * 2);  // bf16 rows
  const int64_t P = pcfg_.max_rows();

  act_.elem = DType::kBFloat16;
  act_.params = activation_params(spec.activation);
  act_.intermediate = I;
  act_.fc1_bias = biases.fc1 ? wp.b1 : nullptr;  // the checkpoint's order, like the rows
  act_.local_experts = static_cast<int>(L);
  if (act_.fc1_rows() != R1)
    throw Error(ErrorCode::kInternal, "fc1 rows " + std::to_string(R1) +
                                          " do not match the activation's " +
                                          std::to_string(act_.fc1_rows()));
  fin_.elem = DType::kBFloat16;
  fin_.hidden = H;
  fin_.top_k = static_cast<int>(k);
  fin_.fc2_bias = biases.fc2 ? wp.b2 : nullptr;

  // Workspace: one allocation; the poisoned spans (quantized rows .. FC2's output) are carved
  // last, one after the other.
  const permute::BufferCounts n = permute::buffer_counts(pcfg_);
  auto carve = [&](Carver& c) {
    permute::Buffers b = carve_permute_buffers(c, n, L);
    b.expert_done = nullptr;   // no GEMV counts or hands out items here
    b.offsets_flag = nullptr;  // nor starts at the permute's flag
    const std::size_t poison_at = c.used();
    rows_.values = c.take<uint8_t>(P * H);
    rows_.scales = c.take<float>(P * (H / kBlock));
    fc1_out_ = c.take<char>(P * R1 * (biases.fc1 ? 4 : 2));
    acts_.values = c.take<uint8_t>(P * I);
    acts_.scales = c.take<float>(P * (I / kBlock));
    fc2_out_ = c.take<char>(P * H * 2);
    return std::make_pair(b, poison_at);
  };
  allocate_workspace(carve);
  // Per-tensor weights: the static input scales, or per token (WeightQuant::dynamic_activations).
  rows_.static_scale = per_tensor && !per_token ? wp.in1 : nullptr;
  rows_.per_token = per_token;
  rows_.weight_on_input = spec.routing.weight_placement == RouterWeightPlacement::kInput;
  acts_.static_scale = per_tensor && !per_token ? wp.in2 : nullptr;
  acts_.per_token = per_token;

  fc1_dtype_ = biases.fc1 ? DType::kFloat32 : DType::kBFloat16;
  fc1_ = std::make_unique<gemm::Fp8GroupedGemm>(
      gemm::Fp8GroupedShape{static_cast<int>(L), R1, H, P, biases.fc1}, device_);
  fc2_ = std::make_unique<gemm::Fp8GroupedGemm>(gemm::Fp8GroupedShape{static_cast<int>(L), H, I, P},
                                                device_);

  // Load every kernel forward() may launch, so its first call can be captured in a graph.
  throw_if_error(permute::prepare(pcfg_));
  throw_if_error(permute::prepare_gather_quantized());
  throw_if_error(
      activation::prepare_device_quantized(act_, spec.gate_up_layout, fc1_dtype_, per_token));
  throw_if_error(finalize::prepare(fin_));
  check_cuda(cudaDeviceSynchronize(), "finishing the engine's set-up");
}

void Sm90Fp8Engine::forward(const ForwardArgs& args) {
  const int64_t T = check_forward_views(args, spec_, lp_, DType::kBFloat16, device_);
  if (T == 0) return;
  DeviceGuard guard(device_);
  cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
  if (options_.poison) poison_workspace(stream);  // the quantized rows .. FC2's output
  permute::Inputs in = permute_inputs(args, spec_);
  in.gather = false;  // the quantizing gather reads the caller's rows by their slots
  throw_if_error(permute::run(pcfg_, pbuf_, T, in, stream));
  throw_if_error(permute::gather_quantized(pcfg_, pbuf_, T, args.hidden.data, rows_, stream));
  const double hint = rows_hint(T);
  throw_if_error(
      fc1_->run({rows_.values, rows_.scales, w1_, w1_scales_, fc1_out_, tuned(Gemm::kFc1, T), hint},
                pbuf_.offsets, stream));
  throw_if_error(activation::run_device_quantized(act_, spec_.gate_up_layout, fc1_dtype_, fc1_out_,
                                                  acts_, pbuf_.row_expert, pbuf_.offsets,
                                                  rows_bound(T), stream));
  throw_if_error(
      fc2_->run({acts_.values, acts_.scales, w2_, w2_scales_, fc2_out_, tuned(Gemm::kFc2, T), hint},
                pbuf_.offsets, stream));
  // The slots were final (weights included) before FC2 started.
  throw_if_error(finalize::run(fin_, T, fc2_out_, pbuf_.slot_row, pbuf_.topk_weights,
                               pbuf_.slot_expert, args.output.data, stream, true));
}

}  // namespace

std::unique_ptr<Engine> make_sm90_fp8_engine(const MoeSpec& spec, const MoeWeights& weights,
                                             int device, const Sm90Fp8Options& options) {
  return std::make_unique<Sm90Fp8Engine>(spec, weights, device, options);
}

}  // namespace moekit::pipeline
