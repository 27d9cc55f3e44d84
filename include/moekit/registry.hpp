// Implementations declare what they can do as plain data; the resolver picks one and explains.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/environment.hpp"
#include "moekit/spec.hpp"
#include "moekit/status.hpp"
#include "moekit/tensor.hpp"
#include "moekit/tune.hpp"
#include "moekit/types.hpp"
#include "moekit/weights.hpp"

namespace moekit {

// Why a candidate was rejected; checks run in this order, so a format or SM mismatch is never
// blamed on the build.
enum class RejectStage : int {
  kFormat = 1,         // weight format / activation dtype not supported
  kGpuGeneration = 2,  // no GPU, or its SM outside the supported range
  kBuild = 3,          // this build lacks CUDA / CUTLASS / NCCL
  kActivation = 4,     // activation kind, clamp, alpha/beta
  kRouting = 5,        // routing method
  kFeature = 6,        // biases, LoRA, all-to-all, graph capture
  kAlignment = 7,      // shapes not multiples of what the kernels need
  kLimits = 8,         // max tokens, experts, top-k
  kParallelism = 9,    // TP / EP layout
};
const char* to_string(RejectStage s);
std::optional<RejectStage> reject_stage_from_string(std::string_view s);

struct Rejection {
  RejectStage stage;
  std::string reason;  // one sentence with the values
};

// The result of a check: eligible, or rejected with a stage and a reason. A rejection cannot be
// made without both.
class Eligibility {
 public:
  static Eligibility eligible() { return Eligibility(); }
  static Eligibility rejected(RejectStage stage, std::string reason) {
    Eligibility e;
    e.rejection_ = Rejection{stage, std::move(reason)};
    return e;
  }
  bool ok() const { return !rejection_.has_value(); }
  const Rejection& rejection() const { return *rejection_; }

 private:
  Eligibility() = default;
  std::optional<Rejection> rejection_;
};

// What an implementation supports, as plain data. Empty lists mean "none".
struct Capability {
  int sm_min = 0, sm_max = 0;  // both 0: runs without a GPU
  bool needs_cuda = false, needs_cutlass = false, needs_nccl = false;
  std::vector<WeightFormat> weight_formats;
  std::vector<DType> act_dtypes;
  // kInt8Group / kInt4Group (WeightQuant): the group sizes it runs (empty: none), and whether it
  // runs their zero points and their AWQ pre-quant scale. Not read for other formats.
  std::vector<int> int_group_sizes;
  bool int_zero_points = false;
  bool int_pre_quant_scale = false;
  std::vector<ActivationKind> activations;
  std::vector<RoutingMethod> routings;
  // Applies RoutingParams::weight_placement kInput (the weight on the experts' input, Llama-4);
  // every implementation applies kOutput.
  bool router_weight_on_input = false;
  bool clamp = false;       // ActivationParams::limit
  bool alpha_beta = false;  // ActivationParams::alpha / beta
  bool fc1_bias = false, fc2_bias = false;
  bool lora = false;
  bool all_to_all = false;
  bool cuda_graph_safe = false;
  bool tensor_parallel = true, expert_parallel = true;
  int64_t hidden_multiple = 1;        // hidden must be a multiple of this
  int64_t intermediate_multiple = 1;  // local intermediate must be a multiple of this
  int64_t max_tokens = 0, max_experts = 0, max_top_k = 0;  // 0: no limit
};

// Arguments of one forward. Views are host or device memory, as the implementation requires
// (Implementation::device()). hidden [T, H] act_dtype; output [T, H] act_dtype.
// Routing input: router_logits [T, E] fp32, or for kExternal topk_ids [T, k] int32 (global
// expert ids) with topk_weights [T, k] fp32.
// NaN and Inf stay in their token: a NaN or Inf in one token's hidden row, or in one of its
// kExternal routing weights, may make that token's output NaN / Inf, and never changes any
// other token's output (every implementation computes each token's rows on their own and adds
// nothing across tokens). A NaN router logit counts as -inf (RoutingMethod), so it changes only
// its own token's choice. A NaN / Inf in an expert's weights or biases reaches the tokens routed
// to that expert (on this rank), and only those.
struct ForwardArgs {
  TensorView hidden;
  TensorView router_logits;
  TensorView topk_ids;
  TensorView topk_weights;
  TensorView output;
  void* stream = nullptr;  // cudaStream_t for device implementations
};

// A prepared layer of one implementation: weights in its own layout, workspace sized once.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual void forward(const ForwardArgs& args) = 0;
  virtual std::size_t workspace_bytes() const = 0;
  // Errors the device found in earlier forwards (e.g. a caller-supplied expert id out of range,
  // which the kernels dropped). Waits for the engine's pending work; never called by forward().
  virtual Status poll_errors() { return {}; }
  // The named tactics this engine built for `gemm` that it can run there (what a tuning file's
  // entries are checked against); empty for engines without tactics (the CPU reference).
  virtual std::vector<std::string> tactics(Gemm /*gemm*/) const { return {}; }
  // Tuned choices (names from tactics()) that replace the built-in pick at their buckets; called
  // by MoeLayer::create before any forward. Engines without tactics ignore it.
  virtual void set_tactics(const TacticChoices& /*choices*/) {}
  // Whether a choice of tactics for `gemm` (set_tactics) can change a forward of `tokens` tokens:
  // false where a fused path runs its own kernels there (the BF16 engine's one-token slices and
  // chained decode). `moekit tune` measures nothing at such buckets.
  virtual bool tactics_apply(Gemm /*gemm*/, int64_t /*tokens*/) const { return true; }
  // The tactic the engine runs for `gemm` at `tokens` tokens without tuned choices (its built-in
  // pick; a name from tactics()), or empty (no named tactics, or a fused path there). The tuner
  // keeps it unless another tactic is measurably faster.
  virtual std::string builtin_tactic(Gemm /*gemm*/, int64_t /*tokens*/) const { return {}; }
};

