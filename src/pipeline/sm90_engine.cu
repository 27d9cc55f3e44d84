// The Hopper BF16/FP16 engine (sm90_engine.hpp): weights uploaded once, one workspace sized
// from max_tokens, and a forward that only enqueues kernels on the caller's stream:
//   permute (route + count + scan + permute + gather) -> FC1 + activation -> FC2 -> finalize.
// For gated kinds FC1's "+act" kernels (CUTLASS epilogue, GEMV reduction) apply the bias and
// activation; FC1's rows are uploaded in the blocked gate/up order they expect
// (activation_math.hpp). Non-gated kinds store FC1's output and run the activation kernel.
// With the routing weight on the experts' input (RouterWeightPlacement::kInput) the permute
// gathers every row and one more kernel scales them by their slots' weights, which it then sets
// to 1 (permute::apply_weights_to_rows): FC1 to the finalize run as for the output placement.
// No allocation, host sync or device-to-host copy in forward(): it can be graph-captured, also
// on the first call (every kernel is loaded and configured here, at construction).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation/activation_device.hpp"
#include "activation/gate_up_order.hpp"
#include "finalize/finalize.hpp"
#include "gemm/grouped_gemm.hpp"
#include "permute/permute.hpp"
#include "pipeline/engine_support.hpp"
#include "pipeline/sm90_engine.hpp"
#include "routing/routing_device.hpp"

namespace moekit::pipeline {
namespace {

class Sm90Engine final : public Engine {
 public:
  Sm90Engine(const MoeSpec& spec, const MoeWeights& weights, int device,
             const Sm90Options& options);
  void forward(const ForwardArgs& args) override;
  std::size_t workspace_bytes() const override {
    return workspace_bytes_ + partials_bytes_ + fc1_->workspace_bytes() + fc2_->workspace_bytes();
  }
  Status poll_errors() override;
  std::vector<std::string> tactics(Gemm gemm) const override;
  void set_tactics(const TacticChoices& choices) override { tuned_ = choices; }
  bool tactics_apply(Gemm, int64_t T) const override {
    return !(T == 1 && slices_one_token()) && !chains(T);
  }
  std::string builtin_tactic(Gemm gemm, int64_t T) const override {
    if (!tactics_apply(gemm, T)) return {};
    return (gemm == Gemm::kFc1 ? fc1_ : fc2_)->pick_tactic(hint_of(T), false);
  }

