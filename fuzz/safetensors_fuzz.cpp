// Fuzzes the safetensors reader: any bytes as a file. A malformed file must be refused with
// moekit::Error (kBadFile / kIo); anything else that escapes, and any out-of-bounds access,
// is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_input_file.hpp"
#include "io/safetensors.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string& path = moekit::fuzz::write_input("safetensors", data, size);
  try {
    const moekit::io::SafetensorsFile file(path);
    // Every byte the reader promises is in bounds is read.
    unsigned sum = 0;
    for (const moekit::io::TensorInfo& t : file.tensors())
      for (uint8_t b : file.bytes(t)) sum += b;
    for (const auto& [key, value] : file.metadata()) sum += key.size() + value.size();
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const moekit::Error&) {
    return 0;
  }
  // The public readers over the same (valid) file: dtype conversion and metadata.
  try {
    for (const moekit::NamedTensor& t : moekit::read_tensors(path))
      if (t.dtype == moekit::DType::kBFloat16 || t.dtype == moekit::DType::kFloat16 ||
          t.dtype == moekit::DType::kFloat32)
        (void)moekit::named_tensor_to_floats(t);
    (void)moekit::read_metadata(path);
  } catch (const moekit::Error&) {
  }
  return 0;
}