class Implementation {
 public:
  virtual ~Implementation() = default;
  virtual std::string id() const = 0;      // provider.technique.kernel.format, stable
  virtual std::string family() const = 0;  // what users ask for: "reference", "cutlass", ...
  virtual Device device() const = 0;       // where ForwardArgs views must live
  virtual const Capability& capability() const = 0;
  // Pure: reads only spec and env. The shared checks over capability() run first (in
  // RejectStage order); extra_checks() adds implementation-specific rules after them.
  Eligibility can_implement(const MoeSpec& spec, const Environment& env) const;
  virtual std::unique_ptr<Engine> create_engine(const MoeSpec& spec, const MoeWeights& weights,
                                                int device_index) const = 0;

 protected:
  virtual Eligibility extra_checks(const MoeSpec& spec, const Environment& env) const;
};

// The explicit list of implementations, highest priority first (one priority table).
const std::vector<const Implementation*>& all_implementations();
// Priority of an id in that table (0 = highest); -1 when unknown.
int priority_of(const std::string& id);
const Implementation* find_implementation(const std::string& id);

struct CandidateReport {
  std::string id;
  std::string family;
  int priority = 0;
  bool eligible = false;
  bool chosen = false;
  std::optional<Rejection> rejection;
};

struct Degradation {
  std::string requested;  // what the user asked for ("auto" never degrades)
  std::string chosen;     // what runs instead
  Rejection reason;       // the most informative rejection of what was asked for
};

struct Resolution {
  std::string request;
  const Implementation* chosen = nullptr;   // null: nothing can run it (report says why)
  std::vector<CandidateReport> candidates;  // every candidate considered, in priority order
  std::optional<Degradation> degraded_from;
  std::string environment_fingerprint;
  // What a tuning file changed (MoeLayer::create, `moekit resolve --tuning-file`); its file is
  // empty where none was given.
  TuningOutcome tuning;

  bool ok() const { return chosen != nullptr; }
  std::string table() const;  // human-readable report
  std::string json() const;   // machine-readable report (parses back with resolution_from_json)
};

// What `moekit resolve --json` prints: {"spec": spec_to_json(spec), then the fields of r.json()}.
std::string resolution_json_with_spec(const MoeSpec& spec, const Resolution& r);

// request: "auto", a family ("reference", "cutlass", ...) or an implementation id.
// "auto" takes the highest-priority eligible implementation, the CPU reference last. A family
// takes its highest-priority eligible member; if none, the result is not ok (the caller fails),
// and degraded_from names the most informative rejection of the family (a rejection other than
// format or GPU generation, else a GPU-generation one, else the first). "auto" on a machine with
// a GPU that ends on a host implementation is degraded too: degraded_from then names the
// host implementation chosen and the most informative rejection of the device ones. An unknown
// request is Error(kNotFound); an invalid spec is Error(kInvalidSpec).
Resolution resolve(const MoeSpec& spec, const Environment& env, const std::string& request);

// Reads back what Resolution::json() wrote (chosen is looked up by id in this build's table).
// Throws Error(kInvalidArgument) naming the field when the text is not such a report.
Resolution resolution_from_json(const std::string& json);

}  // namespace moekit
