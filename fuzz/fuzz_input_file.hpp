// The fuzz input as a file: the readers under test take paths (they map the file), so each input
// is written to one scratch file per process, in memory-backed /dev/shm where there is one.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace moekit::fuzz {

inline const std::string& scratch_path(const char* target) {
  static const std::string path = [&] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/moekit-" + target + "-" + std::to_string(getpid()) + ".safetensors";
  }();
  return path;
}

// Writes `data` to the scratch file; a failed write stops the run (it is the harness, not
// the code under test, that failed).
inline const std::string& write_input(const char* target, const uint8_t* data, std::size_t size) {
  const std::string& path = scratch_path(target);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace moekit::fuzz
