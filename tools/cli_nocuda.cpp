// A build without CUDA: device runs are refused with the reason.
#include "cli_common.hpp"
#include "cli_ep.hpp"
#include "moekit/status.hpp"

namespace moekit::cli {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(ErrorCode::kUnsupported,
              std::string(what) + " needs a GPU, and this build of moekit has no CUDA");
}
}  // namespace
RunResult run_layer_on_device(MoeLayer&, const HostInputs&) { no_cuda("running on the device"); }
RunResult run_ep_layer_on_device(EpLayer&, const HostInputs&) { no_cuda("running on the device"); }
EpBenchRow time_ep_layer_on_device(EpLayer&, const HostInputs&, int) {
  no_cuda("moekit bench --ep-size");
}
void bench_layer_on_device(MoeLayer&, const HostInputs&, L2Flush, BenchRow&, int, double) {
  no_cuda("moekit bench");
}
std::vector<double> time_choices_on_device(MoeLayer&, const HostInputs&, L2Flush,
                                           const std::vector<TacticChoices>&, double) {
  no_cuda("moekit tune");
}
Floors measure_floors(L2Flush) { no_cuda("moekit bench"); }
}  // namespace moekit::cli
