// cuda.sm90.cutlass.int8_group: the Hopper W8A16 engine for int8 weights with fp32 group scales
// along K (groups of 32, 64 or 128; optional zero points and AWQ pre-quant scale) and bf16 or fp16
// activations. Its capability builds in every configuration, so a CUDA-less build still
// explains why it cannot run.
#include "registry/impls/impls.hpp"
#include "registry/impls/sm90_cutlass.hpp"

namespace moekit::registry::impls {

const Implementation& cuda_sm90_cutlass_int8_group() {
  static const Sm90CutlassImpl impl("cuda.sm90.cutlass.int8_group", WeightFormat::kInt8Group,
                                    {DType::kBFloat16, DType::kFloat16});
  return impl;
}

}  // namespace moekit::registry::impls
