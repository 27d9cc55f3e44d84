// Probes the GPUs through the CUDA runtime. A missing driver or GPU is a normal outcome here:
// gpus stays empty and probe_note carries the runtime's own words.
#include <cuda_runtime_api.h>

#include <string>

#include "moekit/environment.hpp"
#include "registry/registry_internal.hpp"

namespace moekit::registry {
namespace {

std::string describe(const char* call, cudaError_t err) {
  std::string s = std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")";
  cudaGetLastError();  // clear, so the failure does not surface in a later, unrelated call
  return s;
}

}  // namespace

Environment probe_environment() {
  Environment env = Environment::cpu_only();
  env.probe_note.clear();
  int version = 0;
  if (cudaRuntimeGetVersion(&version) == cudaSuccess) env.cuda_runtime_version = version;
  version = 0;
  if (cudaDriverGetVersion(&version) == cudaSuccess) env.cuda_driver_version = version;  // 0: none

  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    env.probe_note = describe("cudaGetDeviceCount", err);
    return env;
  }
  if (count <= 0) {
    env.probe_note = "the CUDA runtime found no GPU (cudaGetDeviceCount returned 0)";
    return env;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    err = cudaGetDeviceProperties(&p, i);
    if (err != cudaSuccess) {
      // A partial list would shift device indices, so report none rather than some.
      env.gpus.clear();
      env.probe_note =
          describe("cudaGetDeviceProperties", err) + " for device " + std::to_string(i);
      return env;
    }
    GpuInfo g;
    g.name = p.name;
    g.sm = p.major * 10 + p.minor;
    g.multiprocessors = p.multiProcessorCount;
    g.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
    g.l2_bytes = p.l2CacheSize;
    env.gpus.push_back(std::move(g));
  }
  return env;
}

}  // namespace moekit::registry
