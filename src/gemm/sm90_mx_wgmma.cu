// MxGroupedGemm's tensor-core tactic (mx_grouped_gemm.hpp) for prefill: `sm90.<format>.wgmma.n<N>`,
// bf16 activations, k a multiple of 64: the decoded-weight wgmma kernel (sm90_decoded_wgmma.cuh)
// with the microscaling decoder (sm90_mx_wgmma_decoder.cuh: each weight a bf16 exactly times its
// block's scale). fp16 activations keep the GEMV: fp16's range does not hold the scaled weights.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gemm/mx_tactic.hpp"
#include "gemm/sm90_decoded_wgmma.cuh"
#include "gemm/sm90_mx_wgmma_decoder.cuh"

namespace moekit::gemm::mx_detail {
namespace {

using gemm::detail::MxDecArgs;
using gemm::detail::MxDecoder;

template <WeightFormat F, int N>
class MxWgmmaTactic final : public MxTactic {
 public:
  static std::string name() {
    return std::string("sm90.") + to_string(F) + ".wgmma.n" + std::to_string(N);
  }
  Status init(const MxGroupedShape& s, int sm_count) override {
    const std::string what = "tactic " + name() + " (groups " + std::to_string(s.groups) + ", n " +
                             std::to_string(s.n) + ", k " + std::to_string(s.k) + ")";
    return kernel_.init(what, s.groups, s.n, s.k, s.max_rows, sm_count);
  }
  Status run(const MxProblem& p, cudaStream_t stream) override {
    return kernel_.run(p.a, p.w, p.row_offsets, p.bias, p.d, MxDecArgs{p.scales, p.global_scales},
                       p.rows_bound, stream);
  }

 private:
  gemm::detail::DecodedWgmma<MxDecoder<F>, N> kernel_;
};

template <WeightFormat F, int N>
MxTacticEntry wgmma_entry() {
  using Tactic = MxWgmmaTactic<F, N>;
  return MxTacticEntry{Tactic::name(),
                       []() -> std::unique_ptr<MxTactic> { return std::make_unique<Tactic>(); }};
}

// 128 tokens per tile, and (not in the one-tactic build) 64 for experts of fewer rows.
template <WeightFormat F>
std::vector<MxTacticEntry> wgmma_list() {
  std::vector<MxTacticEntry> v = {wgmma_entry<F, 128>()};
#if !defined(MOEKIT_ONE_TACTIC)
  v.push_back(wgmma_entry<F, 64>());
#endif
  return v;
}

}  // namespace

std::vector<MxTacticEntry> sm90_mx_wgmma_tactics(const MxGroupedShape& s) {
  if (s.elem != DType::kBFloat16 || s.k % gemm::detail::decoded_wgmma::kBoxK != 0) return {};
  switch (s.format) {
    case WeightFormat::kMXFP4:
      return wgmma_list<WeightFormat::kMXFP4>();
    case WeightFormat::kNVFP4:
      return wgmma_list<WeightFormat::kNVFP4>();
    case WeightFormat::kMXFP8:
      return wgmma_list<WeightFormat::kMXFP8>();
    default:
      return {};
  }
}

}  // namespace moekit::gemm::mx_detail
