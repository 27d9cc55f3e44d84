// Host-side pieces every device engine of src/pipeline shares (with common/cuda_status.hpp's
// check_cuda and DeviceGuard): device allocations, the workspace carver, the checks of the
// caller's views and of the layer's arrays, the permute's configuration and inputs, and the
// base of the engines with two grouped GEMMs. C++17.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "activation/activation_math.hpp"
#include "activation/gate_up_order.hpp"
#include "common/cuda_status.hpp"
#include "moekit/registry.hpp"
#include "permute/permute.hpp"
#include "routing/routing_device.hpp"

namespace moekit::pipeline {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceMemory = std::unique_ptr<void, CudaFree>;

inline DeviceMemory device_alloc(std::size_t bytes, const char* what) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)),
             "allocating " + std::to_string(bytes) + " bytes of " + what);
  return DeviceMemory(p);
}

// Hands out 256-byte aligned pieces of one allocation: first to size it, then to carve it.
class Carver {
 public:
  explicit Carver(char* base = nullptr) : base_(base) {}
  template <class T>
  T* take(int64_t count) {
    const std::size_t at = used_;
    used_ += (static_cast<std::size_t>(count) * sizeof(T) + 255) / 256 * 256;
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  std::size_t used() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

// Sizes `carve` (Carver& -> its pieces; it runs twice: sizing, then carving), allocates
// `memory` once for it and returns the pieces carved from that allocation.
template <class Carve>
auto carve_allocation(DeviceMemory& memory, const Carve& carve, const char* what) {
  Carver sizing;
  carve(sizing);
  memory = device_alloc(sizing.used(), what);
  Carver cut(static_cast<char*>(memory.get()));
  return carve(cut);
}

inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Throws kInvalidArgument unless `v` is a device tensor of `dtype` and `shape` on `device`.
inline void check_view(const TensorView& v, const char* name, DType dtype,
                       const std::vector<int64_t>& shape, int device, bool aligned16) {
  if (v.data == nullptr) throw Error(ErrorCode::kInvalidArgument, std::string(name) + " is null");
  if (v.device != Device::kCuda || v.device_index != device)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(name) + " must live on CUDA device " + std::to_string(device));
  if (v.dtype != dtype)
    throw Error(
        ErrorCode::kInvalidArgument,
        std::string(name) + " has dtype " + to_string(v.dtype) + ", expected " + to_string(dtype));
  if (v.shape != shape)
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + " has shape " +
                                                 shape_string(v.shape) + ", expected " +
                                                 shape_string(shape));
  if (aligned16 && reinterpret_cast<std::uintptr_t>(v.data) % 16 != 0)
    throw Error(
        ErrorCode::kInvalidArgument,
        std::string(name) + " is not 16-byte aligned (the kernels move 16 bytes at a time)");
}

// The forward's views: hidden and output [T, H] of `elem`, and the routing inputs (the caller's
// ids and weights for kExternal, else the router logits). Returns T. Throws kInvalidArgument.
inline int64_t check_forward_views(const ForwardArgs& args, const MoeSpec& spec,
                                   const LocalProblem& lp, DType elem, int device) {
  const int64_t H = lp.hidden, k = lp.top_k;
  if (args.hidden.shape.size() != 2)
    throw Error(ErrorCode::kInvalidArgument, "hidden has shape " + shape_string(args.hidden.shape) +
                                                 ", expected [tokens, " + std::to_string(H) + "]");
  const int64_t T = args.hidden.shape[0];
  if (T < 0 || T > spec.max_tokens)
    throw Error(ErrorCode::kInvalidArgument, "tokens " + std::to_string(T) +
                                                 " is outside [0, max_tokens " +
                                                 std::to_string(spec.max_tokens) + "]");
  check_view(args.hidden, "hidden", elem, {T, H}, device, true);
  check_view(args.output, "output", elem, {T, H}, device, true);
  if (spec.routing.method == RoutingMethod::kExternal) {
    check_view(args.topk_ids, "topk_ids", DType::kInt32, {T, k}, device, false);
    check_view(args.topk_weights, "topk_weights", DType::kFloat32, {T, k}, device, false);
  } else {
    check_view(args.router_logits, "router_logits", DType::kFloat32, {T, lp.num_experts_global},
               device, false);
  }
  return T;
}

