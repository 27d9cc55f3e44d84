// cuda.sm90.mx.mxfp4, .nvfp4 and .mxfp8: the Hopper microscaling engine
// (pipeline/sm90_mx_engine.hpp) for gpt-oss's MXFP4 experts (e2m1, an e8m0 scale per 32),
// ModelOpt's NVFP4 (e2m1, an e4m3 scale per 16, an fp32 global scale) and MXFP8 (e4m3, an e8m0
// scale per 32), bf16 or fp16 activations. Their capabilities build in every configuration, so
// a CUDA-less build still explains why they cannot run.
#include "registry/impls/impls.hpp"
#include "registry/impls/sm90_cutlass.hpp"

namespace moekit::registry::impls {

const Implementation& cuda_sm90_mx_mxfp4() {
  static const Sm90CutlassImpl impl("cuda.sm90.mx.mxfp4", WeightFormat::kMXFP4,
                                    {DType::kBFloat16, DType::kFloat16}, "mx");
  return impl;
}

const Implementation& cuda_sm90_mx_nvfp4() {
  static const Sm90CutlassImpl impl("cuda.sm90.mx.nvfp4", WeightFormat::kNVFP4,
                                    {DType::kBFloat16, DType::kFloat16}, "mx");
  return impl;
}

const Implementation& cuda_sm90_mx_mxfp8() {
  static const Sm90CutlassImpl impl("cuda.sm90.mx.mxfp8", WeightFormat::kMXFP8,
                                    {DType::kBFloat16, DType::kFloat16}, "mx");
  return impl;
}

}  // namespace moekit::registry::impls
