// The capability checks every implementation shares, in RejectStage order: what the problem is
// (format) and where it runs (GPU) come before what this build lacks, so a format or SM mismatch
// is never blamed on the build.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "registry/registry_internal.hpp"

namespace moekit {

const char* to_string(RejectStage s) {
  switch (s) {
    case RejectStage::kFormat:
      return "format";
    case RejectStage::kGpuGeneration:
      return "gpu_generation";
    case RejectStage::kBuild:
      return "build";
    case RejectStage::kActivation:
      return "activation";
    case RejectStage::kRouting:
      return "routing";
    case RejectStage::kFeature:
      return "feature";
    case RejectStage::kAlignment:
      return "alignment";
    case RejectStage::kLimits:
      return "limits";
    case RejectStage::kParallelism:
      return "parallelism";
  }
  return "unknown";
}

std::optional<RejectStage> reject_stage_from_string(std::string_view s) {
  for (int i = static_cast<int>(RejectStage::kFormat);
       i <= static_cast<int>(RejectStage::kParallelism); ++i) {
    auto stage = static_cast<RejectStage>(i);
    if (s == to_string(stage)) return stage;
  }
  return std::nullopt;
}

namespace {

template <class T>
bool contains(const std::vector<T>& v, T x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

template <class T>
std::string list(const std::vector<T>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (const T& x : v) s += (s.empty() ? "" : ", ") + std::string(to_string(x));
  return s;
}

std::string num(float v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

Eligibility reject(RejectStage stage, const std::string& id, const std::string& sentence) {
  return Eligibility::rejected(stage, id + " " + sentence);
}

Eligibility check_format(const Capability& c, const std::string& id, const MoeSpec& spec) {
  if (!contains(c.weight_formats, spec.weights.format))
    return reject(RejectStage::kFormat, id,
                  "supports weight formats {" + list(c.weight_formats) + "}, not " +
                      to_string(spec.weights.format) + ".");
  if (!contains(c.act_dtypes, spec.act_dtype))
    return reject(RejectStage::kFormat, id,
                  "supports activation dtypes {" + list(c.act_dtypes) + "}, not " +
                      to_string(spec.act_dtype) + ".");
  const WeightQuant& q = spec.weights;
  if (q.format != WeightFormat::kInt8Group && q.format != WeightFormat::kInt4Group)
    return Eligibility::eligible();
  if (!contains(c.int_group_sizes, q.group_size)) {
    std::string sizes;
    for (const int g : c.int_group_sizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(g);
    return reject(RejectStage::kFormat, id,
                  "runs " + std::string(to_string(q.format)) + " group sizes {" +
                      (sizes.empty() ? "none" : sizes) + "}, not " + std::to_string(q.group_size) +
                      ".");
  }
  if (q.zero_points && !c.int_zero_points)
    return reject(RejectStage::kFormat, id,
                  "does not run " + std::string(to_string(q.format)) +
                      " zero points (weights.zero_points is set).");
  if (q.pre_quant_scale && !c.int_pre_quant_scale)
    return reject(RejectStage::kFormat, id,
                  "does not run the AWQ pre-quant scale of " + std::string(to_string(q.format)) +
                      " (weights.pre_quant_scale is set).");
  return Eligibility::eligible();
}

Eligibility check_gpu(const Capability& c, const std::string& id, const Environment& env) {
  if (c.sm_min == 0 && c.sm_max == 0) return Eligibility::eligible();  // runs without a GPU
  std::string range = "SM " + std::to_string(c.sm_min) +
                      (c.sm_max == c.sm_min ? "" : ".." + std::to_string(c.sm_max));
  if (env.gpus.empty())
    return reject(RejectStage::kGpuGeneration, id,
                  "needs a GPU of " + range + " but none was found" +
                      (env.probe_note.empty() ? "." : ": " + env.probe_note + "."));
  const GpuInfo& g = env.gpus.front();
  if (g.sm < c.sm_min || g.sm > c.sm_max)
    return reject(
        RejectStage::kGpuGeneration, id,
        "needs a GPU of " + range + " but " + g.name + " is SM " + std::to_string(g.sm) + ".");
  return Eligibility::eligible();
}

Eligibility check_build(const Capability& c, const std::string& id, const Environment& env) {
  if (c.needs_cuda && !env.built_with_cuda)
    return reject(RejectStage::kBuild, id,
                  "needs CUDA but this build has no CUDA (configured with MOEKIT_CUDA=OFF).");
  if (c.needs_cutlass && !env.built_with_cutlass)
    return reject(RejectStage::kBuild, id, "needs CUTLASS but this build has no CUTLASS kernels.");
  if (c.needs_nccl && !env.built_with_nccl)
    return reject(RejectStage::kBuild, id, "needs NCCL but this build has no NCCL.");
  return Eligibility::eligible();
}

Eligibility check_activation(const Capability& c, const std::string& id, const MoeSpec& spec) {
  const ActivationParams& a = spec.activation;
  if (!contains(c.activations, a.kind))
    return reject(
        RejectStage::kActivation, id,
        "supports activations {" + list(c.activations) + "}, not " + to_string(a.kind) + ".");
  if (a.limit && !c.clamp)
    return reject(RejectStage::kActivation, id,
                  "does not support the activation clamp (limit " + num(*a.limit) + ").");
  if ((a.alpha || a.beta) && !c.alpha_beta)
    return reject(RejectStage::kActivation, id,
                  "does not support activation alpha/beta (alpha " + num(a.alpha_or_default()) +
                      ", beta " + num(a.beta_or_default()) + ").");
  return Eligibility::eligible();
}

Eligibility check_routing(const Capability& c, const std::string& id, const MoeSpec& spec) {
  if (!contains(c.routings, spec.routing.method))
    return reject(
        RejectStage::kRouting, id,
        "supports routing {" + list(c.routings) + "}, not " + to_string(spec.routing.method) + ".");
  if (spec.routing.weight_placement == RouterWeightPlacement::kInput && !c.router_weight_on_input)
    return reject(RejectStage::kRouting, id,
                  "applies the routing weight to the experts' output only, not to their input "
                  "(routing.weight_placement " +
                      std::string(to_string(spec.routing.weight_placement)) + ").");
  return Eligibility::eligible();
}

// LoRA, all-to-all and graph capture are declared in Capability but not requested through
// MoeSpec: the layer reads cuda_graph_safe from the chosen implementation, the comm layer
// reads all_to_all, so only the biases are checked here.
Eligibility check_features(const Capability& c, const std::string& id, const MoeSpec& spec) {
  if (spec.fc1_bias && !c.fc1_bias)
    return reject(RejectStage::kFeature, id, "does not support an FC1 bias (fc1_bias is set).");
  if (spec.fc2_bias && !c.fc2_bias)
    return reject(RejectStage::kFeature, id, "does not support an FC2 bias (fc2_bias is set).");
  return Eligibility::eligible();
}

Eligibility check_alignment(const Capability& c, const std::string& id, const MoeSpec& spec,
                            const LocalProblem& local) {
  if (c.hidden_multiple > 1 && spec.hidden % c.hidden_multiple != 0)
    return reject(RejectStage::kAlignment, id,
                  "needs hidden to be a multiple of " + std::to_string(c.hidden_multiple) +
                      ", not " + std::to_string(spec.hidden) + ".");
  if (c.intermediate_multiple > 1 && local.intermediate % c.intermediate_multiple != 0)
    return reject(RejectStage::kAlignment, id,
                  "needs the local intermediate (" + std::to_string(spec.intermediate) +
                      " over TP " + std::to_string(spec.tp_size) + " = " +
                      std::to_string(local.intermediate) + ") to be a multiple of " +
                      std::to_string(c.intermediate_multiple) + ".");
  return Eligibility::eligible();
}

Eligibility check_limits(const Capability& c, const std::string& id, const MoeSpec& spec) {
  if (c.max_tokens > 0 && spec.max_tokens > c.max_tokens)
    return reject(RejectStage::kLimits, id,
                  "runs at most " + std::to_string(c.max_tokens) + " tokens, not max_tokens " +
                      std::to_string(spec.max_tokens) + ".");
  if (c.max_experts > 0 && spec.num_experts > c.max_experts)
    return reject(RejectStage::kLimits, id,
                  "runs at most " + std::to_string(c.max_experts) + " experts, not " +
                      std::to_string(spec.num_experts) + ".");
  if (c.max_top_k > 0 && spec.top_k > c.max_top_k)
    return reject(RejectStage::kLimits, id,
                  "runs at most top-k " + std::to_string(c.max_top_k) + ", not " +
                      std::to_string(spec.top_k) + ".");
  return Eligibility::eligible();
}

Eligibility check_parallelism(const Capability& c, const std::string& id, const MoeSpec& spec) {
  if (spec.tp_size > 1 && !c.tensor_parallel)
    return reject(
        RejectStage::kParallelism, id,
        "does not support tensor parallelism (tp_size " + std::to_string(spec.tp_size) + ").");
  if (spec.ep_size > 1 && !c.expert_parallel)
    return reject(
        RejectStage::kParallelism, id,
        "does not support expert parallelism (ep_size " + std::to_string(spec.ep_size) + ").");
  return Eligibility::eligible();
}

}  // namespace

namespace registry {

Eligibility check_capability(const Capability& c, const std::string& id, const MoeSpec& spec,
                             const Environment& env) {
  // Expects a valid spec (resolve() validates first): derive_local divides by tp/ep size.
  Eligibility e = check_format(c, id, spec);
  if (e.ok()) e = check_gpu(c, id, env);
  if (e.ok()) e = check_build(c, id, env);
  if (e.ok()) e = check_activation(c, id, spec);
  if (e.ok()) e = check_routing(c, id, spec);
  if (e.ok()) e = check_features(c, id, spec);
  if (e.ok()) e = check_alignment(c, id, spec, derive_local(spec));
  if (e.ok()) e = check_limits(c, id, spec);
  if (e.ok()) e = check_parallelism(c, id, spec);
  return e;
}

}  // namespace registry

Eligibility Implementation::can_implement(const MoeSpec& spec, const Environment& env) const {
  Eligibility e = registry::check_capability(capability(), id(), spec, env);
  if (!e.ok()) return e;
  return extra_checks(spec, env);
}

Eligibility Implementation::extra_checks(const MoeSpec&, const Environment&) const {
  return Eligibility::eligible();
}

}  // namespace moekit
