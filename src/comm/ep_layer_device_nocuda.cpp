// Builds without CUDA have no device path: EpLayer::create never reaches it, since the device
// strategies are rejected with kBuild (ep_strategies()) before anything is built.
#include "moekit/ep.hpp"

namespace moekit {

void EpLayer::DeviceStateDeleter::operator()(DeviceState*) const {}

void EpLayer::create_device_state(int) {
  throw Error(ErrorCode::kUnsupported, "this build of moekit has no CUDA: no device EP path");
}

void EpLayer::forward_device(const ForwardArgs&) {
  throw Error(ErrorCode::kUnsupported, "this build of moekit has no CUDA: no device EP path");
}

Status EpLayer::poll_device_errors() { return {}; }

}  // namespace moekit
