// MoeSpec as JSON: what `moekit resolve --json` prints under "spec" and `--spec FILE.json` reads.
// Enums are written by name (to_string) and read by any name *_from_string knows; floats are
// written as their shortest text, so that they read back bit-exactly.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "moekit/spec.hpp"
#include "moekit/status.hpp"
#include "moekit/types.hpp"
#include "io/safetensors.hpp"  // json_depth_within

namespace moekit {
namespace {

// Written with float as the number type: nlohmann prints a float's shortest round-trip text
// (0.1, not the 0.10000000149011612 its double would print).
using OutJson = nlohmann::basic_json<nlohmann::ordered_map, std::vector, std::string, bool,
                                     std::int64_t, std::uint64_t, float>;
using nlohmann::json;

[[noreturn]] void bad(const std::string& sentence) {
  throw Error(ErrorCode::kInvalidArgument, "spec JSON: " + sentence);
}

// JSON has no inf or nan: those are written as the strings "inf", "-inf" and "nan".
OutJson float_out(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// One JSON object being read: every key must be read once; what remains is unknown.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) bad(path_of("") + " is " + j_.dump() + ", not an object");
  }
  // Throws for keys that no read asked for (call after all reads).
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) bad("unknown key '" + path_of(it.key()) + "'");
  }

  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  std::string path_of(const std::string& key) const {
    if (key.empty()) return where_.empty() ? "the spec" : where_;
    return where_.empty() ? key : where_ + "." + key;
  }

  void int64(const std::string& key, int64_t& out) {
    const json* v = find(key);
    if (!v) return;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        bad(path_of(key) + " " + v->dump() + " does not fit a 64-bit signed integer");
      out = static_cast<int64_t>(v->get<uint64_t>());
    } else if (v->is_number_integer()) {
      out = v->get<int64_t>();
    } else if (v->is_number_float()) {
      bad(path_of(key) + " " + v->dump() + " is not an integer (or does not fit 64 bits)");
    } else {
      bad(path_of(key) + " " + v->dump() + " is not an integer");
    }
  }
  void int32(const std::string& key, int& out) {
    int64_t wide = out;
    int64(key, wide);
    if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
      bad(path_of(key) + " " + std::to_string(wide) + " does not fit a 32-bit integer");
    out = static_cast<int>(wide);
  }
  void boolean(const std::string& key, bool& out) {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_boolean()) bad(path_of(key) + " " + v->dump() + " is not true or false");
    out = v->get<bool>();
  }
  void real(const std::string& key, float& out) {
    const json* v = find(key);
    if (!v) return;
    out = to_float(key, *v);
  }
  void optional_real(const std::string& key, std::optional<float>& out) {
    const json* v = find(key);
    if (!v) return;
    out = to_float(key, *v);  // an absent key leaves the value absent; null is not accepted
  }
  template <class E, class Parse>
  void name(const std::string& key, E& out, Parse parse, const char* what) {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_string()) bad(path_of(key) + " " + v->dump() + " is not a string naming " + what);
    const std::optional<E> e = parse(v->get<std::string>());
    if (!e) bad(path_of(key) + " '" + v->get<std::string>() + "' is not a known " + what);
    out = *e;
  }
  const json* object(const std::string& key) { return find(key); }

 private:
  float to_float(const std::string& key, const json& v) const {
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "inf") return std::numeric_limits<float>::infinity();
      if (s == "-inf") return -std::numeric_limits<float>::infinity();
      if (s == "nan") return std::numeric_limits<float>::quiet_NaN();
    }
    if (!v.is_number()) bad(path_of(key) + " " + v.dump() + " is not a number");
    const double d = v.get<double>();
    // Past the midpoint between FLT_MAX and 2^128 a double no longer rounds to a finite float.
    const double float_limit = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);
    if (std::fabs(d) >= float_limit)
      bad(path_of(key) + " " + v.dump() + " does not fit a 32-bit float");
    return static_cast<float>(d);
  }

  const json& j_;
  std::string where_;
  std::set<std::string> seen_;
};

}  // namespace

