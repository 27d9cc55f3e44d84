// The small layers the layer-weight fuzzer loads: one per storage kind and format family. The
// first input byte picks one; the rest is the file. layer_weights_seeds writes each case's valid
// file (its seed).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "moekit/io.hpp"
#include "moekit/spec.hpp"

namespace moekit::fuzz {

struct LayerCase {
  std::string name;              // seed file name
  std::string family;            // model_families() name
  MoeSpec spec;                  // unsharded: the seed holds the whole layer
  int tp_size = 1, tp_rank = 0;  // the rank the fuzzer loads
};

inline MoeSpec small_layer(WeightFormat format) {
  MoeSpec s;
  s.num_experts = 2;
  s.top_k = 1;
  s.hidden = 32;
  s.intermediate = 32;
  s.max_tokens = 8;
  s.weights.format = format;
  s.weights.group_size = 32;
  return s;
}

inline const std::vector<LayerCase>& layer_cases() {
  static const std::vector<LayerCase> cases = [] {
    std::vector<LayerCase> c;
    c.push_back({"mixtral-bf16", "mixtral", small_layer(WeightFormat::kBF16)});
    // The intermediate slice of a TP rank: the loader cuts rows and columns.
    c.push_back({"qwen3-fp16-tp2", "qwen3_moe", small_layer(WeightFormat::kFP16), 2, 1});
    {
      // fp8 block-128 needs 128-multiple shapes: files too large to fuzz well, so bf16 here.
      MoeSpec s = small_layer(WeightFormat::kBF16);
      s.routing.method = RoutingMethod::kDeepSeekV3;
      s.routing.n_group = 2;
      s.routing.topk_group = 1;
      s.routing.correction_bias = true;
      c.push_back({"deepseek-bf16-correction-bias", "deepseek_v3", s});
    }
    {
      MoeSpec s = small_layer(WeightFormat::kMXFP4);
      s.gate_up_layout = GateUpLayout::kInterleaved;
      s.activation.kind = ActivationKind::kSwiGLUClamped;
      s.activation.limit = 7.0f;
      s.fc1_bias = s.fc2_bias = true;
      c.push_back({"gpt-oss-mxfp4", "gpt_oss", s});
    }
    {
      MoeSpec s = small_layer(WeightFormat::kInt4Group);
      s.weights.zero_points = true;
      s.fc1_bias = true;
      c.push_back({"moekit-int4-group32", "moekit", s});
    }
    return c;
  }();
  return cases;
}

// The spec the fuzzer loads for a case (its TP rank).
inline MoeSpec loaded_spec(const LayerCase& c) {
  MoeSpec s = c.spec;
  s.tp_size = c.tp_size;
  s.tp_rank = c.tp_rank;
  return s;
}

}  // namespace moekit::fuzz
