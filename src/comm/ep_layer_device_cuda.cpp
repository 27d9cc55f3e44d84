// EpLayer's device path: the dispatch kernels (dispatch_device.hpp) pack this rank's tokens,
// the communicator's device collectives (NCCL) move them, the local layer runs on the GPU, and
// the combine kernel sums what comes back. Buffers are allocated once, at create().
//
// The all-to-all forms send each token's row to the ranks holding its experts and sum the
// results that come back (combine). The all-gather fallback packs this rank's tokens as one
// fixed segment of max_tokens rows (pack_dispatch with ep_size 1: bad ids dropped as the
// all-to-all forms drop them, padding rows with weight 0 and ids spread over every expert), gathers
// every rank's segment, runs the local layer on all of them (other ranks' experts skipped by the
// local layer, as on the host), widens the results to fp32, and a reduce-scatter sums each
// token's shares over every rank (TP ranks included) in fp32 on its rank; the combine kernel
// rounds this rank's rows once. Sizes are fixed: no host sync, capturable.
#include <cuda_runtime_api.h>

#include "comm/dispatch_device.hpp"
#include "comm/ep_internal.hpp"
#include "moekit/ep.hpp"
#include "pipeline/engine_support.hpp"

namespace moekit {

struct EpLayer::DeviceState {
  int device = 0;
  std::vector<pipeline::DeviceMemory> memory;
  void *send_rows = nullptr, *recv_rows = nullptr, *partial_rows = nullptr,
       *returned_rows = nullptr;
  int32_t *send_ids = nullptr, *recv_ids = nullptr, *row_of = nullptr, *ids = nullptr;
  float *send_weights = nullptr, *recv_weights = nullptr, *weights = nullptr;
  // All-gather: the local layer's results widened, [world * max_tokens, H]; the reduce-scatter
  // sums in place, this rank's rows at rank * max_tokens.
  float* partial_f32 = nullptr;
  int64_t *send_counts = nullptr, *recv_counts = nullptr;
  unsigned long long* error_word = nullptr;
  const float* routing_bias = nullptr;
  routing::DeviceRouting routing;  // routing methods other than kExternal
  // Pinned host [2 * world]: the normal form's send and receive counts, read after its one wait.
  int64_t* counts_host = nullptr;
  // Stage boundaries (EpLayerOptions::time_stages): before dispatch, after it, after the
  // experts, after combine.
  cudaEvent_t stage[4] = {nullptr, nullptr, nullptr, nullptr};

