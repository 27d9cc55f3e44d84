// Hopper grouped GEMM tactics for bf16 activations and bf16 weights (fp32 accumulate, bf16 out).
#include "gemm/sm90_grouped.cuh"

namespace moekit::gemm::detail {

std::vector<TacticEntry> sm90_bf16_bf16_tactics() {
  return sm90_grouped_tactics<cutlass::bfloat16_t>();
}

}  // namespace moekit::gemm::detail
