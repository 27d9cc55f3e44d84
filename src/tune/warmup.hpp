// MoeLayer::warmup's device half: one forward per token bucket on scratch inputs
// (warmup_cuda.cpp; CUDA-less builds have no device engine to warm: warmup_nocuda.cpp).
#pragma once
#include "moekit/registry.hpp"

namespace moekit::tune {

// Allocates hidden, routing inputs and output for spec.max_tokens tokens on `device`, runs
// engine.forward at each of tuning_buckets(spec.max_tokens) tokens on a stream of its own, waits,
// frees. Routing inputs: zero logits, or for kExternal ids (t + j) mod E with equal weights.
void warm_up_device_engine(Engine& engine, const MoeSpec& spec, int device);

}  // namespace moekit::tune
