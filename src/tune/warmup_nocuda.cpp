// CUDA-less builds: no device engine exists, so nothing asks to warm one.
#include "moekit/status.hpp"
#include "tune/warmup.hpp"

namespace moekit::tune {

void warm_up_device_engine(Engine&, const MoeSpec&, int) {
  throw Error(ErrorCode::kUnsupported,
              "warming a device engine needs CUDA: this build has none (MOEKIT_CUDA=OFF)");
}

}  // namespace moekit::tune