  ~DeviceState() {
    if (counts_host != nullptr) cudaFreeHost(counts_host);
    for (cudaEvent_t e : stage) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  template <class T>
  T* alloc(int64_t count, const char* what) {
    memory.push_back(pipeline::device_alloc(static_cast<std::size_t>(count) * sizeof(T), what));
    return static_cast<T*>(memory.back().get());
  }
};

void EpLayer::DeviceStateDeleter::operator()(DeviceState* s) const {
  if (s == nullptr) return;
  int previous = 0;  // free on the state's GPU, whatever the caller's current one is
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != s->device &&
                        cudaSetDevice(s->device) == cudaSuccess;
  delete s;
  if (switched) cudaSetDevice(previous);
}

void EpLayer::create_device_state(int device_index) {
  DeviceGuard guard(device_index);
  std::unique_ptr<DeviceState, DeviceStateDeleter> d(new DeviceState);
  d->device = device_index;
  const bool gathers = *selection_.chosen == EpStrategy::kAllGatherReduceScatter;
  // All-gather: one fixed segment of this rank's tokens, sent to every rank alike.
  const int n = gathers ? 1 : spec_.ep_size;
  const int64_t k = spec_.top_k, H = spec_.hidden, T = spec_.max_tokens;
  const int64_t rows = local_spec_.max_tokens;  // T x ranks: sent or received at most
  const int64_t sent = gathers ? T : rows;
  const int64_t row_bytes = H * static_cast<int64_t>(dtype_size(spec_.act_dtype));
  d->send_rows = d->alloc<uint8_t>(sent * row_bytes, "EP send rows");
  d->recv_rows = d->alloc<uint8_t>(rows * row_bytes, "EP received rows");
  d->partial_rows = d->alloc<uint8_t>(rows * row_bytes, "EP expert results");
  if (gathers)
    d->partial_f32 = d->alloc<float>(rows * H, "EP fp32 expert results");
  else
    d->returned_rows = d->alloc<uint8_t>(rows * row_bytes, "EP returned results");
  d->send_ids = d->alloc<int32_t>(sent * k, "EP send ids");
  d->recv_ids = d->alloc<int32_t>(rows * k, "EP received ids");
  d->send_weights = d->alloc<float>(sent * k, "EP send weights");
  d->recv_weights = d->alloc<float>(rows * k, "EP received weights");
  d->row_of = d->alloc<int32_t>(T * n, "EP row map");
  d->ids = d->alloc<int32_t>(T * k, "EP routed ids");
  d->weights = d->alloc<float>(T * k, "EP routed weights");
  d->send_counts = d->alloc<int64_t>(n, "EP send counts");
  d->recv_counts = d->alloc<int64_t>(n, "EP receive counts");
  d->error_word = d->alloc<unsigned long long>(1, "EP error word");
  check_cuda(cudaMemset(d->error_word, 0xff, sizeof(unsigned long long)),
             "clearing the EP error word");
  // The fixed-segment forms (low-latency, all-gather) send every segment whole: its padding rows
  // are never packed, so they keep these zeros or an earlier forward's rows (finite, whatever
  // the local experts do with them; weight 0, and the all-gather discards their results).
  check_cuda(cudaMemset(d->send_rows, 0, static_cast<std::size_t>(sent * row_bytes)),
             "clearing the EP send rows");
  void* pinned = nullptr;
  check_cuda(cudaMallocHost(&pinned, sizeof(int64_t) * 2 * n), "allocating pinned counts");
  d->counts_host = static_cast<int64_t*>(pinned);
  for (cudaEvent_t& e : d->stage) check_cuda(cudaEventCreate(&e), "creating an EP stage event");
  if (spec_.routing.method != RoutingMethod::kExternal) {
    if (!routing_bias_.empty()) {
      float* bias = d->alloc<float>(static_cast<int64_t>(routing_bias_.size()), "EP routing bias");
      check_cuda(cudaMemcpy(bias, routing_bias_.data(), routing_bias_.size() * sizeof(float),
                            cudaMemcpyHostToDevice),
                 "uploading the routing bias");
      d->routing_bias = bias;
    }
    throw_if_error(routing::make_device_routing(
        spec_.routing, spec_.num_experts, k,
        spec_.routing.correction_bias ? d->routing_bias : nullptr, &d->routing));
    throw_if_error(routing::prepare_route_device(d->routing));
  }
  device_ = std::move(d);
}

void EpLayer::forward_device(const ForwardArgs& a) {
  DeviceState& d = *device_;
  const LocalProblem lp = derive_local(spec_);
  const int64_t T = pipeline::check_forward_views(a, spec_, lp, spec_.act_dtype, d.device);
  DeviceGuard guard(d.device);
  const auto stream = static_cast<cudaStream_t>(a.stream);
  const int world = comm_->world_size(), me = comm_->rank();
  const int64_t H = spec_.hidden, k = spec_.top_k, P = spec_.max_tokens;
  const int64_t row_bytes = H * static_cast<int64_t>(dtype_size(spec_.act_dtype));
  const EpStrategy strategy = *selection_.chosen;
  const bool gathers = strategy == EpStrategy::kAllGatherReduceScatter;
  const bool low_latency = strategy == EpStrategy::kAllToAllLowLatency;
  stats_ = EpForwardStats{};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "querying the stream's capture");
  const bool timed = time_stages_ && capture == cudaStreamCaptureStatusNone;
  auto mark = [&](int boundary) {
    if (timed) check_cuda(cudaEventRecord(d.stage[boundary], stream), "recording an EP stage");
  };
  mark(0);

  const int32_t* ids = a.topk_ids.as<const int32_t>();
  const float* weights = a.topk_weights.as<const float>();
  if (spec_.routing.method != RoutingMethod::kExternal) {
    throw_if_error(routing::route_device(d.routing, T, a.router_logits.as<const float>(), d.ids,
                                         d.weights, stream));
    ids = d.ids;
    weights = d.weights;
  }
  comm::device::DispatchShape shape;
  shape.tokens = T;
  shape.top_k = static_cast<int>(k);
  shape.num_experts = static_cast<int>(spec_.num_experts);
  shape.ep_size = gathers ? 1 : world;
  shape.row_bytes = row_bytes;
  shape.segment_rows = gathers || low_latency ? P : 0;
  if (gathers) {
    shape.pad_ids = comm::device::DispatchShape::PadIds::kRoundRobin;
    shape.pad_origin = me * P;
  }
  comm::device::DispatchBuffers b;
  b.row_of = d.row_of;
  b.send_counts = d.send_counts;
  b.send_rows = d.send_rows;
  b.send_ids = d.send_ids;
  b.send_weights = d.send_weights;
  b.error_word = d.error_word;
  throw_if_error(comm::device::pack_dispatch(shape, a.hidden.data, ids, weights, b, stream));

