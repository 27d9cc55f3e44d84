// The tuning cache (moekit/tune.hpp): its key, buckets, JSON form with per-entry validation, and
// the fallback rule that turns a cache into the engines' tactic choices.
#include "moekit/tune.hpp"

#include "io/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "moekit/registry.hpp"
#include "moekit/status.hpp"

namespace moekit {

const char* to_string(Gemm g) { return g == Gemm::kFc1 ? "fc1" : "fc2"; }

std::optional<Gemm> gemm_from_string(std::string_view s) {
  if (s == "fc1") return Gemm::kFc1;
  if (s == "fc2") return Gemm::kFc2;
  return std::nullopt;
}

const std::string* TacticChoices::find(Gemm gemm, int64_t tokens) const {
  const TacticChoice* best = nullptr;
  for (const TacticChoice& c : choices)
    if (c.gemm == gemm && c.bucket >= tokens && (best == nullptr || c.bucket < best->bucket))
      best = &c;
  return best ? &best->tactic : nullptr;
}

std::vector<int64_t> tuning_buckets(int64_t max_tokens, int64_t dp_factor) {
  if (max_tokens < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "max_tokens " + std::to_string(max_tokens) + " must be at least 1 to tune");
  if (dp_factor < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "the data-parallel factor " + std::to_string(dp_factor) + " must be at least 1");
  if (max_tokens > std::numeric_limits<int64_t>::max() / dp_factor)
    throw Error(ErrorCode::kInvalidArgument, "max_tokens " + std::to_string(max_tokens) +
                                                 " x the data-parallel factor " +
                                                 std::to_string(dp_factor) + " overflows");
  const int64_t cap = max_tokens * dp_factor;
  std::vector<int64_t> b;
  for (int64_t p = 1; p < cap; p *= 2) b.push_back(p);
  b.push_back(cap);
  return b;
}

namespace {

bool same_float(const std::optional<float>& a, const std::optional<float>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || std::memcmp(&*a, &*b, sizeof(float)) == 0;
}

std::string opt_text(const std::optional<float>& v) {
  if (!v) return "none";
  std::ostringstream o;
  o << *v;
  return o.str();
}

}  // namespace

TuningKey TuningKey::of(const MoeSpec& spec, const std::string& implementation, Gemm gemm,
                        int64_t bucket) {
  const LocalProblem lp = derive_local(spec);
  TuningKey k;
  k.implementation = implementation;
  k.gemm = gemm;
  k.n = gemm == Gemm::kFc1 ? lp.fc1_rows : lp.hidden;
  k.k = gemm == Gemm::kFc1 ? lp.hidden : lp.intermediate;
  k.experts = lp.num_experts;
  k.global_experts = spec.num_experts;
  k.top_k = spec.top_k;
  k.act_dtype = spec.act_dtype;
  k.weight_format = spec.weights.format;
  const bool grouped = spec.weights.format == WeightFormat::kInt8Group ||
                       spec.weights.format == WeightFormat::kInt4Group;
  k.group_size = grouped ? spec.weights.group_size : 0;
  k.zero_points = grouped && spec.weights.zero_points;
  k.pre_quant_scale = grouped && spec.weights.pre_quant_scale;
  k.activation = spec.activation.kind;
  k.limit = spec.activation.limit;
  k.alpha = spec.activation.alpha;
  k.beta = spec.activation.beta;
  k.fc1_bias = spec.fc1_bias;
  k.fc2_bias = spec.fc2_bias;
  k.gate_up_layout = spec.gate_up_layout;
  k.tp_size = spec.tp_size;
  k.ep_size = spec.ep_size;
  k.bucket = bucket;
  return k;
}

bool TuningKey::operator==(const TuningKey& o) const {
  return implementation == o.implementation && gemm == o.gemm && n == o.n && k == o.k &&
         experts == o.experts && global_experts == o.global_experts && top_k == o.top_k &&
         act_dtype == o.act_dtype && weight_format == o.weight_format &&
         group_size == o.group_size && zero_points == o.zero_points &&
         pre_quant_scale == o.pre_quant_scale && activation == o.activation &&
         same_float(limit, o.limit) && same_float(alpha, o.alpha) && same_float(beta, o.beta) &&
         fc1_bias == o.fc1_bias && fc2_bias == o.fc2_bias && gate_up_layout == o.gate_up_layout &&
         tp_size == o.tp_size && ep_size == o.ep_size && bucket == o.bucket;
}

std::string TuningKey::text() const {
  return implementation + " " + to_string(gemm) + " n " + std::to_string(n) + " k " +
         std::to_string(k) + " experts " + std::to_string(experts) + "/" +
         std::to_string(global_experts) + " top_k " + std::to_string(top_k) + " " +
         to_string(act_dtype) + "/" + to_string(weight_format) + " " + to_string(activation) +
         " limit " + opt_text(limit) + " alpha " + opt_text(alpha) + " beta " + opt_text(beta) +
         " bias " + std::to_string(fc1_bias) + std::to_string(fc2_bias) + " " +
         to_string(gate_up_layout) + " tp " + std::to_string(tp_size) + " ep " +
         std::to_string(ep_size) + " bucket " + std::to_string(bucket);
}

std::string TuningProblem::text() const {
  return file + ": " + (entry >= 0 ? "entry " + std::to_string(entry) + ": " : "") + reason;
}

namespace {

using nlohmann::json;

json opt_json(const std::optional<float>& v) {
  return v ? json(static_cast<double>(*v)) : json(nullptr);
}

json key_json(const TuningKey& k) {
  return json{{"implementation", k.implementation},
              {"gemm", to_string(k.gemm)},
              {"n", k.n},
              {"k", k.k},
              {"experts", k.experts},
              {"global_experts", k.global_experts},
              {"top_k", k.top_k},
              {"act_dtype", to_string(k.act_dtype)},
              {"weight_format", to_string(k.weight_format)},
              {"group_size", k.group_size},
              {"zero_points", k.zero_points},
              {"pre_quant_scale", k.pre_quant_scale},
              {"activation", to_string(k.activation)},
              {"limit", opt_json(k.limit)},
              {"alpha", opt_json(k.alpha)},
              {"beta", opt_json(k.beta)},
              {"fc1_bias", k.fc1_bias},
              {"fc2_bias", k.fc2_bias},
              {"gate_up_layout", to_string(k.gate_up_layout)},
              {"tp_size", k.tp_size},
              {"ep_size", k.ep_size},
              {"bucket", k.bucket}};
}

// Reads one entry's fields; the first thing wrong is thrown as a reason (caught per entry).
struct EntryReader {
  const json& e;
  const json& at(const char* name) const {
    const auto it = e.find(name);
    if (it == e.end()) throw std::string("lacks the field \"") + name + "\"";
    return *it;
  }
  [[noreturn]] void wrong(const char* name, const char* want) const {
    throw std::string("field \"") + name + "\" is " + at(name).dump() + ", not " + want;
  }
  std::string str(const char* name) const {
    const json& v = at(name);
    if (!v.is_string()) wrong(name, "a string");
    return v.get<std::string>();
  }
  int64_t positive(const char* name) const {
    const json& v = at(name);
    if (!v.is_number_integer() || v.get<int64_t>() < 1) wrong(name, "a positive integer");
    return v.get<int64_t>();
  }
  int64_t non_negative(const char* name) const {
    const json& v = at(name);
    if (!v.is_number_integer() || v.get<int64_t>() < 0) wrong(name, "an integer >= 0");
    return v.get<int64_t>();
  }
  bool boolean(const char* name) const {
    const json& v = at(name);
    if (!v.is_boolean()) wrong(name, "true or false");
    return v.get<bool>();
  }
  std::optional<float> opt_float(const char* name) const {
    const json& v = at(name);
    if (v.is_null()) return std::nullopt;
    if (!v.is_number()) wrong(name, "a number or null");
    return static_cast<float>(v.get<double>());
  }
  double time(const char* name) const {
    const json& v = at(name);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0.0)
      wrong(name, "a finite time above 0 us");
    return v.get<double>();
  }
  template <class T, class F>
  T named(const char* name, F from_string, const char* what) const {
    const std::string s = str(name);
    const auto v = from_string(s);
    if (!v) throw std::string("field \"") + name + "\" names an unknown " + what + " \"" + s + "\"";
    return *v;
  }
  // A tactic is stored by name: an index (digits) would point at another kernel once the
  // list changes (DESIGN.md, Names).
  std::string tactic(const char* name) const {
    const std::string t = str(name);
    if (t.empty()) throw std::string("field \"") + name + "\" is empty, not a tactic name";
    if (std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw std::string("field \"") + name + "\" is \"" + t +
          "\", an index; tactics are stored by name";
    return t;
  }
};

TuningEntry read_entry(const json& e) {
  if (!e.is_object()) throw std::string("is ") + e.dump() + ", not an object";
  const EntryReader r{e};
  TuningEntry out;
  TuningKey& k = out.key;
  k.implementation = r.str("implementation");
  if (find_implementation(k.implementation) == nullptr)
    throw "names an unknown implementation \"" + k.implementation + "\"";
  k.gemm = r.named<Gemm>("gemm", gemm_from_string, "GEMM (fc1 or fc2)");
  k.n = r.positive("n");
  k.k = r.positive("k");
  k.experts = r.positive("experts");
  k.global_experts = r.positive("global_experts");
  k.top_k = r.positive("top_k");
  k.act_dtype = r.named<DType>("act_dtype", dtype_from_string, "dtype");
  k.weight_format =
      r.named<WeightFormat>("weight_format", weight_format_from_string, "weight format");
  k.group_size = static_cast<int>(r.non_negative("group_size"));
  k.zero_points = r.boolean("zero_points");
  k.pre_quant_scale = r.boolean("pre_quant_scale");
  k.activation = r.named<ActivationKind>("activation", activation_from_string, "activation");
  k.limit = r.opt_float("limit");
  k.alpha = r.opt_float("alpha");
  k.beta = r.opt_float("beta");
  k.fc1_bias = r.boolean("fc1_bias");
  k.fc2_bias = r.boolean("fc2_bias");
  k.gate_up_layout =
      r.named<GateUpLayout>("gate_up_layout", gate_up_layout_from_string, "gate/up layout");
  k.tp_size = static_cast<int>(r.positive("tp_size"));
  k.ep_size = static_cast<int>(r.positive("ep_size"));
  k.bucket = r.positive("bucket");
  out.tactic = r.tactic("tactic");
  out.time_us = r.time("time_us");
  out.runner_up = r.str("runner_up");
  if (!out.runner_up.empty()) {
    r.tactic("runner_up");
    out.runner_up_us = r.time("runner_up_us");
  }
  return out;
}

}  // namespace

TuningCache::Loaded TuningCache::parse(const std::string& text, const std::string& file,
                                       const std::string& expected_fingerprint) {
  Loaded out;
  auto refuse = [&](const std::string& reason) {
    out.cache.entries.clear();
    out.problems.push_back({file, -1, reason});
    return out;
  };
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return refuse("is not JSON");
  if (!doc.is_object()) return refuse("is not a JSON object");
  const auto version = doc.find("schema_version");
  if (version == doc.end() || !version->is_number_integer())
    return refuse("lacks an integer \"schema_version\"");
  if (version->get<int64_t>() != kTuningSchemaVersion)
    return refuse("has schema version " + version->dump() + "; this moekit reads version " +
                  std::to_string(kTuningSchemaVersion));
  for (const char* field : {"fingerprint", "moekit_version", "moekit_commit", "routing"}) {
    const auto it = doc.find(field);
    if (it == doc.end() || !it->is_string())
      return refuse(std::string("lacks the string \"") + field + "\"");
  }
  out.cache.fingerprint = doc["fingerprint"].get<std::string>();
  out.cache.moekit_version = doc["moekit_version"].get<std::string>();
  out.cache.moekit_commit = doc["moekit_commit"].get<std::string>();
  out.cache.routing = doc["routing"].get<std::string>();
  if (!expected_fingerprint.empty() && out.cache.fingerprint != expected_fingerprint)
    return refuse("was measured on another environment (\"" + out.cache.fingerprint +
                  "\"), not this one (\"" + expected_fingerprint + "\")");
  const auto entries = doc.find("entries");
  if (entries == doc.end() || !entries->is_array()) return refuse("lacks the array \"entries\"");
  for (std::size_t i = 0; i < entries->size(); ++i) {
    const int index = static_cast<int>(i);
    try {
      TuningEntry e = read_entry((*entries)[i]);
      if (out.cache.lookup(e.key) != nullptr) {
        out.problems.push_back(
            {file, index,
             "repeats the key of an earlier entry (" + e.key.text() + "); the first one counts"});
        continue;
      }
      out.cache.entries.push_back(std::move(e));
    } catch (const std::string& reason) {
      out.problems.push_back({file, index, reason});
    }
  }
  return out;
}

TuningCache::Loaded TuningCache::load(const std::string& path,
                                      const std::string& expected_fingerprint) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(ErrorCode::kIo, "cannot read the tuning file " + path + ": it is a folder");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kIo, "cannot read the tuning file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::kIo, "cannot read the tuning file " + path);
  return parse(text.str(), path, expected_fingerprint);
}

