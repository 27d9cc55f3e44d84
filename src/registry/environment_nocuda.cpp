// A build without CUDA probes nothing: it cannot use a GPU, so it reports none and says why.
#include "moekit/environment.hpp"
#include "registry/registry_internal.hpp"

namespace moekit::registry {

Environment probe_environment() {
  Environment env = Environment::cpu_only();
  env.probe_note = "this build has no CUDA (configured with MOEKIT_CUDA=OFF), so no GPU was probed";
  return env;
}

}  // namespace moekit::registry