std::string spec_to_json(const MoeSpec& s) {
  OutJson weights = {{"format", to_string(s.weights.format)},
                     {"group_size", s.weights.group_size},
                     {"zero_points", s.weights.zero_points},
                     {"pre_quant_scale", s.weights.pre_quant_scale},
                     {"dynamic_activations", s.weights.dynamic_activations}};
  OutJson activation = {{"kind", to_string(s.activation.kind)}};
  if (s.activation.limit) activation["limit"] = float_out(*s.activation.limit);
  if (s.activation.alpha) activation["alpha"] = float_out(*s.activation.alpha);
  if (s.activation.beta) activation["beta"] = float_out(*s.activation.beta);
  OutJson routing = {{"method", to_string(s.routing.method)},
                     {"n_group", s.routing.n_group},
                     {"topk_group", s.routing.topk_group},
                     {"routed_scaling_factor", float_out(s.routing.routed_scaling_factor)},
                     {"correction_bias", s.routing.correction_bias},
                     {"renormalize", s.routing.renormalize},
                     {"weight_placement", to_string(s.routing.weight_placement)}};
  OutJson j = {{"num_experts", s.num_experts},
               {"top_k", s.top_k},
               {"hidden", s.hidden},
               {"intermediate", s.intermediate},
               {"act_dtype", to_string(s.act_dtype)},
               {"weights", weights},
               {"activation", activation},
               {"gate_up_layout", to_string(s.gate_up_layout)},
               {"fc1_bias", s.fc1_bias},
               {"fc2_bias", s.fc2_bias},
               {"routing", routing},
               {"max_tokens", s.max_tokens},
               {"tp_size", s.tp_size},
               {"tp_rank", s.tp_rank},
               {"ep_size", s.ep_size},
               {"ep_rank", s.ep_rank}};
  return j.dump(2);
}

MoeSpec spec_from_json(const std::string& text) {
  // The messages below dump() offending values, which recurses per nesting level.
  if (!io::json_depth_within(text, io::kMaxJsonDepth))
    bad("the text nests deeper than " + std::to_string(io::kMaxJsonDepth) + " levels");
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("the text is not valid JSON");
  MoeSpec s;  // keys that are absent keep MoeSpec's defaults
  Reader top(j, "");
  top.int64("num_experts", s.num_experts);
  top.int64("top_k", s.top_k);
  top.int64("hidden", s.hidden);
  top.int64("intermediate", s.intermediate);
  top.name("act_dtype", s.act_dtype, dtype_from_string, "dtype");
  // A nested object: read by `read`, then checked for keys nobody asked for.
  auto nested = [&](const char* key, auto&& read) {
    if (const json* v = top.object(key)) {
      Reader r(*v, key);
      read(r);
      r.finish();
    }
  };
  nested("weights", [&](Reader& r) {
    r.name("format", s.weights.format, weight_format_from_string, "weight format");
    r.int32("group_size", s.weights.group_size);
    r.boolean("zero_points", s.weights.zero_points);
    r.boolean("pre_quant_scale", s.weights.pre_quant_scale);
    r.boolean("dynamic_activations", s.weights.dynamic_activations);
  });
  nested("activation", [&](Reader& r) {
    r.name("kind", s.activation.kind, activation_from_string, "activation");
    r.optional_real("limit", s.activation.limit);
    r.optional_real("alpha", s.activation.alpha);
    r.optional_real("beta", s.activation.beta);
  });
  top.name("gate_up_layout", s.gate_up_layout, gate_up_layout_from_string, "gate/up layout");
  top.boolean("fc1_bias", s.fc1_bias);
  top.boolean("fc2_bias", s.fc2_bias);
  nested("routing", [&](Reader& r) {
    r.name("method", s.routing.method, routing_from_string, "routing method");
    r.int32("n_group", s.routing.n_group);
    r.int32("topk_group", s.routing.topk_group);
    r.real("routed_scaling_factor", s.routing.routed_scaling_factor);
    r.boolean("correction_bias", s.routing.correction_bias);
    r.boolean("renormalize", s.routing.renormalize);
    r.name("weight_placement", s.routing.weight_placement, router_weight_placement_from_string,
           "router weight placement");
  });
  top.int64("max_tokens", s.max_tokens);
  top.int32("tp_size", s.tp_size);
  top.int32("tp_rank", s.tp_rank);
  top.int32("ep_size", s.ep_size);
  top.int32("ep_rank", s.ep_rank);
  top.finish();
  return s;
}

}  // namespace moekit
