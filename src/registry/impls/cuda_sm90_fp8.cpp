// cuda.sm90.cutlass.fp8: the Hopper FP8 engine for per-tensor fp8 weights (W8A8: e4m3 with one
// weight and one static input scale per expert) with bf16 activations, quantized to e4m3 inside the
// forward. Its capability builds in every configuration, so a CUDA-less build still explains why it
// cannot run.
#include "registry/impls/impls.hpp"
#include "registry/impls/sm90_cutlass.hpp"

namespace moekit::registry::impls {

const Implementation& cuda_sm90_cutlass_fp8() {
  static const Sm90CutlassImpl impl("cuda.sm90.cutlass.fp8", WeightFormat::kFP8PerTensor,
                                    {DType::kBFloat16});
  return impl;
}

}  // namespace moekit::registry::impls