// Which bias arrays the layer uploads, after checking their sizes (kInvalidArgument).
struct LayerBiases {
  bool fc1 = false, fc2 = false, routing = false;
};
inline LayerBiases check_biases(const MoeSpec& spec, const LocalProblem& lp,
                                const MoeWeights& weights) {
  LayerBiases b;
  const int64_t L = lp.num_experts, H = lp.hidden, E = lp.num_experts_global;
  b.fc1 = spec.fc1_bias;
  b.fc2 = spec.fc2_bias && lp.adds_fc2_bias;
  b.routing = spec.routing.method == RoutingMethod::kDeepSeekV3 && spec.routing.correction_bias;
  if (b.fc1 && static_cast<int64_t>(weights.fc1_bias.size()) != L * lp.fc1_rows)
    throw Error(ErrorCode::kInvalidArgument,
                "fc1_bias holds " + std::to_string(weights.fc1_bias.size()) + " values, expected " +
                    std::to_string(L * lp.fc1_rows));
  if (b.fc2 && static_cast<int64_t>(weights.fc2_bias.size()) != L * H)
    throw Error(ErrorCode::kInvalidArgument, "fc2_bias holds " +
                                                 std::to_string(weights.fc2_bias.size()) +
                                                 " values, expected " + std::to_string(L * H));
  if (b.routing && static_cast<int64_t>(weights.routing_bias.size()) != E)
    throw Error(ErrorCode::kInvalidArgument,
                "routing_bias holds " + std::to_string(weights.routing_bias.size()) +
                    " values, expected one per expert (" + std::to_string(E) + ")");
  return b;
}

// The expert weights' byte counts (values) against what the engine computed from the spec.
inline void check_expert_bytes(const MoeWeights& w, int64_t fc1_bytes, int64_t fc2_bytes) {
  if (static_cast<int64_t>(w.fc1.values.size()) != fc1_bytes ||
      static_cast<int64_t>(w.fc2.values.size()) != fc2_bytes)
    throw Error(ErrorCode::kInvalidArgument,
                "expert weights hold " + std::to_string(w.fc1.values.size()) + " / " +
                    std::to_string(w.fc2.values.size()) + " bytes, expected " +
                    std::to_string(fc1_bytes) + " / " + std::to_string(fc2_bytes));
}

// The spec's activation as the device kernels take it.
inline activation::Params activation_params(const ActivationParams& ap) {
  activation::Params p;
  p.kind = static_cast<activation::Kind>(static_cast<int>(ap.kind));
  p.limit = ap.limit.value_or(INFINITY);
  p.alpha = ap.alpha_or_default();
  p.beta = ap.beta_or_default();
  return p;
}

inline void upload(void* dst, const void* src, std::size_t bytes, const char* what) {
  if (bytes)
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
               std::string("uploading ") + what);
}

// The layer's bias arrays (those `b` says it has) into their device slots: FC1's [L, fc1_rows]
// in the engine's FC1 row order (`fc1_rows`: engine row r is the checkpoint's row fc1_rows[r],
// or null for the same order), FC2's [L, H] and the routing's [E].
struct BiasSlots {
  float *fc1, *fc2, *routing;
};
inline void upload_biases(const MoeWeights& w, const LayerBiases& b, const LocalProblem& lp,
                          const std::vector<int64_t>* fc1_rows, const BiasSlots& dst) {
  if (b.fc1) {
    std::vector<float> bias(w.fc1_bias);
    if (fc1_rows != nullptr)
      for (int64_t e = 0; e < lp.num_experts; ++e)
        activation::gather_rows(*fc1_rows, w.fc1_bias.data() + e * lp.fc1_rows,
                                bias.data() + e * lp.fc1_rows, sizeof(float));
    upload(dst.fc1, bias.data(), sizeof(float) * bias.size(), "fc1 bias");
  }
  if (b.fc2)
    upload(dst.fc2, w.fc2_bias.data(), sizeof(float) * lp.num_experts * lp.hidden, "fc2 bias");
  if (b.routing)
    upload(dst.routing, w.routing_bias.data(), sizeof(float) * lp.num_experts_global,
           "routing bias");
}

