// Writes the layer-weight fuzzer's seeds: for each case, its selector byte followed by the
// checkpoint file save_layer_weights writes for random weights. Usage: layer_weights_seeds DIR
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "layer_weights_cases.hpp"
#include "moekit/io.hpp"
#include "quant/quant.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const auto& cases = moekit::fuzz::layer_cases();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const moekit::fuzz::LayerCase& c = cases[i];
    const std::string tmp = dir + "/" + c.name + ".tmp";
    moekit::save_layer_weights(tmp, moekit::find_model_family(c.family), 0, c.spec,
                               moekit::quant::make_random_weights(c.spec, i + 1));
    std::ifstream in(tmp, std::ios::binary);
    const std::vector<char> file((std::istreambuf_iterator<char>(in)), {});
    std::remove(tmp.c_str());
    std::ofstream out(dir + "/" + c.name, std::ios::binary);
    out.put(static_cast<char>(i));
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
  }
  return 0;
}
