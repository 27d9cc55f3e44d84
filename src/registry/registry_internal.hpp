// Registry internals shared by its files and its tests (not public API).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/environment.hpp"
#include "moekit/registry.hpp"

namespace moekit::registry {

// Probes the CUDA runtime (environment_cuda.cpp) or reports a CUDA-less build
// (environment_nocuda.cpp). Never throws for a missing driver or GPU: gpus stays empty and
// probe_note says why.
Environment probe_environment();

// The shared capability checks, in RejectStage order; `id` names the implementation in the
// sentence. Implementation::can_implement runs these before extra_checks().
Eligibility check_capability(const Capability& cap, const std::string& id, const MoeSpec& spec,
                             const Environment& env);

// resolve() over an explicit table (priority = index), so tests can resolve among fakes.
Resolution resolve_in(const std::vector<const Implementation*>& table, const MoeSpec& spec,
                      const Environment& env, const std::string& request);

// How many engines MoeLayer::create has asked an implementation to build in this process:
// tests read it to prove that a refused request allocated nothing.
std::uint64_t engines_created();
void count_engine_created();

// Called by MoeLayer::forward once it holds the layer, before the engine runs (null: nothing).
// Tests set it, before starting their threads, to hold one forward open and provoke an overlap.
extern void (*forward_entered_hook)();

}  // namespace moekit::registry
