// The forward that the weight-only engines (sm90_int_engine.cu: int4 / int8 group;
// sm90_mx_engine.cu: MXFP4, NVFP4, MXFP8) share: bf16 or fp16 activations in and out, the weights
// converted inside the GEMMs, so the chain is the BF16 engine's around two grouped GEMMs of type G
// (gemm::IntGroupedGemm, gemm::MxGroupedGemm):
//   permute (route + count + scan + permute + gather) [-> routing weights on the rows]
//   [-> FC1's pre-quant scale] -> FC1 (bias inside) -> activation [-> FC2's pre-quant scale]
//   -> FC2 -> finalize (FC2's bias, the weighted sum over top-k).
// The engine's constructor fills the protected members: its weights (weight_memory_), the
// GEMMs, their calls' weight operands (fc1_call_ / fc2_call_: everything but the rows, D, the
// tactic and the row hints), the stage configurations and the workspace pieces.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "activation/activation_device.hpp"
#include "finalize/finalize.hpp"
#include "permute/permute.hpp"
#include "pipeline/engine_support.hpp"

namespace moekit::pipeline {

template <class G>
class WeightOnlyEngine : public TwoGemmEngine<G> {
 public:
  void forward(const ForwardArgs& args) override {
    const int64_t T = check_forward_views(args, spec_, this->lp_, elem_, this->device_);
    if (T == 0) return;
    DeviceGuard guard(this->device_);
    cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
    const permute::Buffers& b = this->pbuf_;
    if (poison_) this->poison_workspace(stream);  // the gathered rows .. the engine's last piece
    throw_if_error(permute::run(pcfg_, b, T, permute_inputs(args, spec_), stream));
    // The reference's order on FC1's input: the routing weight (kInput), then the pre-quant
    // scale, each product rounded to the activation type.
    if (weight_on_input_)
      throw_if_error(permute::apply_weights_to_rows(pcfg_, b, T, elem_, stream));
    const int64_t rows = this->rows_bound(T);
    if (cs1_.scales != nullptr)
      throw_if_error(permute::apply_column_scales(cs1_, b.permuted, rows, stream));
    if (mx1_.offsets != nullptr)
      throw_if_error(permute::round_rows_to_mxfp8(mx1_, b.permuted, rows, stream));
    typename G::Call fc1 = fc1_call_;
    fc1.a = b.permuted;
    fc1.d = fc1_out_;
    fc1.tactic = tactic_for(Gemm::kFc1, T);
    fc1.rows_per_group_hint = this->rows_hint(T);
    fc1.rows_bound = rows;
    throw_if_error(this->fc1_->run(fc1, b.offsets, stream));
    throw_if_error(
        activation::run_device(act_, fc1_out_, act_out_, b.row_expert, b.offsets, rows, stream));
    if (cs2_.scales != nullptr)
      throw_if_error(permute::apply_column_scales(cs2_, act_out_, rows, stream));
    if (mx2_.offsets != nullptr)
      throw_if_error(permute::round_rows_to_mxfp8(mx2_, act_out_, rows, stream));
    typename G::Call fc2 = fc2_call_;
    fc2.a = act_out_;
    fc2.d = fc2_out_;
    fc2.tactic = tactic_for(Gemm::kFc2, T);
    fc2.rows_per_group_hint = fc1.rows_per_group_hint;
    fc2.rows_bound = rows;
    throw_if_error(this->fc2_->run(fc2, b.offsets, stream));
    // The slots were final (weights included) before FC2 started.
    throw_if_error(finalize::run(fin_, T, fc2_out_, b.slot_row, b.topk_weights, b.slot_expert,
                                 args.output.data, stream, true));
  }

 protected:
  WeightOnlyEngine(const MoeSpec& spec, int device, bool poison, std::string force_tactic)
      : TwoGemmEngine<G>(device),
        spec_(spec),
        elem_(spec.act_dtype),
        weight_on_input_(spec.routing.weight_placement == RouterWeightPlacement::kInput),
        poison_(poison),
        force_tactic_(std::move(force_tactic)) {}

