// Environment: fingerprint, the frozen detected() instance and the GPU-less one.
#include "moekit/environment.hpp"

#include <cstdio>
#include <exception>
#include <sstream>

#include "registry/registry_internal.hpp"

#ifndef MOEKIT_VERSION
#define MOEKIT_VERSION "unknown"
#endif

namespace moekit {

int Environment::sm(int device) const {
  if (device < 0 || device >= static_cast<int>(gpus.size())) return 0;
  return gpus[static_cast<size_t>(device)].sm;
}

std::string Environment::fingerprint() const {
  // Multiprocessor count is in: a MIG slice keeps the GPU's name but runs (and tunes)
  // differently. Memory, L2 and probe_note are out: they change neither choice nor speed.
  std::ostringstream s;
  s << "moekit " << library_version << " | build cuda=" << built_with_cuda
    << " cutlass=" << built_with_cutlass << " nccl=" << built_with_nccl
    << " | cuda runtime=" << cuda_runtime_version << " driver=" << cuda_driver_version
    << " | gpus=" << gpus.size();
  for (const GpuInfo& g : gpus) s << " | " << g.name << " sm" << g.sm << " mp" << g.multiprocessors;
  return s.str();
}

std::string Environment::fingerprint_hash() const {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char c : fingerprint()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Environment Environment::cpu_only() {
  Environment env;
#ifdef MOEKIT_WITH_CUDA
  env.built_with_cuda = true;
#endif
#ifdef MOEKIT_WITH_CUTLASS
  env.built_with_cutlass = true;
#endif
#ifdef MOEKIT_WITH_NCCL
  env.built_with_nccl = true;
#endif
  env.library_version = MOEKIT_VERSION;
  env.probe_note = "no GPU: a CPU-only environment";
  return env;
}

const Environment& Environment::detected() {
  // A magic static: probed once, thread-safe, frozen for the life of the process.
  static const Environment env = [] {
    try {
      return registry::probe_environment();
    } catch (const std::exception& e) {
      Environment none = cpu_only();
      none.probe_note = std::string("probing the GPUs failed: ") + e.what();
      return none;
    }
  }();
  return env;
}

}  // namespace moekit
