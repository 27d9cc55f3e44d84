// The resolver: the only place an implementation is chosen. Pure: reads spec and environment.
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

// The rejection that best explains why a request was not met: the highest-priority one for a
// reason other than format or GPU generation (the member meant for this problem, stopped by
// something the user can change). Failing that, a GPU-generation rejection: a member that took
// the format but had no GPU to run on says more than one that never took the format. Else the
// first.
const Rejection& most_informative(const std::vector<CandidateReport>& rows) {
  for (const CandidateReport& c : rows)
    if (c.rejection && !uninformative(c.rejection->stage)) return *c.rejection;
  for (const CandidateReport& c : rows)
    if (c.rejection && c.rejection->stage == RejectStage::kGpuGeneration) return *c.rejection;
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
    r.degraded_from = Degradation{request, "", most_informative(r.candidates)};
  } else if (is_auto && r.chosen != nullptr && r.chosen->device() == Device::kHost && !env.gpus.empty()) {
    std::vector<CandidateReport> device_rows;
    for (size_t j = 0; j < considered.size(); ++j)
      if (table[considered[j]]->device() == Device::kCuda && r.candidates[j].rejection)
        device_rows.push_back(r.candidates[j]);
    if (!device_rows.empty())
      r.degraded_from = Degradation{"auto (a GPU is present)", r.chosen->id(), most_informative(device_rows)};
  }
  return r;
}

}  // namespace registry

Resolution resolve(const MoeSpec& spec, const Environment& env, const std::string& request) {
  return registry::resolve_in(all_implementations(), spec, env, request);
}

}  // namespace moekit
