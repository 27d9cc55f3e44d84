// Fuzzes spec_from_json: any text. Malformed text must be refused with moekit::Error; a spec
// that parses must print and parse back to the same JSON, and, when it validates, derive its
// local problem without overflow (UBSan).
#include <cstddef>
#include <cstdint>
#include <string>

#include "moekit/spec.hpp"
#include "moekit/status.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  moekit::MoeSpec spec;
  try {
    spec = moekit::spec_from_json(text);
  } catch (const moekit::Error&) {
    return 0;
  }
  const std::string printed = moekit::spec_to_json(spec);
  if (moekit::spec_to_json(moekit::spec_from_json(printed)) != printed) __builtin_trap();
  if (spec.validate().empty()) {
    (void)moekit::derive_local(spec);
    (void)spec.fc1_rows();
  }
  return 0;
}