  // Rows to and from each peer (all-to-all forms).
  std::vector<int64_t> send_rows_to(world, P), recv_rows_from(world, P);
  using ep_internal::scaled;
  // Rows, ids and weights in one grouped collective (one NCCL launch, not three).
  if (gathers) {
    throw_if_error(comm_->all_gather({{d.send_rows, P * row_bytes, d.recv_rows},
                                      {d.send_ids, P * k * 4, d.recv_ids},
                                      {d.send_weights, P * k * 4, d.recv_weights}},
                                     stream));
  } else {
    if (!low_latency) {
      // Counts first; the one wait of the normal form sizes the receive on the host.
      const std::vector<int64_t> eight(world, 8);
      throw_if_error(comm_->all_to_all_v(d.send_counts, eight, d.recv_counts, eight, stream));
      check_cuda(
          cudaMemcpyAsync(d.counts_host, d.send_counts, 8 * world, cudaMemcpyDeviceToHost, stream),
          "reading the EP send counts");
      check_cuda(cudaMemcpyAsync(d.counts_host + world, d.recv_counts, 8 * world,
                                 cudaMemcpyDeviceToHost, stream),
                 "reading the EP receive counts");
      // Bounded: a dead or stalled peer ends in kComm (the communicator broken), not a hang.
      throw_if_error(comm_->wait(stream, "the EP row counts"));
      send_rows_to.assign(d.counts_host, d.counts_host + world);
      recv_rows_from.assign(d.counts_host + world, d.counts_host + 2 * world);
    }
    throw_if_error(comm_->all_to_all_v(
        {{d.send_rows, scaled(send_rows_to, row_bytes), d.recv_rows,
          scaled(recv_rows_from, row_bytes)},
         {d.send_ids, scaled(send_rows_to, k * 4), d.recv_ids, scaled(recv_rows_from, k * 4)},
         {d.send_weights, scaled(send_rows_to, k * 4), d.recv_weights,
          scaled(recv_rows_from, k * 4)}},
        stream));
  }
  int64_t received = 0;
  for (int64_t c : recv_rows_from) received += c;
  mark(1);

  ForwardArgs f;
  f.hidden = cuda_view(d.recv_rows, spec_.act_dtype, {received, H}, d.device);
  f.topk_ids = cuda_view(d.recv_ids, DType::kInt32, {received, k}, d.device);
  f.topk_weights = cuda_view(d.recv_weights, DType::kFloat32, {received, k}, d.device);
  f.output = cuda_view(d.partial_rows, spec_.act_dtype, {received, H}, d.device);
  f.stream = a.stream;
  local_->forward(f);
  mark(2);

  if (gathers) {
    // fp32 sums, as the host path's: the order NCCL adds the ranks in is its own, so only a
    // world of one rank equals the host bit for bit.
    throw_if_error(comm::device::widen_to_f32(spec_.act_dtype, d.partial_rows, received * H,
                                              d.partial_f32, stream));
    float* mine =
        d.partial_f32 + me * P * H;  // in place: NCCL's recvbuff = sendbuff + rank * count
    throw_if_error(comm_->reduce_scatter_sum(d.partial_f32, P * H, mine, stream));
    throw_if_error(comm::device::combine(shape, spec_.act_dtype, d.row_of, d.send_counts, mine,
                                         a.output.data, stream, /*returned_f32=*/true));
  } else {
    // The results go back the way the rows came, into the send layout the combine reads.
    throw_if_error(comm_->all_to_all_v(d.partial_rows, scaled(recv_rows_from, row_bytes),
                                       d.returned_rows, scaled(send_rows_to, row_bytes), stream));
    throw_if_error(comm::device::combine(shape, spec_.act_dtype, d.row_of, d.send_counts,
                                         d.returned_rows, a.output.data, stream));
  }
  mark(3);
  if (timed) {
    throw_if_error(comm_->wait(stream, "the timed EP forward"));
    float ms[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i)
      check_cuda(cudaEventElapsedTime(&ms[i], d.stage[i], d.stage[i + 1]), "timing EP stages");
    stats_.dispatch_ms = ms[0];
    stats_.experts_ms = ms[1];
    stats_.combine_ms = ms[2];
  }
  stats_.rows_computed = received;
  if (gathers)  // the padded rows, ids and weights to every peer; fp32 sums of each peer's rows
    stats_.bytes_sent = stats_.bytes_received = (world - 1) * P * (row_bytes + 8 * k + H * 4);
  else
    ep_internal::count_all_to_all_bytes(send_rows_to, recv_rows_from, row_bytes, k, me,
                                        /*with_counts=*/!low_latency, &stats_);
}

Status EpLayer::poll_device_errors() {
  DeviceGuard guard(device_->device);
  permute::Buffers b;
  b.error_word = device_->error_word;
  const Status mine = pipeline::poll_permute_errors(b, derive_local(spec_));
  // The local layer saw the dropped slots as id -1: poll it either way, so that it is clear.
  const Status local = local_->poll_errors();
  return mine.ok() ? local : mine;
}

}  // namespace moekit
