// Builds without CUDA have no NCCL: the NCCL communicators are refused with the reason.
#include "moekit/comm.hpp"

namespace moekit::comm {

std::unique_ptr<Communicator> wrap_nccl(void*, int, std::chrono::milliseconds) {
  throw Error(ErrorCode::kUnsupported,
              "this build of moekit has no CUDA, hence no NCCL communicator");
}

std::unique_ptr<Communicator> create_nccl(const LaunchEnv&, std::chrono::milliseconds) {
  throw Error(ErrorCode::kUnsupported,
              "this build of moekit has no CUDA, hence no NCCL communicator");
}

}  // namespace moekit::comm
