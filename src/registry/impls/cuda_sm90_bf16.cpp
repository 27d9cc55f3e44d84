// cuda.sm90.cutlass.bf16: the Hopper engine for bf16 weights with bf16 activations. Its capability
// builds in every configuration, so a CUDA-less build still explains why it cannot run.
#include "registry/impls/impls.hpp"
#include "registry/impls/sm90_cutlass.hpp"

namespace moekit::registry::impls {

const Implementation& cuda_sm90_cutlass_bf16() {
  static const Sm90CutlassImpl impl("cuda.sm90.cutlass.bf16", WeightFormat::kBF16,
                                    {DType::kBFloat16});
  return impl;
}

}  // namespace moekit::registry::impls
