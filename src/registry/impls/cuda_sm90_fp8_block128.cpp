// cuda.sm90.cutlass.fp8_block128: the Hopper FP8 engine for DeepSeek-V3-style block-scaled fp8
// weights (e4m3, one fp32 scale per 128x128 block) with bf16 activations, quantized to e4m3 inside
// the forward. Its capability builds in every configuration, so a CUDA-less build still explains
// why it cannot run.
#include "registry/impls/impls.hpp"
#include "registry/impls/sm90_cutlass.hpp"

namespace moekit::registry::impls {

const Implementation& cuda_sm90_cutlass_fp8_block128() {
  static const Sm90CutlassImpl impl("cuda.sm90.cutlass.fp8_block128", WeightFormat::kFP8Block128,
                                    {DType::kBFloat16});
  return impl;
}

}  // namespace moekit::registry::impls
