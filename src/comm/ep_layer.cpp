// EpLayer: dispatch -> local experts (any MoeLayer) -> combine, built collectively.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/dispatch.hpp"
#include "comm/ep_internal.hpp"
#include "common/host_activations.hpp"
#include "moekit/ep.hpp"
#include "routing/routing.hpp"

namespace moekit {
namespace {

[[noreturn]] void invalid(const std::string& sentence) {
  throw Error(ErrorCode::kInvalidArgument, sentence);
}

// What every rank tells the others once, at build time.
struct RankReport {
  ErrorCode code = ErrorCode::kOk;
  std::string message, strategy, implementation, fingerprint, spec;
};

constexpr char kSep = '\x1f';

std::vector<uint8_t> encode(const RankReport& r) {
  std::string s = std::to_string(static_cast<int>(r.code));
  for (const std::string* f : {&r.message, &r.strategy, &r.implementation, &r.fingerprint, &r.spec})
    s += kSep + *f;
  return {s.begin(), s.end()};
}

RankReport decode(const std::vector<uint8_t>& blob, int rank) {
  std::vector<std::string> f(1);
  for (uint8_t c : blob) {
    if (c == static_cast<uint8_t>(kSep))
      f.emplace_back();
    else
      f.back() += static_cast<char>(c);
  }
  if (f.size() != 6)
    throw Error(ErrorCode::kComm,
                "rank " + std::to_string(rank) + " sent a malformed build report");
  RankReport r;
  r.code = static_cast<ErrorCode>(std::atoi(f[0].c_str()));
  r.message = f[1], r.strategy = f[2], r.implementation = f[3], r.fingerprint = f[4], r.spec = f[5];
  return r;
}

// Exchanges the reports; then every rank throws the same way when one failed or they differ.
void agree(comm::Communicator& comm, const RankReport& mine) {
  std::vector<std::vector<uint8_t>> blobs;
  throw_if_error(comm.exchange_host(encode(mine), &blobs));
  std::vector<RankReport> all;
  for (int r = 0; r < comm.world_size(); ++r) all.push_back(decode(blobs[r], r));
  if (mine.code != ErrorCode::kOk) throw Error(mine.code, mine.message);  // its own error
  for (int r = 0; r < comm.world_size(); ++r) {
    if (all[r].code != ErrorCode::kOk)
      throw Error(ErrorCode::kComm,
                  "rank " + std::to_string(r) +
                      " could not build its share of the layer: " + all[r].message);
  }
  const std::pair<const char*, std::string RankReport::*> fields[] = {
      {"EP strategy", &RankReport::strategy},
      {"implementation", &RankReport::implementation},
      {"environment fingerprint", &RankReport::fingerprint},
      {"spec", &RankReport::spec}};
  for (int r = 1; r < comm.world_size(); ++r) {
    for (const auto& [name, field] : fields) {
      if (all[r].*field != all[0].*field)
        throw Error(ErrorCode::kComm, std::string("ranks disagree on the ") + name +
                                          ": rank 0 has '" + all[0].*field + "', rank " +
                                          std::to_string(r) + " has '" + all[r].*field + "'");
    }
  }
}

// The spec every rank must share: its own placement left out.
std::string shared_spec_text(MoeSpec s) {
  s.ep_rank = s.tp_rank = 0;
  return spec_to_json(s);
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Bytes of a per-rank list that cross the rank boundary: all but `self`'s.
int64_t crossing(const std::vector<int64_t>& bytes, int self) {
  int64_t n = 0;
  for (size_t r = 0; r < bytes.size(); ++r) n += static_cast<int>(r) == self ? 0 : bytes[r];
  return n;
}

}  // namespace

namespace ep_internal {

std::vector<int64_t> scaled(const std::vector<int64_t>& counts, int64_t bytes) {
  std::vector<int64_t> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out[i] = counts[i] * bytes;
  return out;
}

void count_all_to_all_bytes(const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows, int64_t row_bytes, int64_t top_k,
                            int self, bool with_counts, EpForwardStats* stats) {
  const int64_t out_bytes = row_bytes + 8 * top_k;
  const int64_t counts = with_counts ? 8 * (static_cast<int64_t>(send_rows.size()) - 1) : 0;
  stats->bytes_sent = counts + crossing(scaled(send_rows, out_bytes), self) +
                      crossing(scaled(recv_rows, row_bytes), self);
  stats->bytes_received = counts + crossing(scaled(recv_rows, out_bytes), self) +
                          crossing(scaled(send_rows, row_bytes), self);
}

}  // namespace ep_internal

std::unique_ptr<EpLayer> EpLayer::create(const MoeSpec& spec, const MoeWeights& weights,
                                         std::shared_ptr<comm::Communicator> comm,
                                         const EpLayerOptions& options) {
  if (!comm) invalid("EpLayer::create without a communicator");
  const Environment& env = options.environment ? *options.environment : Environment::detected();
  const int world = comm->world_size();
  std::unique_ptr<EpLayer> layer(new EpLayer());
  RankReport mine;
  mine.fingerprint = env.fingerprint();
  // Nothing is allocated before every rank agrees.
  try {
    layer->spec_ = comm::spec_for_rank(spec, comm->rank(), world);
    mine.spec = shared_spec_text(layer->spec_);
    MoeSpec& local = layer->local_spec_;
    local = layer->spec_;
    local.routing = RoutingParams{};
    local.routing.method = RoutingMethod::kExternal;  // the token's rank routed it
    local.routing.weight_placement = layer->spec_.routing.weight_placement;
    local.max_tokens = layer->spec_.max_tokens * world;  // every row this rank can receive
    local.validate_or_throw();
    check_weights(layer->spec_, weights);
    const Resolution r = resolve(local, env, options.backend);
    if (!r.ok())
      throw Error(ErrorCode::kUnsupported,
                  "No implementation can run this rank's experts for backend '" + options.backend +
                      "'\n" + r.table());
    mine.implementation = r.chosen->id();
    if (r.chosen->device() == Device::kCuda && options.device_index != comm->device_index())
      invalid("device_index " + std::to_string(options.device_index) + " is not GPU " +
              std::to_string(comm->device_index()) + ", the one the communicator is bound to");
    if (r.chosen->device() != comm->device())
      throw Error(ErrorCode::kUnsupported,
                  r.chosen->id() + " runs on the " +
                      (r.chosen->device() == Device::kHost ? "host" : "GPU") + " but the " +
                      comm->transport() + " communicator moves " +
                      (comm->device() == Device::kHost ? "host" : "GPU") + " memory");
    EpContext ctx;
    ctx.world_size = world;
    ctx.tp_size = layer->spec_.tp_size;
    ctx.device = r.chosen->device();
    ctx.transport_graph_capturable = comm->graph_capturable();
    ctx.max_tokens = layer->spec_.max_tokens;
    layer->selection_ = select_ep_strategy(ctx, options.strategy);
    if (!layer->selection_.ok()) {
      std::string why = "no EP strategy can run this layer";
      if (options.strategy != "auto") {
        for (const EpCandidate& c : layer->selection_.candidates) {
          if (to_string(c.strategy) == options.strategy && c.rejection)
            why = "EP strategy " + options.strategy + " is not eligible (" +
                  to_string(c.rejection->reason) + "): " + c.rejection->sentence;
        }
      }
      throw Error(ErrorCode::kUnsupported, why + "\n" + layer->selection_.table());
    }
    mine.strategy = to_string(*layer->selection_.chosen);
  } catch (const Error& e) {
    mine.code = e.code();
    mine.message = e.what();
  }
  agree(*comm, mine);

  // Build: allocation happens here, then every rank learns whether every other one succeeded.
  RankReport built = mine;
  try {
    LayerOptions lo;
    lo.backend = mine.implementation;
    lo.device_index = options.device_index;
    lo.environment = &env;
    if (weights.routing_bias.empty()) {
      layer->local_ = MoeLayer::create(layer->local_spec_, weights, lo);
    } else {  // the bias steers routing, done here on the token's rank
      MoeWeights experts_only = weights;
      layer->routing_bias_ = std::move(experts_only.routing_bias);
      experts_only.routing_bias.clear();
      layer->local_ = MoeLayer::create(layer->local_spec_, experts_only, lo);
    }
    if (layer->local_->implementation().device() == Device::kCuda) {
      layer->create_device_state(options.device_index);
    } else {
      layer->create_host_buffers();
    }
  } catch (const Error& e) {
    built.code = e.code();
    built.message = e.what();
  } catch (const std::bad_alloc&) {
    built.code = ErrorCode::kInvalidArgument;
    built.message = "host buffers for max_tokens " + std::to_string(layer->spec_.max_tokens) +
                    " x " + std::to_string(world) + " ranks do not fit in memory";
  }
  try {
    agree(*comm, built);
  } catch (...) {
    layer->release();  // what was made goes; nothing half-built is returned
    throw;
  }
  layer->comm_ = std::move(comm);
  layer->time_stages_ = options.time_stages;
  return layer;
}

void EpLayer::create_host_buffers() {
  const auto rows = static_cast<size_t>(local_spec_.max_tokens);
  const int64_t H = spec_.hidden, k = spec_.top_k;
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(spec_.act_dtype);
  const auto own = static_cast<size_t>(spec_.max_tokens);
  for (auto* v : {&send_rows_, &recv_rows_, &partial_rows_}) v->resize(rows * row_bytes);
  for (auto* v : {&send_ids_, &recv_ids_}) v->resize(rows * k);
  for (auto* v : {&send_weights_, &recv_weights_}) v->resize(rows * k);
  for (auto* v : {&partial_f32_, &returned_f32_, &out_f32_}) v->resize(rows * H);
  ids_.resize(own * k);
  weights_.resize(own * k);
}

void EpLayer::release() {
  device_.reset();
  local_.reset();
  for (auto* v : {&send_rows_, &recv_rows_, &partial_rows_}) std::vector<uint8_t>().swap(*v);
  for (auto* v : {&ids_, &send_ids_, &recv_ids_}) std::vector<int32_t>().swap(*v);
  for (auto* v :
       {&weights_, &send_weights_, &recv_weights_, &partial_f32_, &returned_f32_, &out_f32_})
    std::vector<float>().swap(*v);
}

Status EpLayer::poll_errors() {
  if (!local_) return Status(ErrorCode::kInvalidArgument, "poll_errors on a released EpLayer");
  // A communicator broken by a peer that died or stalled (a wait or the transport's watchdog):
  // the forwards since are not to be trusted.
  if (comm_->state() == comm::Communicator::State::kBroken) return comm_->usable("poll_errors");
  return device_ ? poll_device_errors() : Status{};
}

void EpLayer::forward(const ForwardArgs& a) {
  if (!local_) invalid("forward on a released EpLayer");
  if (device_) return forward_device(a);
  const int64_t H = spec_.hidden, k = spec_.top_k, E = spec_.num_experts;
  auto check = [&](const TensorView& v, const char* name, DType dtype, int64_t cols) {
    if (v.device != Device::kHost)
      invalid(std::string(name) + " is on a GPU but this rank's experts run on the host");
    if (v.dtype != dtype || v.shape.size() != 2 || v.shape[1] != cols ||
        (v.data == nullptr && v.shape[0] != 0))
      invalid(std::string(name) + " must be a [tokens, " + std::to_string(cols) + "] " +
              to_string(dtype) + " host tensor");
  };
  check(a.hidden, "hidden", spec_.act_dtype, H);
  const int64_t T = a.hidden.shape[0];
  if (T < 0 || T > spec_.max_tokens)
    invalid("tokens " + std::to_string(T) + " exceed the layer's max_tokens " +
            std::to_string(spec_.max_tokens));
  check(a.output, "output", spec_.act_dtype, H);
  if (a.output.shape[0] != T)
    invalid("output has " + std::to_string(a.output.shape[0]) + " rows, hidden " +
            std::to_string(T));
  if (spec_.routing.method == RoutingMethod::kExternal) {
    check(a.topk_ids, "topk_ids", DType::kInt32, k);
    check(a.topk_weights, "topk_weights", DType::kFloat32, k);
    if (a.topk_ids.shape[0] != T || a.topk_weights.shape[0] != T)
      invalid("topk_ids / topk_weights need " + std::to_string(T) + " rows");
    std::copy_n(a.topk_ids.as<const int32_t>(), T * k, ids_.data());
    std::copy_n(a.topk_weights.as<const float>(), T * k, weights_.data());
    throw_if_error(routing::validate_ids_host(T, E, k, ids_.data()));
  } else {
    check(a.router_logits, "router_logits", DType::kFloat32, E);
    if (a.router_logits.shape[0] != T) invalid("router_logits need " + std::to_string(T) + " rows");
    throw_if_error(
        routing::route_host(spec_.routing, T, E, k, a.router_logits.as<const float>(),
                            spec_.routing.correction_bias ? routing_bias_.data() : nullptr,
                            ids_.data(), weights_.data()));
  }
  if (*selection_.chosen == EpStrategy::kAllToAll)
    forward_all_to_all(T, a.hidden.data, ids_.data(), weights_.data(), a.output);
  else
    forward_all_gather(T, a.hidden.data, ids_.data(), weights_.data(), a.output);
}

void EpLayer::local_forward(int64_t rows, const void* hidden, const int32_t* ids,
                            const float* weights, float* out) {
  const int64_t H = spec_.hidden, k = spec_.top_k;
  ForwardArgs f;
  f.hidden = host_view(const_cast<void*>(hidden), spec_.act_dtype, {rows, H});
  f.topk_ids = host_view(const_cast<int32_t*>(ids), DType::kInt32, {rows, k});
  f.topk_weights = host_view(const_cast<float*>(weights), DType::kFloat32, {rows, k});
  f.output = host_view(partial_rows_.data(), spec_.act_dtype, {rows, H});
  local_->forward(f);
  view_to_f32(f.output, out);
}

void EpLayer::forward_all_to_all(int64_t T, const void* hidden, const int32_t* ids,
                                 const float* weights, const TensorView& output) {
  const int n = comm_->world_size();
  const int64_t H = spec_.hidden, k = spec_.top_k;
  const int64_t row_bytes = H * static_cast<int64_t>(dtype_size(spec_.act_dtype));
  const int me = comm_->rank();
  stats_ = EpForwardStats{};
  Clock::time_point t = Clock::now();
  comm::DispatchPlan plan;
  throw_if_error(comm::plan_dispatch({spec_.num_experts, spec_.ep_size}, T, k, ids, &plan));
  // Counts first, so every rank knows what it receives.
  std::vector<int64_t> recv_counts(n), eight(n, 8);
  throw_if_error(
      comm_->all_to_all_v(plan.send_counts.data(), eight, recv_counts.data(), eight, nullptr));
  using ep_internal::scaled;
  comm::pack_rows(plan, hidden, row_bytes, send_rows_.data());
  comm::pack_rows(plan, ids, k * 4, send_ids_.data());
  comm::pack_rows(plan, weights, k * 4, send_weights_.data());
  throw_if_error(comm_->all_to_all_v({{send_rows_.data(), scaled(plan.send_counts, row_bytes),
                                       recv_rows_.data(), scaled(recv_counts, row_bytes)},
                                      {send_ids_.data(), scaled(plan.send_counts, k * 4),
                                       recv_ids_.data(), scaled(recv_counts, k * 4)},
                                      {send_weights_.data(), scaled(plan.send_counts, k * 4),
                                       recv_weights_.data(), scaled(recv_counts, k * 4)}},
                                     nullptr));
  stats_.dispatch_ms = ms_since(t);
  int64_t received = 0;
  for (int64_t c : recv_counts) received += c;
  t = Clock::now();
  local_forward(received, recv_rows_.data(), recv_ids_.data(), recv_weights_.data(),
                partial_f32_.data());
  stats_.experts_ms = ms_since(t);
  t = Clock::now();
  // The results go back the way the rows came, in act_dtype, into send_rows_ (free again).
  throw_if_error(comm_->all_to_all_v(partial_rows_.data(), scaled(recv_counts, row_bytes),
                                     send_rows_.data(), scaled(plan.send_counts, row_bytes),
                                     nullptr));
  view_to_f32(host_view(send_rows_.data(), spec_.act_dtype, {plan.total_rows(), H}),
              returned_f32_.data());
  comm::combine_rows(plan, returned_f32_.data(), T, H, out_f32_.data());
  f32_to_view(out_f32_.data(), output);
  stats_.combine_ms = ms_since(t);
  stats_.rows_computed = received;
  ep_internal::count_all_to_all_bytes(plan.send_counts, recv_counts, row_bytes, k, me,
                                      /*with_counts=*/true, &stats_);
}

void EpLayer::forward_all_gather(int64_t T, const void* hidden, const int32_t* ids,
                                 const float* weights, const TensorView& output) {
  const int n = comm_->world_size();
  const int64_t H = spec_.hidden, k = spec_.top_k;
  const int64_t row_bytes = H * static_cast<int64_t>(dtype_size(spec_.act_dtype));
  stats_ = EpForwardStats{};
  Clock::time_point t = Clock::now();
  std::vector<int64_t> tokens_of(n);
  throw_if_error(comm_->all_gather(&T, 8, tokens_of.data(), nullptr));
  const comm::GatherPlan plan = comm::plan_gather(tokens_of);
  const int64_t P = plan.padded;
  // This rank's rows padded to P: zero rows routed to experts 0..k-1 with weight 0 (valid ids,
  // results discarded).
  if (T > 0) std::memcpy(send_rows_.data(), hidden, T * row_bytes);
  std::fill(send_rows_.begin() + T * row_bytes, send_rows_.begin() + P * row_bytes, 0);
  std::copy_n(ids, T * k, send_ids_.data());
  std::copy_n(weights, T * k, send_weights_.data());
  for (int64_t t = T; t < P; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      send_ids_[t * k + j] = static_cast<int32_t>(j);
      send_weights_[t * k + j] = 0.0f;
    }
  }
  throw_if_error(comm_->all_gather({{send_rows_.data(), P * row_bytes, recv_rows_.data()},
                                    {send_ids_.data(), P * k * 4, recv_ids_.data()},
                                    {send_weights_.data(), P * k * 4, recv_weights_.data()}},
                                   nullptr));
  stats_.dispatch_ms = ms_since(t);
  t = Clock::now();
  local_forward(plan.rows(), recv_rows_.data(), recv_ids_.data(), recv_weights_.data(),
                partial_f32_.data());
  stats_.experts_ms = ms_since(t);
  t = Clock::now();
  throw_if_error(comm_->reduce_scatter_sum(partial_f32_.data(), P * H, out_f32_.data(), nullptr));
  f32_to_view(out_f32_.data(), output);
  stats_.combine_ms = ms_since(t);
  stats_.rows_computed = plan.rows();
  // The count, the padded rows, ids and weights to every peer; fp32 partial sums of each peer's
  // rows to it.
  stats_.bytes_sent = stats_.bytes_received = (n - 1) * (8 + P * (row_bytes + 8 * k) + P * H * 4);
}

}  // namespace moekit
