// MoeSpec validation and the one place the sharded (local) problem is derived.
#include "moekit/spec.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/checked.hpp"
#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

// Shortest text that reads back as the same float (so "0.1" prints as 0.1, not 0.100000001).
std::string num(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// Enum values arrive from files and command lines as integers; an out-of-range one must be named
// by its number, not passed to to_string().
bool valid_dtype(DType t) {
  int v = static_cast<int>(t);
  return v >= 1 && v <= 8;
}
bool valid_format(WeightFormat f) {
  int v = static_cast<int>(f);
  return v >= 1 && v <= 10;
}
bool valid_activation(ActivationKind a) {
  int v = static_cast<int>(a);
  return v >= 1 && v <= 9;
}
bool valid_layout(GateUpLayout l) {
  int v = static_cast<int>(l);
  return v >= 1 && v <= 2;
}
bool valid_routing(RoutingMethod r) {
  int v = static_cast<int>(r);
  return v >= 1 && v <= 5;
}

bool is_int_format(WeightFormat f) {
  return f == WeightFormat::kInt8Group || f == WeightFormat::kInt4Group;
}

// Checks that depend only on the weight format and the (local) shapes.
void check_format_alignment(const MoeSpec& s, std::vector<std::string>& v) {
  const WeightFormat f = s.weights.format;
  const char* fname = to_string(f);
  const bool int_fmt = is_int_format(f);
  const int g = s.weights.group_size;
  const bool group_ok = !int_fmt || g == 32 || g == 64 || g == 128;
  if (!group_ok) {
    v.push_back("weights.group_size " + num(int64_t{g}) + " of format " + fname +
                " is not 32, 64 or 128");
  }
  if (s.hidden <= 0 || s.intermediate <= 0 || s.tp_size < 1 || s.intermediate % s.tp_size != 0) {
    return;  // already reported; the local shape is undefined
  }
  const int64_t local_i = s.intermediate / s.tp_size;
  // The local intermediate is FC1's rows and FC2's columns: name it in the unit at fault.
  auto local_desc = [&](const char* unit) {
    return s.tp_size > 1
               ? "intermediate " + num(s.intermediate) + " split over TP " +
                     num(int64_t{s.tp_size}) + " gives " + num(local_i) + " " + unit + ", "
               : "intermediate " + num(s.intermediate) + " is ";
  };
  bool hidden_flagged = false, inter_flagged = false;
  const int row_block = format_row_block(f);
  if (row_block > 1 && local_i % row_block != 0) {
    // The 128x128 scale blocks must not straddle TP shards or the gate/up halves.
    v.push_back(local_desc("rows") + "not a multiple of the " + fname + " format's " +
                num(int64_t{row_block}) + "-row block");
    inter_flagged = true;
  }
  const int col_group = group_ok ? format_scale_group(f, g) : 0;
  if (col_group > 0) {
    // hidden is the K dimension of FC1 and the local intermediate that of FC2: a scale group
    // (and a dynamic activation-scale group) must not be cut. The 128x128 block format alone
    // stores a partial last block, so hidden is free there (the intermediate is not: a block
    // must not straddle a TP shard or the gate/up boundary).
    if (row_block == 1 && s.hidden % col_group != 0) {
      v.push_back("hidden " + num(s.hidden) + " is not a multiple of the " + fname + " format's " +
                  num(int64_t{col_group}) + "-column scale group (the K of FC1)");
      hidden_flagged = true;
    }
    if (!inter_flagged && local_i % col_group != 0) {
      v.push_back(local_desc("columns") + "not a multiple of the " + fname + " format's " +
                  num(int64_t{col_group}) + "-column scale group (the K of FC2)");
      inter_flagged = true;
    }
  }
  if (format_value_bits(f) == 4) {
    // Two values share a byte: a row must hold whole bytes.
    if (!hidden_flagged && s.hidden % 2 != 0) {
      v.push_back("hidden " + num(s.hidden) + " is odd, but the 4-bit format " + fname +
                  " packs two columns per byte");
    }
    if (!inter_flagged && local_i % 2 != 0) {
      v.push_back(local_desc("columns") + "odd, but the 4-bit format " + fname +
                  " packs two columns per byte");
    }
  }
}

void check_activation(const MoeSpec& s, std::vector<std::string>& v) {
  const ActivationParams& a = s.activation;
  if (!valid_activation(a.kind)) {
    v.push_back("activation.kind " + num(int64_t{static_cast<int>(a.kind)}) +
                " is not a known activation");
    return;
  }
  const bool clamped = a.kind == ActivationKind::kSwiGLUClamped;
  const char* kname = to_string(a.kind);
  const std::string clamped_name = to_string(ActivationKind::kSwiGLUClamped);
  if (a.limit) {
    if (!clamped) {
      v.push_back("activation.limit " + num(*a.limit) + " is only used by " + clamped_name +
                  ", not " + kname);
    } else if (!(*a.limit > 0.0f)) {
      v.push_back("activation.limit " + num(*a.limit) + " must be greater than 0");
    }
  }
  if (a.alpha) {
    if (!clamped) {
      v.push_back("activation.alpha " + num(*a.alpha) + " is only used by " + clamped_name +
                  ", not " + kname);
    } else if (!std::isfinite(*a.alpha)) {
      v.push_back("activation.alpha " + num(*a.alpha) + " must be finite");
    }
  }
  if (a.beta) {
    if (!clamped) {
      v.push_back("activation.beta " + num(*a.beta) + " is only used by " + clamped_name +
                  ", not " + kname);
    } else if (!std::isfinite(*a.beta)) {
      v.push_back("activation.beta " + num(*a.beta) + " must be finite");
    }
  }
  if (!valid_layout(s.gate_up_layout)) {
    v.push_back("gate_up_layout " + num(int64_t{static_cast<int>(s.gate_up_layout)}) +
                " is not halves or interleaved");
  } else if (s.gate_up_layout != GateUpLayout::kHalves && !activation_is_gated(a.kind)) {
    v.push_back(std::string("gate_up_layout ") + to_string(s.gate_up_layout) +
                " only applies to gated activations, not " + kname);
  }
}

void check_routing(const MoeSpec& s, std::vector<std::string>& v) {
  const RoutingParams& r = s.routing;
  if (!valid_routing(r.method)) {
    v.push_back("routing.method " + num(int64_t{static_cast<int>(r.method)}) +
                " is not a known routing method");
    return;
  }
  const bool dsv3 = r.method == RoutingMethod::kDeepSeekV3;
  const char* mname = to_string(r.method);
  const std::string dsv3_name = to_string(RoutingMethod::kDeepSeekV3);
  bool groups_ok = true;
  if (r.n_group < 1) {
    v.push_back("routing.n_group " + num(int64_t{r.n_group}) + " must be at least 1");
    groups_ok = false;
  } else if (s.num_experts > 0 && s.num_experts % r.n_group != 0) {
    v.push_back("routing.n_group " + num(int64_t{r.n_group}) + " does not divide num_experts " +
                num(s.num_experts));
    groups_ok = false;
  }
  if (r.topk_group < 1 || (r.n_group >= 1 && r.topk_group > r.n_group)) {
    v.push_back("routing.topk_group " + num(int64_t{r.topk_group}) + " is not in [1, n_group " +
                num(int64_t{r.n_group}) + "]");
    groups_ok = false;
  }
  if (groups_ok && s.num_experts > 0 && s.top_k > 0) {
    const int64_t reachable = int64_t{r.topk_group} * (s.num_experts / r.n_group);
    if (s.top_k > reachable) {
      v.push_back("top_k " + num(s.top_k) + " exceeds the " + num(reachable) +
                  " experts in the kept groups (topk_group " + num(int64_t{r.topk_group}) + " x " +
                  num(s.num_experts / r.n_group) + " experts per group)");
    }
  }
  if (!dsv3 && (r.n_group != 1 || r.topk_group != 1)) {
    v.push_back("routing.n_group " + num(int64_t{r.n_group}) + " / topk_group " +
                num(int64_t{r.topk_group}) + " group experts only for " + dsv3_name +
                " routing, not " + mname);
  }
  if (r.correction_bias && !dsv3) {
    v.push_back("routing.correction_bias is only used by " + dsv3_name + " routing, not " + mname);
  }
  if (r.weight_placement != RouterWeightPlacement::kOutput &&
      r.weight_placement != RouterWeightPlacement::kInput) {
    v.push_back("routing.weight_placement " + num(int64_t{static_cast<int>(r.weight_placement)}) +
                " is not output or input");
  }
  if (!(std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0.0f)) {
    v.push_back("routing.routed_scaling_factor " + num(r.routed_scaling_factor) +
                " must be finite and greater than 0");
  }
}

// Every tensor of the layer and of a forward at max_tokens must have an element count that is
// exact in int64 and at most kMaxTensorElements, so that sizes derived from the spec anywhere
// (weights, workspace, host buffers) are computed without overflow and nothing absurd is
// attempted. Only called once the extents themselves are positive.
void check_sizes(const MoeSpec& s, std::vector<std::string>& v) {
  const int64_t gate_factor = activation_is_gated(s.activation.kind) ? 2 : 1;
  auto bounded = [&](const std::string& what, std::initializer_list<int64_t> factors) {
    const std::optional<int64_t> n = checked_product(factors);
    if (!n || *n > kMaxTensorElements) {
      v.push_back(what + " = " + factors_text(factors) + " elements " +
                  (n ? "= " + num(*n) + " exceeds" : "overflows 64-bit arithmetic, past") +
                  " the bound of " + num(kMaxTensorElements) + " elements per tensor");
    }
  };
  bounded("FC1 weights num_experts x fc1 rows x hidden",
          {s.num_experts, gate_factor, s.intermediate, s.hidden});
  bounded("FC2 weights num_experts x hidden x intermediate",
          {s.num_experts, s.hidden, s.intermediate});
  bounded("activations max_tokens x hidden", {s.max_tokens, s.hidden});
  bounded("router logits max_tokens x num_experts", {s.max_tokens, s.num_experts});
  bounded("intermediate workspace max_tokens x top_k x fc1 rows",
          {s.max_tokens, s.top_k, gate_factor, s.intermediate});
}

}  // namespace

