// The machine and build moekit runs on: probed once, frozen, fingerprinted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moekit {

struct GpuInfo {
  std::string name;
  int sm = 0;  // compute capability major*10 + minor, e.g. 90
  int multiprocessors = 0;
  int64_t memory_bytes = 0;
  int64_t l2_bytes = 0;
};

struct Environment {
  std::vector<GpuInfo> gpus;     // empty: no GPU, no driver, or a CPU-only build
  int cuda_runtime_version = 0;  // e.g. 13000; 0 when unknown
  int cuda_driver_version = 0;
  bool built_with_cuda = false;
  bool built_with_cutlass = false;
  bool built_with_nccl = false;
  std::string library_version;
  std::string probe_note;  // why no GPU was found, when none was

  // SM of the GPU `device` (0 when there is none).
  int sm(int device = 0) const;
  // A stable, human-readable string of everything that changes which implementation is chosen
  // or how fast it runs (GPU names, SMs, counts, CUDA versions, build features, version).
  // Memory size and probe_note are excluded: they change neither.
  std::string fingerprint() const;
  // FNV-1a 64-bit of fingerprint(), printed as 16 hex digits.
  std::string fingerprint_hash() const;

  // Probed once per process (thread-safe) and frozen. Never throws; no GPU yields gpus empty.
  static const Environment& detected();
  // A machine without a GPU, for tests and the CPU path.
  static Environment cpu_only();
};

}  // namespace moekit
