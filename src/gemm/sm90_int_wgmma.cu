// IntGroupedGemm's tensor-core tactic of our own (int_grouped_gemm.hpp): `sm90.int4.wgmma.n<N>`
// and `sm90.int8.wgmma.n<N>`, bf16 activations, k a multiple of 64, any group size (32, 64, 128):
// the decoded-weight wgmma kernel (sm90_decoded_wgmma.cuh) with the int decoder
// (sm90_int_wgmma_decoder.cuh: each weight the reference's fp32 one rounded once to bf16); the
// sums are fp32, the bias added before the one rounding of D. It writes D itself, zero points
// included (no fp32 staging, no finish kernel).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gemm/int_tactic.hpp"
#include "gemm/sm90_decoded_wgmma.cuh"
#include "gemm/sm90_int_wgmma_decoder.cuh"

namespace moekit::gemm::int_detail {
namespace {

using gemm::detail::IntDecArgs;
using gemm::detail::IntDecoder;

template <int kBits, bool kZero, int N>
class IntWgmmaTactic final : public IntTactic {
 public:
  static std::string name() {
    return "sm90.int" + std::to_string(kBits) + ".wgmma.n" + std::to_string(N);
  }
  Status init(const IntGroupedShape& s, int, int sm_count) override {
    group_size_ = s.group_size;
    const std::string what = "tactic " + name() + " (groups " + std::to_string(s.groups) + ", n " +
                             std::to_string(s.n) + ", k " + std::to_string(s.k) + ")";
    return kernel_.init(what, s.groups, s.n, s.k, s.max_rows, sm_count);
  }
  Status run(const IntProblem& p, cudaStream_t stream) override {
    return kernel_.run(p.a, p.w, p.row_offsets, p.bias, p.d,
                       IntDecArgs{p.scales, kZero ? p.zeros : nullptr, group_size_}, p.rows_bound,
                       stream);
  }
  std::size_t workspace_bytes() const override { return 0; }

 private:
  int group_size_ = 0;
  gemm::detail::DecodedWgmma<IntDecoder<kBits, kZero>, N> kernel_;
};

template <int kBits, bool kZero, int N>
IntTacticEntry wgmma_entry() {
  using Tactic = IntWgmmaTactic<kBits, kZero, N>;
  return IntTacticEntry{Tactic::name(), true, false,
                        []() -> std::unique_ptr<IntTactic> { return std::make_unique<Tactic>(); }};
}

// 128 tokens per tile, and (not in the one-tactic build) 64 for experts of fewer rows.
template <int kBits, bool kZero>
std::vector<IntTacticEntry> wgmma_list() {
  std::vector<IntTacticEntry> v = {wgmma_entry<kBits, kZero, 128>()};
#if !defined(MOEKIT_ONE_TACTIC)
  v.push_back(wgmma_entry<kBits, kZero, 64>());
#endif
  return v;
}

}  // namespace

std::vector<IntTacticEntry> sm90_int_wgmma_tactics(const IntGroupedShape& s) {
  if (s.elem != DType::kBFloat16 || s.k % gemm::detail::decoded_wgmma::kBoxK != 0) return {};
  if (s.bits == 4) return s.zero_points ? wgmma_list<4, true>() : wgmma_list<4, false>();
  return s.zero_points ? wgmma_list<8, true>() : wgmma_list<8, false>();
}

}  // namespace moekit::gemm::int_detail
