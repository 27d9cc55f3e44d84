// The NCCL transport: a caller-owned ncclComm_t, or one created from the launcher's
// environment with the unique id exchanged by tcp_rendezvous. Without NCCL in the build (CUDA
// found, NCCL not) both constructors are refused. Its host waits (wait(), exchange_host) poll an
// event and NCCL's asynchronous error against a deadline (host_wait.hpp) instead of blocking, so
// that a dead or stalled peer ends in kComm; a communicator created here is then aborted, which
// ends its pending collectives on the GPU. The collectives it enqueues outside a graph capture
// are handed to a watchdog (watchdog.hpp) that does the same for work nobody in moekit waits
// for (the low-latency and all-gather forms), so that the caller's own synchronize cannot hang
// on a dead peer either. All NCCL calls hold one mutex, so an abort never races an enqueue.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "comm/host_wait.hpp"
#include "comm/watchdog.hpp"
#include "moekit/comm.hpp"
#ifdef MOEKIT_WITH_NCCL
#include <nccl.h>
#endif

namespace moekit::comm {

#ifdef MOEKIT_WITH_NCCL
namespace {

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return Status(ErrorCode::kComm, std::string(what) + " failed: " + ncclGetErrorString(r));
}
Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return Status(ErrorCode::kCuda, std::string(what) + " failed: " + cudaGetErrorString(e));
}

