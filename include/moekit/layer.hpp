// The object users hold: one MoE layer, resolved, weights prepared, workspace sized once.
#pragma once
#include <memory>
#include <string>

#include "moekit/registry.hpp"

namespace moekit {

struct LayerOptions {
  std::string backend = "auto";  // "auto", a family, or an implementation id
  int device_index = 0;          // CUDA device for device implementations
  const Environment* environment = nullptr;  // null: Environment::detected()
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
  void forward(const ForwardArgs& args);

  // Device-side errors of earlier forwards (bad caller-supplied ids were dropped, not read out of
  // bounds): synchronizes with the engine's work, then ok or the first error, naming the value.
  Status poll_errors() { return engine_->poll_errors(); }

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
};

}  // namespace moekit
