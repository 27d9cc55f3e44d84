// One forward of a small layer shaped like the mixtral-8x7b preset, on the CPU reference,
// through the installed headers and library alone.
#include <cstdio>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "moekit/version.hpp"

int main() {
  moekit::MoeSpec spec = moekit::find_preset("mixtral-8x7b").spec;
  spec.hidden = 64, spec.intermediate = 32, spec.max_tokens = 4;
  spec.act_dtype = moekit::DType::kFloat32;
  spec.weights.format = moekit::WeightFormat::kFP32;
  moekit::MoeWeights w;
  w.fc1 = {moekit::WeightFormat::kFP32, spec.num_experts, spec.fc1_rows(), spec.hidden};
  w.fc2 = {moekit::WeightFormat::kFP32, spec.num_experts, spec.hidden, spec.intermediate};
  w.fc1.values.assign(spec.num_experts * spec.fc1_rows() * spec.hidden * 4, 0);
  w.fc2.values.assign(spec.num_experts * spec.hidden * spec.intermediate * 4, 0);
  moekit::LayerOptions options;
  options.backend = "reference";
  auto layer = moekit::MoeLayer::create(spec, w, options);
  const int64_t tokens = 4;
  std::vector<float> hidden(tokens * spec.hidden, 1.0f), output(hidden.size(), -1.0f);
  std::vector<float> logits(tokens * spec.num_experts, 0.5f);
  moekit::ForwardArgs args;
  args.hidden = moekit::host_view(hidden.data(), moekit::DType::kFloat32, {tokens, spec.hidden});
  args.router_logits =
      moekit::host_view(logits.data(), moekit::DType::kFloat32, {tokens, spec.num_experts});
  args.output = moekit::host_view(output.data(), moekit::DType::kFloat32, {tokens, spec.hidden});
  layer->forward(args);
  std::printf("moekit %s (headers %s): %s, output[0] = %g\n", moekit::version(),
              MOEKIT_VERSION_STRING, layer->implementation().id().c_str(), output[0]);
  return output[0] == 0.0f ? 0 : 1;  // zero weights: the layer's output is exactly zero
}