// The device routing's and the permute's limits, checked before anything is allocated (the
// routing bias is uploaded later). Throws kUnsupported naming the value.
inline void check_routing_limits(const MoeSpec& spec, const LocalProblem& lp, const char* engine) {
  RoutingParams without_bias = spec.routing;
  without_bias.correction_bias = false;
  routing::DeviceRouting probe;
  throw_if_error(
      routing::make_device_routing(without_bias, lp.num_experts_global, lp.top_k, nullptr, &probe));
  if (lp.num_experts > permute::kMaxLocalExperts)
    throw Error(ErrorCode::kUnsupported, "local experts " + std::to_string(lp.num_experts) +
                                             " exceed the " + engine + "'s " +
                                             std::to_string(permute::kMaxLocalExperts));
}

// The permute's arrays (all but the gathered rows, Buffers::permuted, which stays null) out of
// `c`, for `local_experts` experts.
inline permute::Buffers carve_permute_buffers(Carver& c, const permute::BufferCounts& n,
                                              int64_t local_experts) {
  permute::Buffers b;
  b.error_word = c.take<unsigned long long>(1);
  b.offsets_flag = c.take<uint32_t>(1);
  b.expert_done = c.take<int32_t>(local_experts + 2);
  b.topk_ids = c.take<int32_t>(n.per_slot);
  b.topk_weights = c.take<float>(n.per_slot);
  b.slot_expert = c.take<int32_t>(n.per_slot);
  b.slot_rank = c.take<int32_t>(n.per_slot);
  b.slot_row = c.take<int32_t>(n.per_slot);
  b.chunk_counts = c.take<int32_t>(n.chunk_counts);
  b.segment_totals = c.take<int32_t>(n.segment_totals);
  b.offsets = c.take<int32_t>(n.offsets);
  b.row_expert = c.take<int32_t>(n.rows);
  b.row_token = c.take<int32_t>(n.rows);
  return b;
}

// The permute's configuration for the layer: its routing (the routing bias on the device, or
// null), local experts, the caller's rows of `row_bytes`, max_tokens. Throws on a routing the
// device kernels do not run (check_routing_limits has refused it before).
inline permute::Config permute_config(const MoeSpec& spec, const LocalProblem& lp,
                                      const float* routing_bias, int64_t row_bytes) {
  permute::Config c;
  throw_if_error(routing::make_device_routing(spec.routing, lp.num_experts_global, lp.top_k,
                                              routing_bias, &c.routing));
  c.first_expert = static_cast<int>(lp.first_expert);
  c.local_experts = static_cast<int>(lp.num_experts);
  c.row_bytes = row_bytes;
  c.max_tokens = spec.max_tokens;
  return c;
}

// The permute's inputs of one forward: the caller's rows and its ids and weights (kExternal) or
// router logits.
inline permute::Inputs permute_inputs(const ForwardArgs& args, const MoeSpec& spec) {
  permute::Inputs in;
  in.hidden = args.hidden.data;
  if (spec.routing.method == RoutingMethod::kExternal) {
    in.ids = args.topk_ids.as<const int32_t>();
    in.weights = args.topk_weights.as<const float>();
  } else {
    in.logits = args.router_logits.as<const float>();
  }
  return in;
}

// The first bad caller id the permute recorded since the last poll (then cleared), after
// waiting for the device: poll_errors() of the engines.
inline Status poll_permute_errors(const permute::Buffers& b, const LocalProblem& lp) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("waiting for the device failed: ") + cudaGetErrorString(e));
  unsigned long long word = permute::kNoError;
  e = cudaMemcpy(&word, b.error_word, sizeof(word), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && word != permute::kNoError)
    e = cudaMemcpy(b.error_word, &permute::kNoError, sizeof(word), cudaMemcpyHostToDevice);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("reading the device error word failed: ") + cudaGetErrorString(e));
  return permute::decode_error(word, static_cast<int>(lp.num_experts_global),
                               static_cast<int>(lp.top_k));
}