// Makes the communicator's GPU current for the duration of a call and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int world_size, int device, bool owned,
                   std::chrono::milliseconds wait_timeout)
      : Communicator(rank, world_size),
        comm_(comm),
        device_(device),
        owned_(owned),
        wait_timeout_(wait_timeout),
        watchdog_(std::make_unique<Watchdog>(wait_timeout, rank,
                                             [this](const Status& why) { stall(why); })) {}
  ~NcclCommunicator() override { release(); }
  Device device() const override { return Device::kCuda; }
  int device_index() const override { return device_; }
  std::string transport() const override { return "nccl"; }
  bool graph_capturable() const override { return true; }

 protected:
  // NCCL has no all-to-all-v: a group of sends and receives, one pair per peer.
  Status do_all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                         const std::vector<int64_t>& recv_bytes, void* stream) override {
    return enqueue("all_to_all_v", stream,
                   [&] { return all_to_all_v_locked(send, send_bytes, recv, recv_bytes, stream); });
  }
  Status all_to_all_v_locked(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                             const std::vector<int64_t>& recv_bytes, void* stream) {
    const auto s = static_cast<cudaStream_t>(stream);
    if (Status st = nccl_status(ncclGroupStart(), "ncclGroupStart"); !st.ok()) return st;
    int64_t out = 0, in = 0;
    Status first;
    for (int peer = 0; peer < world_size(); ++peer) {
      if (send_bytes[peer] > 0 && first.ok())
        first = nccl_status(ncclSend(static_cast<const char*>(send) + out, send_bytes[peer],
                                     ncclUint8, peer, comm_, s),
                            "ncclSend");
      if (recv_bytes[peer] > 0 && first.ok())
        first = nccl_status(
            ncclRecv(static_cast<char*>(recv) + in, recv_bytes[peer], ncclUint8, peer, comm_, s),
            "ncclRecv");
      out += send_bytes[peer];
      in += recv_bytes[peer];
    }
    const Status end = nccl_status(ncclGroupEnd(), "ncclGroupEnd");  // always closes the group
    return first.ok() ? end : first;
  }
  // The grouped forms: every part's operations in one outer group (NCCL nests groups), one
  // launch, watched once; the group is closed whatever a part returned.
  Status do_all_to_all_v_parts(const std::vector<AllToAllPart>& parts, void* stream) override {
    return enqueue("all_to_all_v", stream, [&] {
      return in_one_group([&] {
        for (const AllToAllPart& p : parts)
          if (Status st = all_to_all_v_locked(p.send, p.send_bytes, p.recv, p.recv_bytes, stream);
              !st.ok())
            return st;
        return Status{};
      });
    });
  }
  Status do_all_gather_parts(const std::vector<AllGatherPart>& parts, void* stream) override {
    return enqueue("all_gather", stream, [&] {
      return in_one_group([&] {
        for (const AllGatherPart& p : parts)
          if (Status st = all_gather_locked(p.send, p.bytes, p.recv, stream); !st.ok()) return st;
        return Status{};
      });
    });
  }
  template <class Body>
  Status in_one_group(Body&& body) {
    if (Status st = nccl_status(ncclGroupStart(), "ncclGroupStart"); !st.ok()) return st;
    const Status first = body();
    const Status end = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    return first.ok() ? end : first;
  }
  Status do_all_gather(const void* send, int64_t bytes, void* recv, void* stream) override {
    return enqueue("all_gather", stream,
                   [&] { return all_gather_locked(send, bytes, recv, stream); });
  }
  Status all_gather_locked(const void* send, int64_t bytes, void* recv, void* stream) {
    return nccl_status(
        ncclAllGather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)),
        "ncclAllGather");
  }
  Status do_reduce_scatter_sum(const float* send, int64_t count, float* recv,
                               void* stream) override {
    return enqueue("reduce_scatter_sum", stream, [&] {
      return nccl_status(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_,
                                           static_cast<cudaStream_t>(stream)),
                         "ncclReduceScatter");
    });
  }

  // One collective's NCCL calls (`body`) under the lock, on this GPU; refused once aborted.
  // Outside a graph capture its end is handed to the watchdog: an event recorded after it.
  template <class Body>
  Status enqueue(const char* what, void* stream, Body&& body) {
    DeviceGuard g(device_);
    std::shared_ptr<CUevent_st> ev;
    {
      std::lock_guard<std::mutex> lk(nccl_mutex_);
      if (comm_ == nullptr) return aborted(what);
      if (Status st = body(); !st.ok()) return st;
      const auto s = static_cast<cudaStream_t>(stream);
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(s, &capture) != cudaSuccess ||
          capture != cudaStreamCaptureStatusNone)
        return {};  // in a graph: nothing to record now (captured work is not watched)
      cudaEvent_t raw = nullptr;
      if (cudaEventCreateWithFlags(&raw, cudaEventDisableTiming) != cudaSuccess) return {};
      ev.reset(raw, [](cudaEvent_t e) { cudaEventDestroy(e); });
      if (cudaEventRecord(raw, s) != cudaSuccess) return {};
    }
    // Outside nccl_mutex_: the watchdog probes under its own lock and then takes nccl_mutex_,
    // so that is the only order the two are ever held in.
    watchdog_->watch(what, [this, ev](bool* done) {
      // The watchdog's thread ignores other threads' graph captures (a capture in global mode
      // elsewhere would otherwise forbid, and be invalidated by, its queries).
      static thread_local const bool thread_local_capture_mode = [] {
        cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
        return cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
      }();
      (void)thread_local_capture_mode;
      return probe(ev.get(), done);
    });
    return {};
  }
  // The refusal of `what` once the communicator was aborted.
  Status aborted(const std::string& what) const {
    return Status(ErrorCode::kComm, what + " on rank " + std::to_string(rank()) +
                                        ": its NCCL communicator was aborted");
  }
  // Whether the work before `ev` has finished; NCCL's asynchronous error as a failure.
  Status probe(cudaEvent_t ev, bool* done) {
    const cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) {
      *done = true;
      return {};
    }
    if (q != cudaErrorNotReady) return cuda_status(q, "cudaEventQuery");
    std::lock_guard<std::mutex> lk(nccl_mutex_);
    ncclResult_t async = ncclSuccess;
    if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress)
      return Status(ErrorCode::kComm,
                    std::string("NCCL reported \"") + ncclGetErrorString(async) + "\"");
    return {};
  }
  // The watchdog's verdict: abort (where this process owns the communicator) and break.
  void stall(const Status& why) { mark_broken(abort_for(why)); }
  // Aborts the communicator this process owns (ending its pending collectives) and says so;
  // a caller's is left to the caller.
  Status abort_for(const Status& why) {
    std::lock_guard<std::mutex> lk(nccl_mutex_);
    if (!owned_)
      return Status(ErrorCode::kComm,
                    why.message() +
                        "; the caller's NCCL communicator is left as it is: abort it "
                        "(ncclCommAbort) before using this GPU's streams again");
    if (comm_ != nullptr) {
      DeviceGuard g(device_);
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    return Status(ErrorCode::kComm, why.message() + "; its NCCL communicator is aborted");
  }
  Status do_wait(void* stream, const std::string& what) override {
    DeviceGuard g(device_);
    return wait_stream(static_cast<cudaStream_t>(stream), what);
  }
  // Waits for the work enqueued so far on `s`: an event recorded there, polled with NCCL's
  // asynchronous error until the deadline. A kComm result (timeout, NCCL error) aborts the
  // communicator where this process owns it, and says what became of it.
  Status wait_stream(cudaStream_t s, const std::string& what) {
    cudaEvent_t ev = nullptr;
    Status st =
        cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    if (!st.ok()) return st;
    st = cuda_status(cudaEventRecord(ev, s), "cudaEventRecord");
    if (st.ok())
      st = wait_until_done(
          [&](bool* done) -> Status {
            const Status p = probe(ev, done);
            if (p.ok() || p.code() != ErrorCode::kComm) return p;
            return Status(ErrorCode::kComm, "rank " + std::to_string(rank()) + ": " + p.message() +
                                                " while waiting for " + what);
          },
          wait_timeout_, rank(), what);
    cudaEventDestroy(ev);  // released once the recorded work completes (or is aborted)
    return st.code() == ErrorCode::kComm ? abort_for(st) : st;
  }
  // exchange_host's all-gathers: under the lock, refused once aborted (its own waits follow).
  Status all_gather_raw(const void* send, void* recv, size_t count, ncclDataType_t type,
                        cudaStream_t s) {
    std::lock_guard<std::mutex> lk(nccl_mutex_);
    if (comm_ == nullptr) return aborted("exchange_host");
    return nccl_status(ncclAllGather(send, recv, count, type, comm_, s), "ncclAllGather");
  }
  // Host blobs over the GPU: lengths first (all-gather of one int64), then the padded blobs.
  Status do_exchange_host(const std::vector<uint8_t>& mine,
                          std::vector<std::vector<uint8_t>>* all) override {
    DeviceGuard g(device_);
    const int n = world_size();
    cudaStream_t s = nullptr;
    if (Status st =
            cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        !st.ok())
      return st;
    void* dev = nullptr;
    Status st;
    auto finish = [&](Status result) {
      if (dev) cudaFree(dev);
      cudaStreamDestroy(s);
      return result;
    };
    std::vector<int64_t> sizes(n);
    const int64_t my_size = static_cast<int64_t>(mine.size());
    if (st = cuda_status(cudaMalloc(&dev, sizeof(int64_t) * (n + 1)), "cudaMalloc"); !st.ok())
      return finish(st);
    auto* d = static_cast<int64_t*>(dev);
    if (st = cuda_status(cudaMemcpyAsync(d + n, &my_size, 8, cudaMemcpyHostToDevice, s),
                         "cudaMemcpyAsync");
        !st.ok())
      return finish(st);
    if (st = all_gather_raw(d + n, d, 1, ncclInt64, s); !st.ok()) return finish(st);
    if (st = cuda_status(cudaMemcpyAsync(sizes.data(), d, 8 * n, cudaMemcpyDeviceToHost, s),
                         "cudaMemcpyAsync");
        !st.ok())
      return finish(st);
    if (st = wait_stream(s, "exchange_host's blob lengths"); !st.ok())
      return finish(st.code() == ErrorCode::kComm ? mark_broken(st) : st);
    cudaFree(dev);
    dev = nullptr;
    int64_t widest = 1;
    for (int64_t v : sizes) widest = std::max(widest, v);
    std::vector<uint8_t> padded(widest, 0), gathered(widest * n);
    std::memcpy(padded.data(), mine.data(), mine.size());
    if (st = cuda_status(cudaMalloc(&dev, widest * (n + 1)), "cudaMalloc"); !st.ok())
      return finish(st);
    auto* b = static_cast<uint8_t*>(dev);
    if (st = cuda_status(
            cudaMemcpyAsync(b + widest * n, padded.data(), widest, cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
        !st.ok())
      return finish(st);
    if (st = all_gather_raw(b + widest * n, b, widest, ncclUint8, s); !st.ok()) return finish(st);
    if (st = cuda_status(cudaMemcpyAsync(gathered.data(), b, widest * n, cudaMemcpyDeviceToHost, s),
                         "cudaMemcpyAsync");
        !st.ok())
      return finish(st);
    if (st = wait_stream(s, "exchange_host's blobs"); !st.ok())
      return finish(st.code() == ErrorCode::kComm ? mark_broken(st) : st);
    all->assign(n, {});
    for (int r = 0; r < n; ++r)
      (*all)[r].assign(gathered.begin() + r * widest, gathered.begin() + r * widest + sizes[r]);
    return finish({});
  }
  Status do_release() override {
    watchdog_.reset();  // its thread ends before the communicator does
    std::lock_guard<std::mutex> lk(nccl_mutex_);
    // The caller's communicator is theirs to destroy; an aborted one is gone already.
    if (!owned_ || comm_ == nullptr) return {};
    DeviceGuard g(device_);
    const ncclComm_t comm = comm_;
    comm_ = nullptr;  // a collective that comes late finds it gone
    return nccl_status(ncclCommDestroy(comm), "ncclCommDestroy");
  }

 private:
  std::mutex nccl_mutex_;  // every NCCL call on comm_, and its abort
  ncclComm_t comm_;        // null once aborted
  int device_;
  bool owned_;
  std::chrono::milliseconds wait_timeout_;
  std::unique_ptr<Watchdog> watchdog_;  // last: its thread stops before the rest goes
};

}  // namespace

std::unique_ptr<Communicator> wrap_nccl(void* nccl_comm, int device_index,
                                        std::chrono::milliseconds wait_timeout) {
  if (nccl_comm == nullptr)
    throw Error(ErrorCode::kInvalidArgument, "wrap_nccl: a null ncclComm_t");
  auto comm = static_cast<ncclComm_t>(nccl_comm);
  int rank = 0, size = 0, device = -1;
  throw_if_error(nccl_status(ncclCommUserRank(comm, &rank), "ncclCommUserRank"));
  throw_if_error(nccl_status(ncclCommCount(comm, &size), "ncclCommCount"));
  throw_if_error(nccl_status(ncclCommCuDevice(comm, &device), "ncclCommCuDevice"));
  if (device != device_index)
    throw Error(ErrorCode::kInvalidArgument, "wrap_nccl: the NCCL communicator is bound to GPU " +
                                                 std::to_string(device) + " but device_index is " +
                                                 std::to_string(device_index));
  if (wait_timeout.count() <= 0)
    throw Error(ErrorCode::kInvalidArgument,
                "wrap_nccl: a wait timeout of " + std::to_string(wait_timeout.count()) + " ms");
  return std::make_unique<NcclCommunicator>(comm, rank, size, device, /*owned=*/false,
                                            wait_timeout);
}

std::unique_ptr<Communicator> create_nccl(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  int visible = 0;
  throw_if_error(cuda_status(cudaGetDeviceCount(&visible), "cudaGetDeviceCount"));
  if (env.local_rank < 0 || env.local_rank >= visible)
    throw Error(ErrorCode::kInvalidArgument, "local rank " + std::to_string(env.local_rank) +
                                                 " names a GPU this process cannot see (" +
                                                 std::to_string(visible) + " visible)");
  // Bind the launcher's GPU, never device 0 by accident.
  throw_if_error(cuda_status(cudaSetDevice(env.local_rank), "cudaSetDevice"));
  ncclUniqueId id{};
  std::vector<uint8_t> blob;
  if (env.rank == 0) {
    throw_if_error(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    blob.assign(reinterpret_cast<const uint8_t*>(&id),
                reinterpret_cast<const uint8_t*>(&id) + sizeof id);
  }
  throw_if_error(tcp_rendezvous(env.master_addr, env.rendezvous_port, env.rank, env.world_size,
                                &blob, timeout));
  if (blob.size() != sizeof id)
    throw Error(ErrorCode::kComm, "rendezvous: an NCCL unique id of " +
                                      std::to_string(blob.size()) + " bytes (expected " +
                                      std::to_string(sizeof id) + ")");
  std::memcpy(&id, blob.data(), sizeof id);
  ncclComm_t comm = nullptr;
  const Status init =
      nccl_status(ncclCommInitRank(&comm, env.world_size, id, env.rank), "ncclCommInitRank");
  if (!init.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);  // nothing half-made stays behind
    throw Error(init);
  }
  return std::make_unique<NcclCommunicator>(comm, env.rank, env.world_size, env.local_rank,
                                            /*owned=*/true, timeout);
}

#else  // CUDA without NCCL

std::unique_ptr<Communicator> wrap_nccl(void*, int, std::chrono::milliseconds) {
  throw Error(ErrorCode::kUnsupported, "this build of moekit found no NCCL (nccl.h, libnccl)");
}
std::unique_ptr<Communicator> create_nccl(const LaunchEnv&, std::chrono::milliseconds) {
  throw Error(ErrorCode::kUnsupported, "this build of moekit found no NCCL (nccl.h, libnccl)");
}

#endif

}  // namespace moekit::comm
