// MoeLayer: built through the resolver (the only decision), weights checked against the spec,
// then the engine. Everything that can refuse does so before the engine allocates anything.
#include "moekit/layer.hpp"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "moekit/status.hpp"
#include "registry/registry_internal.hpp"
#include "routing/routing.hpp"
#include "tune/warmup.hpp"

namespace moekit {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

const char* where(Device d) { return d == Device::kHost ? "host" : "CUDA device"; }

[[noreturn]] void invalid(const std::string& sentence) {
  throw Error(ErrorCode::kInvalidArgument, sentence);
}

// The implementations' checks read GPU 0 of the environment; a layer on another device is
// resolved against an environment that lists that device first, so the resolver stays the
// only decision.
Environment with_device_first(const Environment& env, int device_index) {
  Environment e = env;
  if (device_index > 0) std::swap(e.gpus[0], e.gpus[static_cast<size_t>(device_index)]);
  return e;
}

// Holds a layer's engine for one forward (or warm-up): the engine's scratch is shared by every
// forward of the layer, so a second caller is refused rather than left to overwrite the first
// one's intermediate results.
class EngineUse {
 public:
  explicit EngineUse(std::atomic<bool>& flag) : flag_(flag) {
    if (flag_.exchange(true, std::memory_order_acquire))
      invalid(
          "forward is already running on this layer in another thread; use one layer per "
          "thread (and, for device layers, order its forwards on one stream).");
  }
  ~EngineUse() { flag_.store(false, std::memory_order_release); }
  EngineUse(const EngineUse&) = delete;
  EngineUse& operator=(const EngineUse&) = delete;

 private:
  std::atomic<bool>& flag_;
};

}  // namespace

namespace registry {
void (*forward_entered_hook)() = nullptr;
}  // namespace registry

std::unique_ptr<MoeLayer> MoeLayer::create(const MoeSpec& spec, const MoeWeights& weights,
                                           const LayerOptions& options) {
  spec.validate_or_throw();
  const Environment& env = options.environment ? *options.environment : Environment::detected();
  const int dev = options.device_index;
  if (dev < 0 || (dev > 0 && dev >= static_cast<int>(env.gpus.size())))
    invalid("device_index " + std::to_string(dev) + " is out of range: this machine has " +
            std::to_string(env.gpus.size()) + " GPU(s).");

  if (options.tuning_dp_factor < 1)
    invalid("tuning_dp_factor " + std::to_string(options.tuning_dp_factor) +
            " must be at least 1.");
  // The tuning file: the option, else the environment variable (read here, at build, once).
  std::string tuning_file = options.tuning_file;
  if (tuning_file.empty())
    if (const char* from_env = std::getenv(kTuningFileEnv)) tuning_file = from_env;

  Resolution resolution = resolve(spec, with_device_first(env, dev), options.backend);
  resolution.environment_fingerprint = env.fingerprint();
  if (!resolution.ok()) {
    std::string why =
        resolution.degraded_from ? ": " + resolution.degraded_from->reason.reason : ".";
    throw Error(ErrorCode::kUnsupported, "No implementation can run this layer for backend '" +
                                             options.backend + "'" + why + "\n" +
                                             resolution.table());
  }
  // Formats are fixed here: weights of another format are refused naming both.
  check_weights(spec, weights);

  std::unique_ptr<MoeLayer> layer(new MoeLayer());
  layer->spec_ = spec;
  layer->device_index_ = dev;
  layer->resolution_ = std::move(resolution);
  registry::count_engine_created();
  layer->engine_ = layer->resolution_.chosen->create_engine(spec, weights, dev);
  if (!layer->engine_)
    throw Error(ErrorCode::kInternal,
                layer->resolution_.chosen->id() + " returned no engine for an eligible layer.");
  if (!tuning_file.empty()) {
    Engine& engine = *layer->engine_;
    TuningOutcome& tuning = layer->resolution_.tuning;
    tuning = read_tuning(
        tuning_file, layer->resolution_.environment_fingerprint, spec,
        layer->resolution_.chosen->id(), [&](Gemm g) { return engine.tactics(g); },
        options.tuning_dp_factor);
    if (!tuning.chosen.empty()) engine.set_tactics(TacticChoices{tuning.chosen});
  }
  return layer;
}

void MoeLayer::warmup() {
  if (implementation().device() == Device::kHost) return;  // nothing loads lazily on the host
  const EngineUse use(in_forward_);
  tune::warm_up_device_engine(*engine_, spec_, device_index_);
}

void MoeLayer::forward(const ForwardArgs& args) {
  const Device device = implementation().device();
  const std::string impl = implementation().id();
  auto check = [&](const TensorView& v, const char* name, DType dtype,
                   const std::vector<int64_t>& shape) {
    if (v.dtype != dtype)
      invalid(std::string(name) + " has dtype " + to_string(v.dtype) + ", expected " +
              to_string(dtype) + ".");
    if (v.shape != shape)
      invalid(std::string(name) + " has shape " + shape_str(v.shape) + ", expected " +
              shape_str(shape) + ".");
    if (v.device != device)
      invalid(std::string(name) + " is in " + where(v.device) + " memory but " + impl + " reads " +
              where(device) + " memory.");
    if (device == Device::kCuda && v.device_index != device_index_)
      invalid(std::string(name) + " is on CUDA device " + std::to_string(v.device_index) +
              " but the layer was built on device " + std::to_string(device_index_) + ".");
    if (v.data == nullptr && v.numel() > 0) invalid(std::string(name) + " has no data (null).");
  };

  const TensorView& h = args.hidden;
  if (h.shape.size() != 2 || h.shape[0] < 0)
    invalid("hidden has shape " + shape_str(h.shape) + ", expected [tokens, " +
            std::to_string(spec_.hidden) + "].");
  const int64_t tokens = h.shape[0];
  if (tokens > spec_.max_tokens)
    invalid("tokens " + std::to_string(tokens) + " exceed the layer's max_tokens " +
            std::to_string(spec_.max_tokens) + ".");
  check(h, "hidden", spec_.act_dtype, {tokens, spec_.hidden});
  check(args.output, "output", spec_.act_dtype, {tokens, spec_.hidden});
  if (spec_.routing.method == RoutingMethod::kExternal) {
    check(args.topk_ids, "topk_ids", DType::kInt32, {tokens, spec_.top_k});
    check(args.topk_weights, "topk_weights", DType::kFloat32, {tokens, spec_.top_k});
    // Device ids are validated on the device by the engine, which reports through its status.
    if (device == Device::kHost)
      throw_if_error(routing::validate_ids_host(tokens, spec_.num_experts, spec_.top_k,
                                                args.topk_ids.as<const int32_t>()));
  } else {
    check(args.router_logits, "router_logits", DType::kFloat32, {tokens, spec_.num_experts});
  }
  if (tokens == 0) return;  // nothing to compute, and no engine needs to see an empty batch
  const EngineUse use(in_forward_);
  if (registry::forward_entered_hook) registry::forward_entered_hook();
  engine_->forward(args);
}

}  // namespace moekit
