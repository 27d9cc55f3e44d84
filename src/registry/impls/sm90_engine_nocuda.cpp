// CUDA-less builds keep the cuda.sm90.cutlass.* declarations (so the resolver can say "this
// build has no CUDA") but have no engine to build.
#include "moekit/status.hpp"
#include "registry/impls/impls.hpp"

namespace moekit::registry::impls {

std::unique_ptr<Engine> create_sm90_engine(const MoeSpec&, const MoeWeights&, int) {
  throw Error(ErrorCode::kUnsupported,
              "cuda.sm90.cutlass cannot build an engine: this build has no CUDA (configured with "
              "MOEKIT_CUDA=OFF).");
}

}  // namespace moekit::registry::impls
