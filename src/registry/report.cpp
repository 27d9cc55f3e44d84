// The resolution report: a table for people, JSON for tools (and back, for tools and tests).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "moekit/registry.hpp"
#include "moekit/status.hpp"
#include "io/safetensors.hpp"

namespace moekit {
namespace {

using nlohmann::json;
constexpr int kReportSchema = 1;

// ordered_json keeps the fields in the order written, so the report reads top-down.
nlohmann::ordered_json rejection_json(const Rejection& r) {
  return {{"stage", to_string(r.stage)}, {"reason", r.reason}};
}

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "Not a moekit resolution report: " + what + ".");
}

const json& field(const json& j, const char* name, const std::string& where) {
  if (!j.is_object() || !j.contains(name)) bad(where + " lacks field '" + name + "'");
  return j.at(name);
}

std::string str(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_string()) bad(where + "." + name + " is not a string");
  return v.get<std::string>();
}

bool boolean(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_boolean()) bad(where + "." + name + " is not a boolean");
  return v.get<bool>();
}

Rejection rejection_from(const json& j, const std::string& where) {
  std::string stage = str(j, "stage", where);
  auto s = reject_stage_from_string(stage);
  if (!s) bad(where + ".stage '" + stage + "' is not a rejection stage");
  return Rejection{*s, str(j, "reason", where)};
}

}  // namespace

std::string Resolution::table() const {
  size_t id_w = 14, fam_w = 6;
  for (const CandidateReport& c : candidates) {
    id_w = std::max(id_w, c.id.size());
    fam_w = std::max(fam_w, c.family.size());
  }
  auto pad = [](const std::string& s, size_t w) {
    return s + std::string(w - std::min(w, s.size()), ' ');
  };
  std::ostringstream o;
  o << "request:     " << request << "\n";
  o << "environment: " << environment_fingerprint << "\n";
  o << "  prio  " << pad("implementation", id_w) << "  " << pad("family", fam_w)
    << "  verdict   stage           reason\n";
  for (const CandidateReport& c : candidates) {
    std::string verdict = c.chosen ? "CHOSEN" : c.eligible ? "eligible" : "rejected";
    std::string line = "  " + pad(std::to_string(c.priority), 4) + "  " + pad(c.id, id_w) + "  " +
                       pad(c.family, fam_w) + "  " + pad(verdict, 8) + "  ";
    if (c.rejection)
      line += pad(to_string(c.rejection->stage), 14) + "  " + c.rejection->reason;
    else
      line += "-";
    o << line << "\n";
  }
  o << "chosen:      " << (chosen ? chosen->id() : std::string("none: nothing can run this layer"))
    << "\n";
  if (degraded_from)
    o << "degraded:    '" << degraded_from->requested << "' was not given ("
      << to_string(degraded_from->reason.stage) << "): " << degraded_from->reason.reason << "\n";
  if (!tuning.file.empty()) {
    o << "tuning:      " << tuning.file << ": " << tuning.chosen.size()
      << " tuned choice(s); every other GEMM and bucket keeps the built-in pick\n";
    for (const TacticChoice& c : tuning.chosen)
      o << "  " << to_string(c.gemm) << " up to " << c.bucket << " tokens: " << c.tactic << " ("
        << c.time_us << " us)\n";
    for (const TuningProblem& p : tuning.problems) o << "  problem: " << p.text() << "\n";
  }
  return o.str();
}

std::string Resolution::json() const {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const CandidateReport& c : candidates)
    rows.push_back({{"id", c.id},
                    {"family", c.family},
                    {"priority", c.priority},
                    {"eligible", c.eligible},
                    {"chosen", c.chosen},
                    {"rejection", c.rejection ? rejection_json(*c.rejection) : nullptr}});
  nlohmann::ordered_json j{
      {"schema", kReportSchema},
      {"request", request},
      {"chosen", chosen ? nlohmann::ordered_json(chosen->id()) : nlohmann::ordered_json(nullptr)},
      {"environment_fingerprint", environment_fingerprint},
      {"degraded_from", nullptr},
      {"candidates", rows}};
  if (degraded_from)
    j["degraded_from"] = {{"requested", degraded_from->requested},
                          {"chosen", degraded_from->chosen},
                          {"reason", rejection_json(degraded_from->reason)}};
  if (!tuning.file.empty()) {
    nlohmann::ordered_json chosen_rows = nlohmann::ordered_json::array();
    for (const TacticChoice& c : tuning.chosen)
      chosen_rows.push_back({{"gemm", to_string(c.gemm)},
                             {"bucket", c.bucket},
                             {"tactic", c.tactic},
                             {"time_us", c.time_us}});
    nlohmann::ordered_json problem_rows = nlohmann::ordered_json::array();
    for (const TuningProblem& p : tuning.problems)
      problem_rows.push_back({{"file", p.file}, {"entry", p.entry}, {"reason", p.reason}});
    j["tuning"] = {{"file", tuning.file}, {"chosen", chosen_rows}, {"problems", problem_rows}};
  }
  return j.dump(2);
}