std::vector<std::string> MoeSpec::validate() const {
  std::vector<std::string> v;
  auto positive = [&](const char* name, int64_t x) {
    if (x <= 0) v.push_back(std::string(name) + " " + num(x) + " must be positive");
  };
  positive("num_experts", num_experts);
  positive("top_k", top_k);
  positive("hidden", hidden);
  positive("intermediate", intermediate);
  if (max_tokens < 1) v.push_back("max_tokens " + num(max_tokens) + " must be at least 1");
  if (num_experts > std::numeric_limits<int32_t>::max()) {
    v.push_back("num_experts " + num(num_experts) + " does not fit the int32 expert ids");
  }
  if (num_experts > 0 && top_k > num_experts) {
    v.push_back("top_k " + num(top_k) + " exceeds num_experts " + num(num_experts));
  }
  if (!valid_dtype(act_dtype)) {
    v.push_back("act_dtype " + num(int64_t{static_cast<int>(act_dtype)}) + " is not a known dtype");
  } else if (act_dtype != DType::kBFloat16 && act_dtype != DType::kFloat16 &&
             act_dtype != DType::kFloat32) {
    v.push_back(std::string("act_dtype ") + to_string(act_dtype) + " is not bf16, fp16 or fp32");
  }

  // Parallelism.
  if (tp_size < 1) {
    v.push_back("tp_size " + num(int64_t{tp_size}) + " must be at least 1");
  } else if (tp_rank < 0 || tp_rank >= tp_size) {
    v.push_back("tp_rank " + num(int64_t{tp_rank}) + " is not in [0, tp_size " +
                num(int64_t{tp_size}) + ")");
  }
  if (ep_size < 1) {
    v.push_back("ep_size " + num(int64_t{ep_size}) + " must be at least 1");
  } else if (ep_rank < 0 || ep_rank >= ep_size) {
    v.push_back("ep_rank " + num(int64_t{ep_rank}) + " is not in [0, ep_size " +
                num(int64_t{ep_size}) + ")");
  }
  if (ep_size >= 1 && num_experts > 0 && num_experts % ep_size != 0) {
    v.push_back("num_experts " + num(num_experts) + " is not divisible by ep_size " +
                num(int64_t{ep_size}));
  }
  if (tp_size >= 1 && intermediate > 0 && intermediate % tp_size != 0) {
    v.push_back("intermediate " + num(intermediate) + " is not divisible by tp_size " +
                num(int64_t{tp_size}));
  }

  // Weight format.
  if (!valid_format(weights.format)) {
    v.push_back("weights.format " + num(int64_t{static_cast<int>(weights.format)}) +
                " is not a known weight format");
  } else {
    check_format_alignment(*this, v);
    if (!is_int_format(weights.format)) {
      const std::string int_names = std::string(to_string(WeightFormat::kInt8Group)) + " / " +
                                    to_string(WeightFormat::kInt4Group);
      if (weights.zero_points) {
        v.push_back("weights.zero_points is only for " + int_names + ", not " +
                    to_string(weights.format));
      }
      if (weights.pre_quant_scale) {
        v.push_back("weights.pre_quant_scale is only for " + int_names + ", not " +
                    to_string(weights.format));
      }
    }
    if (weights.dynamic_activations && weights.format != WeightFormat::kFP8PerTensor)
      v.push_back(std::string("weights.dynamic_activations is only for ") +
                  to_string(WeightFormat::kFP8PerTensor) + ", not " + to_string(weights.format));
  }

  check_activation(*this, v);
  check_routing(*this, v);
  if (num_experts > 0 && top_k > 0 && hidden > 0 && intermediate > 0 && max_tokens > 0 &&
      valid_activation(activation.kind)) {
    check_sizes(*this, v);
  }
  return v;
}

void MoeSpec::validate_or_throw() const {
  const std::vector<std::string> v = validate();
  if (v.empty()) return;
  std::string msg = "invalid MoE spec: ";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) msg += "; ";
    msg += v[i];
  }
  throw Error(ErrorCode::kInvalidSpec, msg + ".");
}

int64_t MoeSpec::fc1_rows() const {
  return activation_is_gated(activation.kind) ? 2 * intermediate : intermediate;
}

LocalProblem derive_local(const MoeSpec& spec) {
  // Guards the divisions below (and every caller) against a spec that was never validated.
  spec.validate_or_throw();
  LocalProblem p;
  p.num_experts_global = spec.num_experts;
  p.num_experts = spec.num_experts / spec.ep_size;
  p.first_expert = p.num_experts * spec.ep_rank;
  p.top_k = spec.top_k;
  p.hidden = spec.hidden;
  p.intermediate = spec.intermediate / spec.tp_size;
  p.intermediate_offset = p.intermediate * spec.tp_rank;
  p.fc1_rows = activation_is_gated(spec.activation.kind) ? 2 * p.intermediate : p.intermediate;
  p.adds_fc2_bias = spec.fc2_bias && spec.tp_rank == 0;
  return p;
}

}  // namespace moekit
