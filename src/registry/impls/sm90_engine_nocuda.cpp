// CUDA-less builds keep the cuda.sm90.* declarations (so the resolver can say "this
// build has no CUDA") but have no engine to build.
#include "moekit/status.hpp"
#include "registry/impls/impls.hpp"

namespace moekit::registry::impls {

namespace {
[[noreturn]] void no_cuda() {
  throw Error(
      ErrorCode::kUnsupported,
      "the cuda.sm90 implementations cannot build an engine: this build has no CUDA (configured "
      "with "
      "MOEKIT_CUDA=OFF).");
}
}  // namespace

std::unique_ptr<Engine> create_sm90_engine(const MoeSpec&, const MoeWeights&, int) { no_cuda(); }
std::unique_ptr<Engine> create_sm90_fp8_engine(const MoeSpec&, const MoeWeights&, int) {
  no_cuda();
}
std::unique_ptr<Engine> create_sm90_int_engine(const MoeSpec&, const MoeWeights&, int) {
  no_cuda();
}
std::unique_ptr<Engine> create_sm90_mx_engine(const MoeSpec&, const MoeWeights&, int) { no_cuda(); }

}  // namespace moekit::registry::impls