  // The stage configurations: the permute (rows of H elements of the activation type), the
  // activation (FC1's bias is its GEMM's, added before the one rounding), the finalize (FC2's
  // bias, or null). Returns the most rows the permute fills (P).
  int64_t configure_stages(const float* routing_bias, const float* fc2_bias) {
    const LocalProblem& lp = this->lp_;
    pcfg_ = permute_config(spec_, lp, routing_bias, lp.hidden * kElemBytes);
    act_.elem = elem_;
    act_.params = activation_params(spec_.activation);
    act_.intermediate = lp.intermediate;
    act_.fc1_bias = nullptr;
    act_.local_experts = static_cast<int>(lp.num_experts);
    if (act_.fc1_rows() != lp.fc1_rows)
      throw Error(ErrorCode::kInternal, "fc1 rows " + std::to_string(lp.fc1_rows) +
                                            " do not match the activation's " +
                                            std::to_string(act_.fc1_rows()));
    fin_.elem = elem_;
    fin_.hidden = lp.hidden;
    fin_.top_k = static_cast<int>(lp.top_k);
    fin_.fc2_bias = fc2_bias;
    return pcfg_.max_rows();
  }
  // The workspace, one allocation: the permute's buffers, then the span the poison hook fills:
  // the gathered rows (which FC2's output shares: they are dead after FC1), FC1's output, the
  // activations and `staging_bytes` for the GEMMs (returned; null where 0).
  float* allocate_stage_buffers(std::size_t staging_bytes) {
    const LocalProblem& lp = this->lp_;
    const int64_t P = pcfg_.max_rows(), H = lp.hidden;
    const permute::BufferCounts n = permute::buffer_counts(pcfg_);
    float* staging = nullptr;
    auto carve = [&](Carver& c) {
      permute::Buffers b = carve_permute_buffers(c, n, lp.num_experts);
      b.expert_done = nullptr;   // no GEMV counts or hands out items here
      b.offsets_flag = nullptr;  // nor starts at the permute's flag
      const std::size_t poison_at = c.used();
      b.permuted = c.take<char>(std::max(n.permuted_bytes, P * H * kElemBytes));
      fc1_out_ = c.take<char>(P * lp.fc1_rows * kElemBytes);
      act_out_ = c.take<char>(P * lp.intermediate * kElemBytes);
      fc2_out_ = b.permuted;
      staging = c.take<float>(static_cast<int64_t>(staging_bytes / sizeof(float)));
      return std::make_pair(b, poison_at);
    };
    this->allocate_workspace(carve);
    return staging_bytes > 0 ? staging : nullptr;
  }

  // The test hook's tactic, else the tuning file's, else empty (G::run picks).
  std::string tactic_for(Gemm gemm, int64_t T) const {
    return force_tactic_.empty() ? this->tuned(gemm, T) : force_tactic_;
  }
  // Loads every kernel forward() may launch besides the GEMMs' (so that its first call can be
  // captured in a graph), checks that a forced tactic exists in both GEMMs, and waits for the
  // set-up's copies: the constructor's last step.
  void prepare_stages() {
    throw_if_error(permute::prepare(pcfg_));
    if (weight_on_input_) throw_if_error(permute::prepare_apply_weights_to_rows(elem_));
    for (const permute::ColumnScales* cs : {&cs1_, &cs2_})
      if (cs->scales != nullptr) throw_if_error(permute::prepare_apply_column_scales(*cs));
    for (const permute::Mxfp8Rows* mx : {&mx1_, &mx2_})
      if (mx->offsets != nullptr) throw_if_error(permute::prepare_round_rows_to_mxfp8(*mx));
    throw_if_error(activation::prepare_device(act_));
    throw_if_error(finalize::prepare(fin_));
    if (!force_tactic_.empty())
      for (const G* gm : {this->fc1_.get(), this->fc2_.get()}) {
        const std::vector<std::string> names = gm->tactics();
        if (std::find(names.begin(), names.end(), force_tactic_) == names.end())
          throw Error(ErrorCode::kNotFound, "forced tactic \"" + force_tactic_ + "\" is not built");
      }
    check_cuda(cudaDeviceSynchronize(), "finishing the engine's set-up");
  }

  MoeSpec spec_;
  DeviceMemory weight_memory_;  // the engine's weights, one allocation
  DType elem_;
  bool weight_on_input_;
  bool poison_;
  std::string force_tactic_;
  permute::Config pcfg_;
  permute::ColumnScales cs1_, cs2_;  // the pre-quant scales' products (scales null: none)
  permute::Mxfp8Rows mx1_, mx2_;     // MXFP8's rounding of FC1's / FC2's input (offsets null: none)
  activation::DeviceActivation act_;
  finalize::DeviceFinalize fin_;
  typename G::Call fc1_call_, fc2_call_;
  void* fc1_out_ = nullptr;  // [P, fc1_rows]
  void* act_out_ = nullptr;  // [P, I]
  void* fc2_out_ = nullptr;  // [P, H]

 private:
  static constexpr int64_t kElemBytes = 2;  // bf16 / fp16
};

}  // namespace moekit::pipeline