std::string TuningCache::to_json() const {
  json entries_json = json::array();
  for (const TuningEntry& e : entries) {
    json j = key_json(e.key);
    j["tactic"] = e.tactic;
    j["time_us"] = e.time_us;
    j["runner_up"] = e.runner_up;
    j["runner_up_us"] = e.runner_up_us;
    entries_json.push_back(std::move(j));
  }
  const json doc{{"schema_version", schema_version},
                 {"fingerprint", fingerprint},
                 {"moekit_version", moekit_version},
                 {"moekit_commit", moekit_commit},
                 {"routing", routing},
                 {"entries", std::move(entries_json)}};
  return doc.dump(2) + "\n";
}

void TuningCache::save(const std::string& path) const {
  // A reader (a layer being created, a tune saving as it goes) sees the old file or the new one.
  io::write_file_atomically(path, to_json());
}

const TuningEntry* TuningCache::lookup(const TuningKey& key) const {
  for (const TuningEntry& e : entries)
    if (e.key == key) return &e;
  return nullptr;
}

void TuningCache::put(const TuningEntry& entry) {
  for (TuningEntry& e : entries)
    if (e.key == entry.key) {
      e = entry;
      return;
    }
  entries.push_back(entry);
}

TacticChoices choose_tactics(const TuningCache& cache, const std::string& file, const MoeSpec& spec,
                             const std::string& implementation,
                             const std::function<std::vector<std::string>(Gemm)>& known_tactics,
                             int64_t dp_factor, std::vector<TuningProblem>* problems) {
  TacticChoices out;
  if (cache.entries.empty()) return out;
  const std::vector<int64_t> buckets = tuning_buckets(spec.max_tokens, dp_factor);
  for (const Gemm gemm : {Gemm::kFc1, Gemm::kFc2}) {
    const std::vector<std::string> known =
        known_tactics ? known_tactics(gemm) : std::vector<std::string>();
    for (const int64_t bucket : buckets) {
      const TuningEntry* e = cache.lookup(TuningKey::of(spec, implementation, gemm, bucket));
      if (e == nullptr) continue;  // the engine's built-in pick
      if (known_tactics && std::find(known.begin(), known.end(), e->tactic) == known.end()) {
        if (problems != nullptr)
          problems->push_back({file, static_cast<int>(e - cache.entries.data()),
                               "names the tactic \"" + e->tactic + "\", which " + implementation +
                                   " did not build for " + to_string(gemm) +
                                   "; its built-in pick runs"});
        continue;
      }
      out.choices.push_back({gemm, bucket, e->tactic, e->time_us});
    }
  }
  return out;
}

TuningOutcome read_tuning(const std::string& file, const std::string& fingerprint,
                          const MoeSpec& spec, const std::string& implementation,
                          const std::function<std::vector<std::string>(Gemm)>& known_tactics,
                          int64_t dp_factor) {
  TuningOutcome out;
  out.file = file;
  TuningCache::Loaded loaded;
  try {
    loaded = TuningCache::load(file, fingerprint);
  } catch (const Error& e) {
    out.problems.push_back({file, -1, e.what()});
    return out;
  }
  out.problems = std::move(loaded.problems);
  out.chosen = choose_tactics(loaded.cache, file, spec, implementation, known_tactics, dp_factor,
                              &out.problems)
                   .choices;
  return out;
}

}  // namespace moekit