 private:
  MoeSpec spec_;
  Sm90Options options_;
  // A tuning file's choices (MoeLayer::create): at their buckets they replace pick_tactic's
  // where FC1 and FC2 run as two launches. The tuner times each GEMM alone, so the fused decode
  // paths (one token sliced, chained FC1 + FC2) keep their own kernels.
  TacticChoices tuned_;
  std::string tuned_or(Gemm gemm, int64_t T, bool chain, std::string picked) const {
    const std::string* t = chain ? nullptr : tuned_.find(gemm, T);
    return t ? *t : picked;
  }
  // RouterWeightPlacement::kInput: FC1 reads gathered rows, scaled before it starts; none of the
  // paths that read the caller's rows instead (one token sliced, token rows, gathering FC1, FC1
  // at the permute's flag) runs.
  bool weight_on_input_ = false;
  LocalProblem lp_;
  int device_;
  DType elem_;
  DeviceMemory weight_memory_, workspace_, partials_memory_;
  std::size_t workspace_bytes_ = 0;
  const void* w1_ = nullptr;  // [L, fc1_rows, H]
  const void* w2_ = nullptr;  // [L, H, I]
  permute::Config pcfg_;
  permute::Buffers pbuf_;
  activation::DeviceActivation act_;
  finalize::DeviceFinalize fin_;
  void* fc1_out_ = nullptr;  // [P, fc1_rows]; only for non-gated kinds (gated: FC1 applies it)
  void* act_out_ = nullptr;  // [P, I]
  void* fc2_out_ = nullptr;  // [P, H], shares the gathered input's memory (dead after FC1)
  // fp32 partial sums: [min(k, L)][FC1 slices][H] where one token slices, and
  // [kMaxTokenRows x min(k, L)][fc2_k_slices][H] where chained FC2 is sliced along k; or null.
  float* partials_ = nullptr;
  std::size_t permuted_bytes_ = 0, act_out_bytes_ = 0, slot_count_ = 0, partials_bytes_ = 0;
  std::string slice_tactic_;  // FC1's for one token's sliced forward, or empty
  // One token through GroupedGemm::launch_sliced; false (nothing enqueued) where it does not
  // slice (no sliced tactic, or a permute that cannot hand over at its flag).
  bool forward_sliced(const ForwardArgs& args, permute::Inputs in, cudaStream_t stream);
  // Whether one token runs sliced (forward_sliced), and T tokens as the chained decode GEMV:
  // both keep their own kernels, whatever a tuning file chose.
  bool slices_one_token() const {
    return !slice_tactic_.empty() && permute::clears_expert_done(1) &&
           permute::offsets_final_for_next_kernel(pcfg_, 1, permute::Path::kAuto, false) ==
               permute::OffsetsFinal::kAtFlag;
  }
  bool chains(int64_t T) const {
    const int64_t rows = T * std::min<int64_t>(lp_.top_k, lp_.num_experts);
    return options_.chain_decode && permute::clears_expert_done(T) &&
           (T > 1 || fc1_->chains_one_token(rows));
  }
  // Rows per expert if routing were uniform: only a hint for the GEMMs' tactics.
  double hint_of(int64_t T) const {
    return static_cast<double>(T) * lp_.top_k / static_cast<double>(lp_.num_experts_global);
  }
  // FC2's k slices chained at T tokens on FC1's `fc1_tactic` (Sm90Options::fc2_k_slices).
  int fc2_k_slices(int64_t T, const std::string& fc1_tactic, bool token_rows) const {
    if (T > gemm::GroupedGemm::kMaxTokenRows) return 1;
    if (options_.fc2_k_slices > 0) return options_.fc2_k_slices;
    return fc1_->chained_k_slices(fc1_tactic, *fc2_, T * std::min(lp_.top_k, lp_.num_experts),
                                  token_rows);
  }
  std::unique_ptr<gemm::GroupedGemm> fc1_, fc2_;
};

Sm90Engine::Sm90Engine(const MoeSpec& spec, const MoeWeights& weights, int device,
                       const Sm90Options& options)
    : spec_(spec),
      options_(options),
      weight_on_input_(spec.routing.weight_placement == RouterWeightPlacement::kInput),
      device_(device),
      elem_(spec.act_dtype) {
  spec.validate_or_throw();
  if (weight_on_input_) {  // the paths that read the caller's rows are off from here on
    options_.slice_one_token = false;
    options_.gather_in_fc1 = false;
    options_.token_rows = false;
  }
  const WeightFormat wf = spec.weights.format;
  const bool bf16 = spec.act_dtype == DType::kBFloat16 && wf == WeightFormat::kBF16;
  const bool fp16 = spec.act_dtype == DType::kFloat16 && wf == WeightFormat::kFP16;
  if (!bf16 && !fp16)
    throw Error(ErrorCode::kUnsupported,
                std::string("the sm90 engine runs bf16 or fp16 activations with weights of the "
                            "same type, not ") +
                    to_string(spec.act_dtype) + " activations with " + to_string(wf) + " weights");
  check_weights(spec, weights);
  lp_ = derive_local(spec);
  const int64_t H = lp_.hidden, I = lp_.intermediate, L = lp_.num_experts;
  const int64_t k = lp_.top_k, E = lp_.num_experts_global;
  if (H % 8 != 0 || I % 8 != 0)
    throw Error(ErrorCode::kUnsupported, "hidden " + std::to_string(H) +
                                             " and local intermediate " + std::to_string(I) +
                                             " must be multiples of 8 for the sm90 engine");
  const int64_t k_boxes = gemm::KSlices::boxes(I);
  if (options_.fc2_k_slices < 0 || options_.fc2_k_slices > k_boxes)
    throw Error(ErrorCode::kInvalidArgument,
                "fc2_k_slices " + std::to_string(options_.fc2_k_slices) + " is outside 0.." +
                    std::to_string(k_boxes) + " (0: the engine's pick; the intermediate " +
                    std::to_string(I) + " in boxes of " + std::to_string(gemm::KSlices::kBoxK) +
                    ")");
  const int64_t es = 2;  // bf16 / fp16
  const int64_t w1_bytes = L * lp_.fc1_rows * H * es, w2_bytes = L * H * I * es;
  check_expert_bytes(weights, w1_bytes, w2_bytes);
  const LayerBiases biases = check_biases(spec, lp_, weights);
  const bool fc1_bias = biases.fc1, fc2_bias = biases.fc2, routing_bias = biases.routing;

  check_routing_limits(spec, lp_, "sm90 engine");

  DeviceGuard guard(device_);

  // Weights: one allocation, uploaded once.
  Carver wsize;
  wsize.take<char>(w1_bytes);
  wsize.take<char>(w2_bytes);
  wsize.take<float>(fc1_bias ? L * lp_.fc1_rows : 0);
  wsize.take<float>(fc2_bias ? L * H : 0);
  wsize.take<float>(routing_bias ? E : 0);
  weight_memory_ = device_alloc(wsize.used(), "expert weights");
  Carver wc(static_cast<char*>(weight_memory_.get()));
  char* w1 = wc.take<char>(w1_bytes);
  char* w2 = wc.take<char>(w2_bytes);
  float* b1 = wc.take<float>(fc1_bias ? L * lp_.fc1_rows : 0);
  float* b2 = wc.take<float>(fc2_bias ? L * H : 0);
  float* rb = wc.take<float>(routing_bias ? E : 0);
  const bool gated = activation::is_gated(static_cast<activation::Kind>(spec.activation.kind));
  if (gated) {  // one expert at a time into the blocked order, so the host copy stays small
    const std::vector<int64_t> rows = activation::blocked_fc1_source_rows(spec.gate_up_layout, I);
    const int64_t expert_bytes = lp_.fc1_rows * H * es;
    std::vector<uint8_t> staged(static_cast<std::size_t>(expert_bytes));
    for (int64_t e = 0; e < L; ++e) {
      activation::gather_rows(rows, weights.fc1.values.data() + e * expert_bytes, staged.data(),
                              H * es);
      upload(w1 + e * expert_bytes, staged.data(), expert_bytes, "fc1 weights");
    }
    if (fc1_bias) {
      std::vector<float> bias(static_cast<std::size_t>(L * lp_.fc1_rows));
      for (int64_t e = 0; e < L; ++e)
        activation::gather_rows(rows, weights.fc1_bias.data() + e * lp_.fc1_rows,
                                bias.data() + e * lp_.fc1_rows, sizeof(float));
      upload(b1, bias.data(), sizeof(float) * bias.size(), "fc1 bias");
    }
  } else {
    upload(w1, weights.fc1.values.data(), w1_bytes, "fc1 weights");
    if (fc1_bias) upload(b1, weights.fc1_bias.data(), sizeof(float) * L * lp_.fc1_rows, "fc1 bias");
  }
  upload(w2, weights.fc2.values.data(), w2_bytes, "fc2 weights");
  if (fc2_bias) upload(b2, weights.fc2_bias.data(), sizeof(float) * L * H, "fc2 bias");
  if (routing_bias) upload(rb, weights.routing_bias.data(), sizeof(float) * E, "routing bias");
  w1_ = w1;
  w2_ = w2;

  // Stage configurations.
  pcfg_ = permute_config(spec, lp_, routing_bias ? rb : nullptr, H * es);
  const int64_t P = pcfg_.max_rows();

  act_.elem = elem_;
  act_.params = activation_params(spec.activation);
  act_.intermediate = I;
  act_.fc1_bias = fc1_bias ? b1 : nullptr;
  act_.local_experts = static_cast<int>(L);
  if (act_.fc1_rows() != lp_.fc1_rows)
    throw Error(ErrorCode::kInternal, "fc1 rows " + std::to_string(lp_.fc1_rows) +
                                          " do not match the activation's " +
                                          std::to_string(act_.fc1_rows()));

  fin_.elem = elem_;
  fin_.hidden = H;
  fin_.top_k = static_cast<int>(k);
  fin_.fc2_bias = fc2_bias ? b2 : nullptr;

  // Workspace: one allocation. The FC2 output reuses the gathered input (dead after FC1).
  const permute::BufferCounts n = permute::buffer_counts(pcfg_);
  auto carve = [&](Carver& c) {
    permute::Buffers b = carve_permute_buffers(c, n, L);
    slot_count_ = static_cast<std::size_t>(n.per_slot);
    permuted_bytes_ = static_cast<std::size_t>(std::max(n.permuted_bytes, P * H * es));
    b.permuted = c.take<char>(static_cast<int64_t>(permuted_bytes_));
    // Gated kinds never store FC1's raw output (every FC1 tactic has a "+act" kernel): that
    // saves P * 2I elements, 1.9 GB for mixtral at 16384 tokens.
    fc1_out_ = gated ? nullptr : c.take<char>(P * lp_.fc1_rows * es);
    act_out_bytes_ = static_cast<std::size_t>(P * I * es);
    act_out_ = c.take<char>(static_cast<int64_t>(act_out_bytes_));
    fc2_out_ = b.permuted;
    return b;
  };
  Carver sizing;
  carve(sizing);
  workspace_bytes_ = sizing.used();
  workspace_ = device_alloc(workspace_bytes_, "the MoE workspace");
  Carver cut(static_cast<char*>(workspace_.get()));
  pbuf_ = carve(cut);
  // Zeroed once, so that no kernel ever reads memory that was never written: the TMA GEMV's
  // boxes of 8 token rows may reach past the last row the permute wrote (read, never used;
  // GroupedGemm::run's contract). Each forward writes what it uses before reading it.
  check_cuda(cudaMemset(workspace_.get(), 0, workspace_bytes_), "clearing the MoE workspace");
  check_cuda(cudaMemset(pbuf_.error_word, 0xff, sizeof(unsigned long long)),
             "clearing the device error word");

  const gemm::Elem ge = bf16 ? gemm::Elem::kBF16 : gemm::Elem::kFP16;
  std::optional<gemm::EpilogueActivation> fc1_act;
  if (gated) fc1_act = gemm::EpilogueActivation{act_.params, act_.fc1_bias};
  fc1_ = std::make_unique<gemm::GroupedGemm>(
      gemm::GroupedShape{ge, static_cast<int>(L), lp_.fc1_rows, H, P}, device_, fc1_act);
  fc2_ = std::make_unique<gemm::GroupedGemm>(gemm::GroupedShape{ge, static_cast<int>(L), H, I, P},
                                             device_);

  // One token's sliced forward (GroupedGemm::sliced_tactic): its fp32 partials,
  // [min(k, L)][slices][H], in an allocation of their own, so that the workspace stays as it is
  // for layers that never slice.
  if (gated && options_.slice_one_token) slice_tactic_ = fc1_->sliced_tactic();
  int64_t partial_rows = 0;  // rows x slices
  if (!slice_tactic_.empty()) partial_rows = std::min(k, L) * fc1_->slices();
  // And chained decode's FC2 k slices, for every pick forward() can make.
  const int64_t chained_max =
      options_.chain_decode ? std::min<int64_t>(spec.max_tokens, gemm::GroupedGemm::kMaxTokenRows)
                            : 0;
  for (int64_t T = 1; T <= chained_max; ++T)
    for (const bool token_rows : {false, true}) {
      const int slices = fc2_k_slices(T, fc1_->pick_tactic(hint_of(T), true), token_rows);
      if (slices > 1) partial_rows = std::max<int64_t>(partial_rows, T * std::min(k, L) * slices);
    }
  if (partial_rows > 0) {
    partials_bytes_ = static_cast<std::size_t>(partial_rows * H) * sizeof(float);
    partials_memory_ = device_alloc(partials_bytes_, "the sliced kernels' partial sums");
    partials_ = static_cast<float*>(partials_memory_.get());
  }

  // Load every kernel forward() may launch, so its first call can be captured in a graph.
  throw_if_error(permute::prepare(pcfg_));
  if (weight_on_input_) throw_if_error(permute::prepare_apply_weights_to_rows(elem_));
  throw_if_error(activation::prepare_device(act_));
  throw_if_error(finalize::prepare(fin_));
  check_cuda(cudaDeviceSynchronize(), "finishing the engine's set-up");
}

bool Sm90Engine::forward_sliced(const ForwardArgs& args, permute::Inputs in, cudaStream_t stream) {
  if (!slices_one_token()) return false;
  // FC1 reads the caller's row from the permute's flag on: nothing is gathered.
  in.gather = false;
  throw_if_error(permute::run(pcfg_, pbuf_, 1, in, stream));
  gemm::GroupedGemm::GemmCall fc1{fc1_.get(), pbuf_.permuted, w1_, act_out_, slice_tactic_};
  fc1.offsets_flag = pbuf_.offsets_flag;
  fc1.one_row = args.hidden.data;
  fc1.rows_bound = std::min<int64_t>(lp_.top_k, lp_.num_experts);
  throw_if_error(gemm::GroupedGemm::launch_sliced(
      fc1, w2_, partials_, pbuf_.expert_done + lp_.num_experts, pbuf_.offsets, stream));
  throw_if_error(finalize::run_slices(fin_, 1, partials_, fc1_->slices(), pbuf_.slot_row,
                                      pbuf_.topk_weights, pbuf_.slot_expert, args.output.data,
                                      stream));
  return true;
}

void Sm90Engine::forward(const ForwardArgs& args) {
  const int64_t H = lp_.hidden, k = lp_.top_k;
  const int64_t T = check_forward_views(args, spec_, lp_, elem_, device_);
  if (T == 0) return;

  DeviceGuard guard(device_);
  cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
  if (options_.poison_gathered_rows)
    check_cuda(cudaMemsetAsync(pbuf_.permuted, 0xff, permuted_bytes_, stream),
               "poisoning the gathered rows");
  if (options_.poison_activations) {
    check_cuda(cudaMemsetAsync(act_out_, 0xff, act_out_bytes_, stream),
               "poisoning FC1's activated output");
    if (partials_ != nullptr)
      check_cuda(cudaMemsetAsync(partials_, 0xff, partials_bytes_, stream),
                 "poisoning the sliced kernel's partial sums");
  }
  if (options_.poison_slots) {
    for (void* p : {static_cast<void*>(pbuf_.slot_row), static_cast<void*>(pbuf_.topk_weights),
                    static_cast<void*>(pbuf_.slot_expert)})
      check_cuda(cudaMemsetAsync(p, 0xff, slot_count_ * 4, stream), "poisoning the slots");
  }
  permute::Inputs in = permute_inputs(args, spec_);
  const double hint = hint_of(T);
  if (T == 1 && forward_sliced(args, in, stream)) return;
  const int64_t rows = T * std::min<int64_t>(k, lp_.num_experts);
  // Decode with the TMA GEMV on both: one kernel, FC2's weights streaming while FC1 ends
  // (its per-expert counters were cleared by the permute). From 8 tokens on it gained 0.5-5 us;
  // at one token only where FC1 has many items (GroupedGemm::chains_one_token).
  const bool chain = chains(T);
  const std::string fc1_picked = tuned_or(Gemm::kFc1, T, chain, fc1_->pick_tactic(hint, chain));
  // Past the single-block permute, FC1 reads the tokens' rows by index where its tactic has a
  // gathering variant: the permute then writes each row's token, not the row.
  const std::string fc1_gathering = options_.gather_in_fc1 && !permute::single_block_path(T)
                                        ? fc1_->gathering_tactic(fc1_picked)
                                        : std::string();
  const bool gathering = !fc1_gathering.empty();
  const std::string& fc1_tactic = gathering ? fc1_gathering : fc1_picked;
  // From two tokens up to the GEMV's 8 token columns, the chained FC1 reads the tokens' own rows
  // where that pays (GroupedGemm::token_rows_pay), and nothing is gathered. The chained kernel
  // starts at the permute's flag, its stores after one PDL wait per consumer warp: the flag comes
  // 1-1.6 us before the permute's end lets a waiting kernel go (qwen3 T=8, timestamps whose own
  // L2 loads add up to ~0.5 us), and starting there gained qwen3 T=2 / 4 0.3-0.4 us, even at
  // T=8 and on mixtral (3 rounds; a wait per FC1 chunk instead was slower).
  const bool token_rows = options_.token_rows && chain && T >= 2 &&
                          T <= gemm::GroupedGemm::kMaxTokenRows && fc1_->token_rows_pay(fc1_tactic);
  in.gather = !token_rows && !gathering;
  // FC1 may start at the permute's flag (see below) where its kernel reads the offsets itself;
  // elsewhere (CUTLASS) the permute leaves the flag alone: its fences would only delay FC1.
  const permute::OffsetsFinal ready =
      permute::offsets_final_for_next_kernel(pcfg_, T, permute::Path::kAuto, in.gather);
  const bool at_flag = ready == permute::OffsetsFinal::kAtFlag && !weight_on_input_ &&
                       fc1_->reads_row_offsets(fc1_tactic);
  permute::Buffers buffers = pbuf_;
  if (!at_flag) buffers.offsets_flag = nullptr;
  throw_if_error(permute::run(pcfg_, buffers, T, in, stream));
  // Weight on the input: the gathered rows are scaled and their weights set to 1 by a kernel that
  // waits for the permute's end, so the offsets are final when FC1 starts, and FC1 reads the
  // rows after its own wait (permute::apply_weights_to_rows).
  if (weight_on_input_)
    throw_if_error(permute::apply_weights_to_rows(pcfg_, pbuf_, T, elem_, stream));
  // For gated kinds FC1's "+act" kernel writes the activation itself; both GEMMs' per-group
  // arrays come from one kernel (they share the offsets).
  using Call = gemm::GroupedGemm::GemmCall;
  const bool fused = fc1_->applies_activation(fc1_tactic);
  if (!fused && fc1_out_ == nullptr)
    throw Error(ErrorCode::kInternal, "FC1 tactic " + fc1_tactic +
                                          " does not apply the gated activation and no buffer "
                                          "holds its raw output");
  // FC2's offsets are final before it starts (FC1 lets it start after its own wait): it may
  // read them before its PDL wait. So may FC1 where the permute's last kernel is not their
  // writer, or else once the permute's flag says they are written; either way it starts on its
  // weights before the gather ends.
  Call fc1_call{fc1_.get(), gathering ? args.hidden.data : pbuf_.permuted, w1_,
                fused ? act_out_ : fc1_out_, fc1_tactic};
  if (gathering) fc1_call.row_source = pbuf_.row_token;
  fc1_call.offsets_ready = weight_on_input_ || ready == permute::OffsetsFinal::kAtItsStart;
  if (at_flag) fc1_call.offsets_flag = pbuf_.offsets_flag;
  // One token: each of its experts' rows is the caller's hidden row, which the permute only
  // reads (and it touches none of FC1's outputs), so the TMA GEMV streams from it at the flag
  // instead of waiting for the permute's gather and its end; chained as well.
  if (T == 1 && !weight_on_input_) fc1_call.one_row = args.hidden.data;
  if (token_rows)
    fc1_call.token_rows = gemm::TokenRows{args.hidden.data, static_cast<int>(T),
                                          static_cast<int>(k), pbuf_.slot_expert, pbuf_.slot_row};
  const std::string fc2_tactic = tuned_or(Gemm::kFc2, T, chain, fc2_->pick_tactic(hint, chain));
  Call fc2_call{fc2_.get(), act_out_, w2_, fc2_out_, fc2_tactic, true};
  // Two TMA GEMVs take their items from counters the permute cleared, where their blocks take
  // more than one: deepseek T=1 -1.2 to -1.8 us (forward A/B; others even).
  if (!chain && permute::clears_expert_done(T)) {
    fc1_call.item_counter = pbuf_.expert_done + lp_.num_experts;
    fc2_call.item_counter = pbuf_.expert_done + lp_.num_experts + 1;
  }
  // Their grids for this run's rows, not max_tokens' (GemmCall::rows_bound).
  fc1_call.rows_bound = fc2_call.rows_bound = rows;
  const Call calls[2] = {fc1_call, fc2_call};
  throw_if_error(gemm::GroupedGemm::write_problems(calls, 2, pbuf_.offsets, stream));
  Status chained(ErrorCode::kUnsupported, "not tried");
  // Chained, FC2 may split its items along k (Sm90Options::fc2_k_slices), its sums then added
  // by the finalize.
  Call fc2_chained = calls[1];
  int k_slices = chain ? fc2_k_slices(T, fc1_tactic, token_rows) : 1;
  // The partials were sized for the picks the constructor foresaw; none other writes them.
  if (static_cast<std::size_t>(rows * k_slices * H) * sizeof(float) > partials_bytes_) k_slices = 1;
  const bool k_sliced = k_slices > 1;
  if (k_sliced) fc2_chained.k_slices = gemm::KSlices{partials_, k_slices};
  if (chain && fused)
    chained = gemm::GroupedGemm::launch_chained(calls[0], fc2_chained, pbuf_.offsets,
                                                pbuf_.expert_done, stream);
  if (chained.code() != ErrorCode::kUnsupported) {
    throw_if_error(chained);
    if (k_sliced) {  // the slots were written by the permute, before the chained kernel
      throw_if_error(finalize::run_slices(fin_, T, partials_, k_slices, pbuf_.slot_row,
                                          pbuf_.topk_weights, pbuf_.slot_expert, args.output.data,
                                          stream));
      return;
    }
  } else if (token_rows) {  // token_rows_pay said it would chain: nothing was gathered
    throw Error(ErrorCode::kInternal,
                "FC1 tactic " + fc1_tactic + " does not chain with FC2's: " + chained.message());
  } else {
    throw_if_error(fc1_->launch(calls[0], pbuf_.offsets, stream));
    if (!fused)
      throw_if_error(activation::run_device(act_, fc1_out_, act_out_, pbuf_.row_expert,
                                            pbuf_.offsets, rows, stream));
    throw_if_error(fc2_->launch(calls[1], pbuf_.offsets, stream));
  }
  // The slots were written by the permute, before FC1 and FC2.
  throw_if_error(finalize::run(fin_, T, fc2_out_, pbuf_.slot_row, pbuf_.topk_weights,
                               pbuf_.slot_expert, args.output.data, stream, true));
}

std::vector<std::string> Sm90Engine::tactics(Gemm gemm) const {
  // What forward() can run in that GEMM's place: gated FC1 only its "+act" kernels (no buffer
  // holds FC1's raw output), the others only plain ones; never the gathering variants, which
  // forward() derives from the pick itself (gathering_tactic).
  const gemm::GroupedGemm& g = gemm == Gemm::kFc1 ? *fc1_ : *fc2_;
  const bool want_act = gemm == Gemm::kFc1 && fc1_out_ == nullptr;
  std::vector<std::string> names;
  for (const std::string& t : g.tactics())
    if (g.applies_activation(t) == want_act && t.find(".gather") == std::string::npos)
      names.push_back(t);
  return names;
}

Status Sm90Engine::poll_errors() {
  DeviceGuard guard(device_);
  return poll_permute_errors(pbuf_, lp_);
}

}  // namespace

std::unique_ptr<Engine> make_sm90_engine(const MoeSpec& spec, const MoeWeights& weights, int device,
                                         const Sm90Options& options) {
  return std::make_unique<Sm90Engine>(spec, weights, device, options);
}

}  // namespace moekit::pipeline
