// How `moekit tune` draws the routing of the batches it times (internal to the library and the
// CLI): uniform, or skewed by a Zipf law, the way real traffic favours a few experts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/spec.hpp"

namespace moekit::tune {

// Uniform (zipf_s 0), or Zipf: expert e (global id) drawn with probability proportional to
// 1 / (e + 1)^zipf_s, each token's top_k experts without replacement.
struct RoutingProfile {
  double zipf_s = 0.0;
  std::string text() const;  // "uniform" or "zipf:<s>"
};

// "uniform", "zipf" (s = 1) or "zipf:<s>" with s finite and above 0; else
// Error(kInvalidArgument) naming the text.
RoutingProfile parse_routing_profile(const std::string& text);

// Routing inputs of `tokens` tokens that follow a Zipf profile (zipf_s > 0): for kExternal
// routing, ids [tokens, top_k] and equal weights; else router logits [tokens, experts] of
// log p_e plus Gumbel noise, whose top-k is k draws without replacement in proportion to p (a
// softmax top-k routing follows it exactly, the grouped DeepSeek-V3 selection roughly). Each
// output is resized; the ones the routing method does not use are left empty.
void draw_zipf_routing(const MoeSpec& spec, int64_t tokens, double zipf_s, uint64_t seed,
                       std::vector<float>* logits, std::vector<int32_t>* ids,
                       std::vector<float>* weights);

}  // namespace moekit::tune
