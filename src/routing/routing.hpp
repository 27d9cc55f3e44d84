// Routing on the host (reference) and on the device. Ids are GLOBAL expert ids.
#pragma once
#include <cstdint>

#include "moekit/spec.hpp"
#include "moekit/status.hpp"

namespace moekit::routing {

// Selects top_k experts per token from logits [tokens, experts] fp32 as params.method says,
// writing ids [tokens, top_k] int32 and weights [tokens, top_k] fp32 (routed_scaling_factor
// applied). Ties go to the lower expert id. Slots are ordered by descending selection score.
// correction_bias [experts] may be null (DeepSeek-V3 only). Fails for kExternal.
Status route_host(const RoutingParams& params, int64_t tokens, int64_t experts, int64_t top_k,
                  const float* logits, const float* correction_bias, int32_t* ids, float* weights);

// Checks caller-supplied ids [tokens, top_k]: every id in [0, experts), no token with an id
// twice. The error names token, slot and value.
Status validate_ids_host(int64_t tokens, int64_t experts, int64_t top_k, const int32_t* ids);

}  // namespace moekit::routing
