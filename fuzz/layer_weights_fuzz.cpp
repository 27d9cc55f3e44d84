// Fuzzes load_layer_weights: the first byte picks a small layer (layer_weights_cases.hpp), the
// rest is its checkpoint file. A file that does not hold the layer must be refused with
// moekit::Error; weights that load must pass check_weights (the loader's promise).
#include <cstddef>
#include <cstdint>

#include "fuzz_input_file.hpp"
#include "layer_weights_cases.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"
#include "moekit/weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& cases = moekit::fuzz::layer_cases();
  const moekit::fuzz::LayerCase& c = cases[data[0] % cases.size()];
  const std::string& path = moekit::fuzz::write_input("layer_weights", data + 1, size - 1);
  const moekit::MoeSpec spec = moekit::fuzz::loaded_spec(c);
  moekit::MoeWeights w;
  try {
    w = moekit::load_layer_weights({path}, moekit::find_model_family(c.family), 0, spec);
  } catch (const moekit::Error&) {
    return 0;
  }
  moekit::check_weights(spec, w);  // throws (uncaught: a finding) when the loader broke its word
  return 0;
}
