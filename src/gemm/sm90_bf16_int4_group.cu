// bf16 activations x int4 group-scaled weights: IntGroupedGemm's CUTLASS tactics
// (sm90_mixed_grouped.cuh), one translation unit per (activation type, weight width) to keep
// the template cost of each bounded.
#include "gemm/sm90_mixed_grouped.cuh"

namespace moekit::gemm::int_detail {

std::vector<IntTacticEntry> sm90_bf16_int4_group_tactics() {
  return mixed::mixed_tactics<cutlass::bfloat16_t, cutlass::int4b_t>();
}

}  // namespace moekit::gemm::int_detail