std::string resolution_json_with_spec(const MoeSpec& spec, const Resolution& r) {
  std::string spec_text = spec_to_json(spec), indented;
  for (char c : spec_text) {
    indented += c;
    if (c == '\n') indented += "  ";
  }
  const std::string report = r.json();  // "{\n  ...}"
  return "{\n  \"spec\": " + indented + "," + report.substr(1);
}

Resolution resolution_from_json(const std::string& text) {
  // dump() in the messages below recurses per nesting level: refuse deep text first.
  if (!io::json_depth_within(text, io::kMaxJsonDepth))
    bad("the text nests deeper than " + std::to_string(io::kMaxJsonDepth) + " levels");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("the text is not valid JSON");
  const json& schema = field(j, "schema", "report");
  if (!schema.is_number_integer() || schema.get<int>() != kReportSchema)
    bad("schema " + schema.dump() + " is not " + std::to_string(kReportSchema));
  Resolution r;
  r.request = str(j, "request", "report");
  r.environment_fingerprint = str(j, "environment_fingerprint", "report");
  const json& chosen = field(j, "chosen", "report");
  if (chosen.is_string()) {
    r.chosen = find_implementation(chosen.get<std::string>());
    if (!r.chosen)
      bad("chosen '" + chosen.get<std::string>() + "' is not an implementation of this build");
  } else if (!chosen.is_null()) {
    bad("report.chosen is neither an id nor null");
  }
  const json& rows = field(j, "candidates", "report");
  if (!rows.is_array()) bad("report.candidates is not an array");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string where = "candidates[" + std::to_string(i) + "]";
    const json& row = rows[i];
    CandidateReport c;
    c.id = str(row, "id", where);
    c.family = str(row, "family", where);
    const json& prio = field(row, "priority", where);
    if (!prio.is_number_integer()) bad(where + ".priority is not an integer");
    c.priority = prio.get<int>();
    c.eligible = boolean(row, "eligible", where);
    c.chosen = boolean(row, "chosen", where);
    const json& rej = field(row, "rejection", where);
    if (!rej.is_null()) c.rejection = rejection_from(rej, where + ".rejection");
    if (c.eligible == c.rejection.has_value())
      bad(where + " is " + (c.eligible ? "eligible with" : "rejected without") + " a rejection");
    r.candidates.push_back(std::move(c));
  }
  const json& deg = field(j, "degraded_from", "report");
  if (!deg.is_null()) {
    r.degraded_from =
        Degradation{str(deg, "requested", "degraded_from"), str(deg, "chosen", "degraded_from"),
                    rejection_from(field(deg, "reason", "degraded_from"), "degraded_from.reason")};
  }
  if (j.contains("tuning")) {  // only where a tuning file was given
    const json& t = j.at("tuning");
    r.tuning.file = str(t, "file", "tuning");
    const json& chosen_rows = field(t, "chosen", "tuning");
    if (!chosen_rows.is_array()) bad("tuning.chosen is not an array");
    for (size_t i = 0; i < chosen_rows.size(); ++i) {
      const std::string where = "tuning.chosen[" + std::to_string(i) + "]";
      const json& row = chosen_rows[i];
      TacticChoice c;
      const std::string gemm = str(row, "gemm", where);
      const auto g = gemm_from_string(gemm);
      if (!g) bad(where + ".gemm '" + gemm + "' is not fc1 or fc2");
      c.gemm = *g;
      const json& bucket = field(row, "bucket", where);
      if (!bucket.is_number_integer()) bad(where + ".bucket is not an integer");
      c.bucket = bucket.get<int64_t>();
      c.tactic = str(row, "tactic", where);
      const json& time = field(row, "time_us", where);
      if (!time.is_number()) bad(where + ".time_us is not a number");
      c.time_us = time.get<double>();
      r.tuning.chosen.push_back(std::move(c));
    }
    const json& problem_rows = field(t, "problems", "tuning");
    if (!problem_rows.is_array()) bad("tuning.problems is not an array");
    for (size_t i = 0; i < problem_rows.size(); ++i) {
      const std::string where = "tuning.problems[" + std::to_string(i) + "]";
      const json& row = problem_rows[i];
      const json& entry = field(row, "entry", where);
      if (!entry.is_number_integer()) bad(where + ".entry is not an integer");
      r.tuning.problems.push_back(
          {str(row, "file", where), entry.get<int>(), str(row, "reason", where)});
    }
  }
  return r;
}

}  // namespace moekit
