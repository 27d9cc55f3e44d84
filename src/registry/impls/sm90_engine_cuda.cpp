// CUDA builds: the cuda.sm90.* implementations build their engine in src/pipeline.
#include "pipeline/sm90_engine.hpp"
#include "pipeline/sm90_fp8_engine.hpp"
#include "pipeline/sm90_int_engine.hpp"
#include "pipeline/sm90_mx_engine.hpp"
#include "registry/impls/impls.hpp"

namespace moekit::registry::impls {

std::unique_ptr<Engine> create_sm90_engine(const MoeSpec& spec, const MoeWeights& weights,
                                           int device) {
  return pipeline::make_sm90_engine(spec, weights, device);
}

std::unique_ptr<Engine> create_sm90_fp8_engine(const MoeSpec& spec, const MoeWeights& weights,
                                               int device) {
  return pipeline::make_sm90_fp8_engine(spec, weights, device);
}

std::unique_ptr<Engine> create_sm90_int_engine(const MoeSpec& spec, const MoeWeights& weights,
                                               int device) {
  return pipeline::make_sm90_int_engine(spec, weights, device);
}

std::unique_ptr<Engine> create_sm90_mx_engine(const MoeSpec& spec, const MoeWeights& weights,
                                              int device) {
  return pipeline::make_sm90_mx_engine(spec, weights, device);
}

}  // namespace moekit::registry::impls
