// The exact CPU reference forward of one MoE layer (the oracle for every GPU kernel).
#pragma once
#include <cstdint>

#include "moekit/spec.hpp"
#include "moekit/status.hpp"
#include "moekit/weights.hpp"

namespace moekit::reference {

// hidden [tokens, H] fp32 (already rounded to act_dtype by the caller if it wants that),
// ids/weights [tokens, top_k] (global ids, weights with the scaling factor applied) from
// routing::route_host or the caller. out [tokens, H] fp32 is fully written: tokens whose experts
// are all on other EP ranks get zeros. `weights` are the LOCAL shards (check_weights()).
// spec.routing.weight_placement says where a slot's weight multiplies: its expert's output (the
// weighted sum), or its expert's input (kInput: the row times the weight, rounded to act_dtype;
// the outputs then sum with weight 1).
// NaN / Inf in one token's hidden row or routing weights reach that token's output only.
// fp32 accumulation, multithreaded over (expert, token block).
Status forward(const MoeSpec& spec, const MoeWeights& weights, int64_t tokens, const float* hidden,
               const int32_t* ids, const float* route_weights, float* out);

// The same with an explicit thread count (0 = one per hardware thread). The result does not
// depend on it: every output element is computed by one thread in a fixed order.
Status forward(const MoeSpec& spec, const MoeWeights& weights, int64_t tokens, const float* hidden,
               const int32_t* ids, const float* route_weights, float* out, int num_threads);

}  // namespace moekit::reference
