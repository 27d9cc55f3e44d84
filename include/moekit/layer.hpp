// The object users hold: one MoE layer, resolved, weights prepared, workspace sized once.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "moekit/registry.hpp"

namespace moekit {

struct LayerOptions {
  std::string backend = "auto";              // "auto", a family, or an implementation id
  int device_index = 0;                      // CUDA device for device implementations
  const Environment* environment = nullptr;  // null: Environment::detected()
  // A tuning file (`moekit tune --out`); empty: the path in $MOEKIT_TUNING_FILE, if set. Its
  // entries for this layer replace the engine's built-in tactic at their token buckets. An
  // unreadable or malformed file, another environment's file, an unknown tactic or a bad entry
  // never fails the build: each problem (file, entry, reason) goes to
  // resolution().tuning.problems and the built-in pick runs there.
  std::string tuning_file;
  // The data-parallel factor the file was tuned with (`moekit tune --dp-factor`): the buckets
  // looked up are tuning_buckets(max_tokens, tuning_dp_factor). Below 1: Error(kInvalidArgument).
  int64_t tuning_dp_factor = 1;
};

class MoeLayer {
 public:
  // Validates spec (sizes included), resolves, and only then checks the weights against the spec
  // (formats fixed here) and prepares the engine. Throws Error before allocating anything when the
  // spec is invalid (kInvalidSpec), the request cannot be met (kUnsupported, whatever the weights
  // are; the message carries the report) or the weights mismatch.
  static std::unique_ptr<MoeLayer> create(const MoeSpec& spec, const MoeWeights& weights,
                                          const LayerOptions& options = {});

  // Views must live where implementation().device() says. Validates shapes and dtypes (tokens
  // <= max_tokens; for kExternal routing on the host, ids in range) and throws Error naming the
  // value; device-side checks report through the engine. Allocates nothing.
  //
  // One forward at a time per layer: the engine's scratch buffers (host or device workspace) are
  // shared by every forward of the layer. A forward called while another forward of the same
  // layer is still inside this function (another thread) is refused with
  // Error(kInvalidArgument) and touches nothing; use one layer per thread. For device
  // implementations forward() returns once the work is enqueued on args.stream, so the rule
  // extends to the device: the work of two forwards of one layer must not overlap on the GPU
  // either. Enqueue every forward of a layer on one stream, or order the streams (an event)
  // so that one forward's work finishes before the next one's starts; moekit cannot see that
  // overlap and does not detect it. Different layers are independent (one per thread/stream).
  void forward(const ForwardArgs& args);

  // Device-side errors of earlier forwards (bad caller-supplied ids were dropped, not read out of
  // bounds): synchronizes with the engine's work, then ok or the first error, naming the value.
  Status poll_errors() { return engine_->poll_errors(); }

  // Runs one forward per token bucket the layer can see (tuning_buckets(max_tokens)) on scratch
  // inputs of its own, on a stream of its own, and waits for them: every kernel and tactic those
  // forwards reach has then been loaded and launched once, so that a CUDA graph captured later
  // needs nothing new. Call it before capturing, outside any capture (it allocates its scratch
  // and synchronizes). The engines already load their kernels at build, so a first forward
  // without it is correct and capturable too; warmup() also takes the first launch costs out of
  // the first timed or captured forwards. Host implementations: nothing to do. Errors as
  // forward() (a forward of the layer running in another thread: kInvalidArgument), and
  // Error(kCuda) from the scratch allocation.
  void warmup();

  // The named tactics the engine built for `gemm` (Engine::tactics; empty for the CPU
  // reference), and a replacement of the choices a tuning file made (Engine::set_tactics, names
  // from tactics(); an unknown name fails the forward that reaches it with Error(kNotFound)):
  // what `moekit tune` times. Not while a forward or a captured graph of the layer is pending.
  std::vector<std::string> tactics(Gemm gemm) const { return engine_->tactics(gemm); }
  void set_tactics(const TacticChoices& choices) { engine_->set_tactics(choices); }
  // Engine::tactics_apply: false at token counts where a fused path keeps its own kernels.
  bool tactics_apply(Gemm gemm, int64_t tokens) const {
    return engine_->tactics_apply(gemm, tokens);
  }
  // Engine::builtin_tactic: the engine's own pick for `gemm` at `tokens` tokens, or empty.
  std::string builtin_tactic(Gemm gemm, int64_t tokens) const {
    return engine_->builtin_tactic(gemm, tokens);
  }

  const MoeSpec& spec() const { return spec_; }
  const Resolution& resolution() const { return resolution_; }
  const Implementation& implementation() const { return *resolution_.chosen; }
  std::size_t workspace_bytes() const { return engine_->workspace_bytes(); }

 private:
  MoeLayer() = default;
  MoeSpec spec_;
  Resolution resolution_;
  std::unique_ptr<Engine> engine_;
  int device_index_ = 0;  // where device views must live
  // Set while a forward is inside the engine.
  std::atomic<bool> in_forward_{false};
};

}  // namespace moekit
