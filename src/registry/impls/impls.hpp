// The implementations of the priority table (registry.cpp lists them explicitly, so there is no
// static-initialisation-order dependency), and the bridge to the Hopper engine.
#pragma once
#include <memory>
#include <vector>

#include "moekit/registry.hpp"

namespace moekit::registry::impls {

// What every engine of the library supports today (capability lists shared by the impls).
std::vector<WeightFormat> all_weight_formats();
std::vector<DType> all_act_dtypes();
std::vector<ActivationKind> all_activations();
std::vector<RoutingMethod> all_routings();

const Implementation& cpu_reference();
const Implementation& cuda_sm90_cutlass_bf16();
const Implementation& cuda_sm90_cutlass_fp16();
const Implementation& cuda_sm90_cutlass_fp8_block128();
const Implementation& cuda_sm90_cutlass_fp8();
const Implementation& cuda_sm90_cutlass_int4_group();
const Implementation& cuda_sm90_cutlass_int8_group();
const Implementation& cuda_sm90_mx_mxfp4();
const Implementation& cuda_sm90_mx_nvfp4();
const Implementation& cuda_sm90_mx_mxfp8();

// pipeline::make_sm90_engine in CUDA builds (sm90_engine_cuda.cpp); a CUDA-less build throws
// Error(kUnsupported) (sm90_engine_nocuda.cpp). The resolver rejects those implementations in
// such a build (stage build) long before this is reached.
std::unique_ptr<Engine> create_sm90_engine(const MoeSpec& spec, const MoeWeights& weights,
                                           int device);
// The same for pipeline::make_sm90_fp8_engine (the fp8 formats).
std::unique_ptr<Engine> create_sm90_fp8_engine(const MoeSpec& spec, const MoeWeights& weights,
                                               int device);
// The same for pipeline::make_sm90_int_engine (the int group formats).
std::unique_ptr<Engine> create_sm90_int_engine(const MoeSpec& spec, const MoeWeights& weights,
                                               int device);
// The same for pipeline::make_sm90_mx_engine (the microscaling formats).
std::unique_ptr<Engine> create_sm90_mx_engine(const MoeSpec& spec, const MoeWeights& weights,
                                              int device);

}  // namespace moekit::registry::impls