// What an engine of two grouped GEMMs (FC1 and FC2 of type G: gemm::Fp8GroupedGemm,
// gemm::IntGroupedGemm) does the same way: its workspace (one allocation, its size with the
// GEMMs'), a test hook's poisoned span of it, the GEMMs' named tactics, a tuning file's choices
// (MoeLayer::create: at their buckets they replace the GEMM's own pick), and the permute's error
// word. The engine fills the protected members.
template <class G>
class TwoGemmEngine : public Engine {
 public:
  std::size_t workspace_bytes() const override {
    return workspace_bytes_ + fc1_->workspace_bytes() + fc2_->workspace_bytes();
  }
  Status poll_errors() override {
    DeviceGuard guard(device_);
    return poll_permute_errors(pbuf_, lp_);
  }
  std::vector<std::string> tactics(Gemm gemm) const override {
    return gemm == Gemm::kFc1 ? fc1_->tactics() : fc2_->tactics();
  }
  void set_tactics(const TacticChoices& choices) override { tuned_ = choices; }
  std::string builtin_tactic(Gemm gemm, int64_t T) const override {
    return (gemm == Gemm::kFc1 ? fc1_ : fc2_)->pick_tactic(rows_hint(T));
  }

 protected:
  explicit TwoGemmEngine(int device) : device_(device) {}
  // Rows per expert if routing were uniform at T tokens: only a hint for the GEMMs' tactics.
  double rows_hint(int64_t T) const {
    return static_cast<double>(T) * lp_.top_k / static_cast<double>(lp_.num_experts_global);
  }
  // The most rows T tokens fill here (each token once per local expert it routes to).
  int64_t rows_bound(int64_t T) const { return T * std::min<int64_t>(lp_.top_k, lp_.num_experts); }
  // The tuning file's tactic for `gemm` at T tokens, or empty (the GEMM picks).
  std::string tuned(Gemm gemm, int64_t T) const {
    const std::string* t = tuned_.find(gemm, T);
    return t ? *t : std::string();
  }
  // Sizes the workspace with `carve` (Carver& -> {the permute's Buffers, the offset where the
  // span a poison hook fills starts}; it runs twice: sizing, then carving), allocates it once,
  // zeroed, so that no kernel ever reads memory that was never written (the GEMMs' TMA tiles
  // reach past a group's last row: read, never used), carves it into pbuf_ and the engine's
  // pieces, clears the device error word, and keeps the poisoned span: from that offset to the
  // end.
  template <class Carve>
  void allocate_workspace(const Carve& carve) {
    Carver sizing;
    carve(sizing);
    workspace_bytes_ = sizing.used();
    workspace_ = device_alloc(workspace_bytes_, "the MoE workspace");
    Carver cut(static_cast<char*>(workspace_.get()));
    const auto [buffers, poison_at] = carve(cut);
    pbuf_ = buffers;
    poison_begin_ = static_cast<char*>(workspace_.get()) + poison_at;
    poison_bytes_ = workspace_bytes_ - poison_at;
    check_cuda(cudaMemset(workspace_.get(), 0, workspace_bytes_), "clearing the MoE workspace");
    check_cuda(cudaMemset(pbuf_.error_word, 0xff, sizeof(unsigned long long)),
               "clearing the device error word");
  }
  // The test hook: NaN bytes (0xff) over the poisoned span, on `stream`.
  void poison_workspace(cudaStream_t stream) const {
    check_cuda(cudaMemsetAsync(poison_begin_, 0xff, poison_bytes_, stream),
               "poisoning the engine's buffers");
  }

  TacticChoices tuned_;
  LocalProblem lp_;
  int device_;
  permute::Buffers pbuf_;
  DeviceMemory workspace_;
  std::size_t workspace_bytes_ = 0;  // the engine's own allocation
  void* poison_begin_ = nullptr;
  std::size_t poison_bytes_ = 0;
  std::unique_ptr<G> fc1_, fc2_;
};

}  // namespace moekit::pipeline
