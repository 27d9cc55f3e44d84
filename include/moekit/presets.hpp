// Built-in layer shapes of real models: the MoE layer of one transformer block, with its routing,
// activation and weight format as the released checkpoint has them.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "moekit/spec.hpp"

namespace moekit {

struct Preset {
  std::string name;         // "mixtral-8x7b"
  std::string description;  // one line: model, shape, routing, activation, format
  MoeSpec spec;             // unsharded, max_tokens 4096
  std::string family;       // the ModelFamily its checkpoints use (find_model_family)
};

// In a fixed order.
const std::vector<Preset>& list_presets();
// Error(kNotFound) listing the known names.
const Preset& find_preset(std::string_view name);

}  // namespace moekit
