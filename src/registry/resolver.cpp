// The resolver: the only place an implementation is chosen. Pure: reads spec and environment.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "moekit/status.hpp"
#include "registry/registry_internal.hpp"

namespace moekit {
namespace registry {
namespace {

bool uninformative(RejectStage s) {
  return s == RejectStage::kFormat || s == RejectStage::kGpuGeneration;
}

template <class T>
bool takes(const std::vector<T>& list, T v) {
  return std::find(list.begin(), list.end(), v) != list.end();
}

// The capability of the member a report row names, or null.
const Capability* capability_of(const CandidateReport& c,
                                const std::vector<const Implementation*>& table) {
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const Implementation* i) { return i->id() == c.id; });
  return it == table.end() ? nullptr : &(*it)->capability();
}

// A member that takes the weight format and the activation dtype but was refused at the format
// stage was refused for a parameter of the format (an int group size, zero points, the AWQ
// pre-quant scale): its own sentence names it. Empty when no member of `rows` is such a one.
std::optional<Rejection> format_parameter_rejection(const std::vector<CandidateReport>& rows,
                                                    const std::vector<const Implementation*>& table,
                                                    const MoeSpec& spec) {
  for (const CandidateReport& c : rows) {
    if (!c.rejection || c.rejection->stage != RejectStage::kFormat) continue;
    const Capability* cap = capability_of(c, table);
    if (cap != nullptr && takes(cap->weight_formats, spec.weights.format) &&
        takes(cap->act_dtypes, spec.act_dtype))
      return *c.rejection;
  }
  return std::nullopt;
}

// A member that takes the weight format but was refused for the activation dtype says what the
// user can change: "fp16 weights need fp16 activations, not bf16 (sm90...)". Empty when no
// member of `rows` is such a one.
std::optional<Rejection> act_dtype_rejection(const std::vector<CandidateReport>& rows,
                                             const std::vector<const Implementation*>& table,
                                             const MoeSpec& spec) {
  for (const CandidateReport& c : rows) {
    if (!c.rejection || c.rejection->stage != RejectStage::kFormat) continue;
    const Capability* found = capability_of(c, table);
    if (found == nullptr) continue;
    const Capability& cap = *found;
    if (!takes(cap.weight_formats, spec.weights.format) || takes(cap.act_dtypes, spec.act_dtype) ||
        cap.act_dtypes.empty())
      continue;
    std::string wanted;
    for (DType t : cap.act_dtypes)
      wanted += std::string(wanted.empty() ? "" : " or ") + to_string(t);
    return Rejection{RejectStage::kFormat, std::string(to_string(spec.weights.format)) +
                                               " weights need " + wanted + " activations, not " +
                                               to_string(spec.act_dtype) + " (" + c.id + ")."};
  }
  return std::nullopt;
}

// The rejection that best explains why a request was not met: the highest-priority one for a
// reason other than format or GPU generation (the member meant for this problem, stopped by
// something the user can change). Failing that, a GPU-generation rejection: a member that took
// the format but had no GPU to run on says more than one that never took the format. Then a
// member that took the weight format and the activation dtype but not a parameter of the format
// (an int group size, zero points), then one that took the weight format but not the activation
// dtype (naming the dtype needed). Else the first.
Rejection most_informative(const std::vector<CandidateReport>& rows,
                           const std::vector<const Implementation*>& table, const MoeSpec& spec) {
  for (const CandidateReport& c : rows)
    if (c.rejection && !uninformative(c.rejection->stage)) return *c.rejection;
  for (const CandidateReport& c : rows)
    if (c.rejection && c.rejection->stage == RejectStage::kGpuGeneration) return *c.rejection;
  if (std::optional<Rejection> r = format_parameter_rejection(rows, table, spec)) return *r;
  if (std::optional<Rejection> r = act_dtype_rejection(rows, table, spec)) return *r;
  return *rows.front().rejection;
}

std::string known_names(const std::vector<const Implementation*>& table) {
  std::string families, ids;
  for (const Implementation* impl : table) {
    if (families.find(impl->family()) == std::string::npos)
      families += (families.empty() ? "" : ", ") + impl->family();
    ids += (ids.empty() ? "" : ", ") + impl->id();
  }
  return "auto, a family (" + families + ") or an implementation id (" + ids + ")";
}

}  // namespace

Resolution resolve_in(const std::vector<const Implementation*>& table, const MoeSpec& spec,
                      const Environment& env, const std::string& request) {
  spec.validate_or_throw();
  const bool is_auto = request == "auto";
  std::vector<size_t> considered;
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i]->id() == request) considered.push_back(i);
  if (considered.empty())
    for (size_t i = 0; i < table.size(); ++i)
      if (is_auto || table[i]->family() == request) considered.push_back(i);
  if (considered.empty())
    throw Error(ErrorCode::kNotFound,
                "Unknown backend '" + request + "': expected " + known_names(table) + ".");

  Resolution r;
  r.request = request;
  r.environment_fingerprint = env.fingerprint();
  for (size_t i : considered) {
    const Implementation* impl = table[i];
    Eligibility e = impl->can_implement(spec, env);
    CandidateReport row;
    row.id = impl->id();
    row.family = impl->family();
    row.priority = static_cast<int>(i);
    row.eligible = e.ok();
    if (!e.ok()) row.rejection = e.rejection();
    if (e.ok() && r.chosen == nullptr) {
      r.chosen = impl;
      row.chosen = true;
    }
    r.candidates.push_back(std::move(row));
  }
  // An explicit request that no member can meet fails, and says why (nothing runs instead:
  // chosen stays empty). "auto" asks for nothing in particular, except that on a machine with a
  // GPU, falling back to a host implementation is a degradation worth saying out loud: the user
  // hears why every device implementation declined instead of silently running on the CPU.
  if (r.chosen == nullptr && !is_auto) {
    r.degraded_from = Degradation{request, "", most_informative(r.candidates, table, spec)};
  } else if (is_auto && r.chosen != nullptr && r.chosen->device() == Device::kHost &&
             !env.gpus.empty()) {
    std::vector<CandidateReport> device_rows;
    for (size_t j = 0; j < considered.size(); ++j)
      if (table[considered[j]]->device() == Device::kCuda && r.candidates[j].rejection)
        device_rows.push_back(r.candidates[j]);
    if (!device_rows.empty())
      r.degraded_from = Degradation{"auto (a GPU is present)", r.chosen->id(),
                                    most_informative(device_rows, table, spec)};
  }
  return r;
}

}  // namespace registry

Resolution resolve(const MoeSpec& spec, const Environment& env, const std::string& request) {
  return registry::resolve_in(all_implementations(), spec, env, request);
}

}  // namespace moekit
