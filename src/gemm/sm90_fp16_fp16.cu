// Hopper grouped GEMM tactics for fp16 activations and fp16 weights (fp32 accumulate, fp16 out).
#include "gemm/sm90_grouped.cuh"

namespace moekit::gemm::detail {

std::vector<TacticEntry> sm90_fp16_fp16_tactics() {
  return sm90_grouped_tactics<cutlass::half_t>();
}

}  // namespace moekit::gemm::detail
