// cuda.sm90.cutlass.fp16: the Hopper engine for fp16 weights with fp16 activations.
#include "registry/impls/impls.hpp"
#include "registry/impls/sm90_cutlass.hpp"

namespace moekit::registry::impls {

const Implementation& cuda_sm90_cutlass_fp16() {
  static const Sm90CutlassImpl impl("cuda.sm90.cutlass.fp16", WeightFormat::kFP16,
                                    {DType::kFloat16});
  return impl;
}

}  // namespace moekit::registry::impls
