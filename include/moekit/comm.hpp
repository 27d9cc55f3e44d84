// Communication between the ranks of an expert-parallel layer: the launcher's environment, its
// validation, and a Communicator with the few collectives expert parallelism needs, over an
// in-process host transport (tests) or NCCL (GPUs).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "moekit/spec.hpp"
#include "moekit/status.hpp"
#include "moekit/tensor.hpp"

namespace moekit::comm {

enum class Launcher : int {
  kNone = 0,      // no launcher variables: one process, world size 1
  kTorchrun = 1,  // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
  kMpirun = 2,    // OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
};
const char* to_string(Launcher l);

// torch.distributed's default MASTER_PORT, taken when MASTER_PORT is not set.
inline constexpr int kDefaultMasterPort = 29500;
// MASTER_ADDR when it is not set (one node: mpirun leaves it unset).
inline constexpr const char* kDefaultMasterAddr = "127.0.0.1";

// What the launcher says about this process.
inline constexpr std::chrono::milliseconds kDefaultCommTimeout{std::chrono::minutes(2)};
struct LaunchEnv {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // the GPU this process binds to
  std::string master_addr = kDefaultMasterAddr;
  int master_port = kDefaultMasterPort;
  // Where rank 0 serves the NCCL unique id: MOEKIT_RENDEZVOUS_PORT, else MASTER_PORT + 1
  // (torchrun's agent already serves its own store on MASTER_PORT).
  int rendezvous_port = kDefaultMasterPort + 1;
  // How long the rendezvous and any host wait on the communicator's work may take before the
  // peers are taken for dead (create_nccl's timeout): MOEKIT_COMM_TIMEOUT_MS, 1 ms to 24 h.
  std::chrono::milliseconds comm_timeout = kDefaultCommTimeout;
};

// Reads one environment variable; nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup process_env();

// Parses and validates the launcher's variables, before anything is allocated. torchrun's
// variables win when both sets are present. Within a set every variable is required (a missing
// one is named); MASTER_ADDR / MASTER_PORT / MOEKIT_RENDEZVOUS_PORT / MOEKIT_COMM_TIMEOUT_MS take
// the defaults above.
// Throws Error(kInvalidArgument) naming the variable and its value when a value is not a
// decimal integer, is out of range (ranks below 0, world size below 1, ports outside 1..65535),
// rank >= world size, local rank >= world size, or, under a launcher, local rank >=
// visible_gpus (the GPUs this process sees; pass the count so that the check is testable).
// visible_gpus < 0 skips that last check (the host transport, which uses no GPU). Without
// launcher variables the result is rank 0 of a world of 1.
LaunchEnv parse_launch_env(const EnvLookup& lookup, int visible_gpus);

// How the ranks of a world share the layer: world_size == ep_size * tp_size, rank r is
// ep_rank r / tp_size and tp_rank r % tp_size (TP ranks adjacent, usually one node). Fills those
// fields of the returned spec; throws Error(kInvalidArgument) naming ep_size, tp_size and the
// world size when they do not fit, and kInvalidSpec when the spec itself is invalid (ep_size
// must divide num_experts: MoeSpec::validate).
MoeSpec spec_for_rank(const MoeSpec& spec, int rank, int world_size);

// The collectives of expert parallelism. Buffers live where device() says (host memory for the
// host transport, the bound GPU for NCCL); `stream` is a cudaStream_t for NCCL, ignored on the
// host. Every rank of the world calls the same collectives in the same order.
//
// One all_to_all_v's buffers and counts, and one all_gather's: parts of the grouped forms below.
struct AllToAllPart {
  const void* send = nullptr;
  std::vector<int64_t> send_bytes;
  void* recv = nullptr;
  std::vector<int64_t> recv_bytes;
};
struct AllGatherPart {
  const void* send = nullptr;
  int64_t bytes = 0;
  void* recv = nullptr;
};

// Teardown: release() ends the communicator. Releasing twice is harmless (the second call
// returns the first call's status and does nothing). A release that fails leaves the
// communicator poisoned: every later call fails with kComm and nothing is reused. The destructor
// releases. A collective on a released or poisoned communicator fails with kComm.
// A dead or stalled peer: a host wait on the communicator's work (wait(), exchange_host) that
// does not end within its timeout, or that the transport reports failed, breaks it: the call
// returns kComm naming the rank, the wait and the time, never hangs; every later call but
// release() fails with kComm naming that reason.
class Communicator {
 public:
  enum class State : int { kLive = 0, kReleased = 1, kPoisoned = 2, kBroken = 3 };

  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  virtual Device device() const = 0;
  virtual int device_index() const { return 0; }
  // A short name of the transport ("host", "nccl"), part of the consistency fingerprint.
  virtual std::string transport() const = 0;
  // Whether collectives can be captured in a CUDA graph (no host synchronization inside).
  virtual bool graph_capturable() const = 0;
  State state() const;
  // Ok while live; else kComm naming `what`, this rank and why the communicator cannot be used
  // (released, poisoned, or broken and by what).
  Status usable(const char* what) const;

  // send holds world_size() segments of send_bytes[d] bytes, back to back, segment d for rank d;
  // recv receives recv_bytes[s] bytes from each rank s, back to back. Each rank's recv_bytes[s]
  // must equal rank s's send_bytes[rank()] (exchange the counts first).
  Status all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                      const std::vector<int64_t>& recv_bytes, void* stream);
  // recv [world_size() * bytes]: rank s's `bytes` bytes at s * bytes.
  Status all_gather(const void* send, int64_t bytes, void* recv, void* stream);
  // Several of them as one collective where the transport can (NCCL: one group, one launch,
  // instead of one per part; an EP dispatch sends its rows, ids and weights together). Each part
  // as the single form; every rank passes its parts in the same order. All parts are checked
  // before any moves; a bad one is named by its index.
  Status all_to_all_v(const std::vector<AllToAllPart>& parts, void* stream);
  Status all_gather(const std::vector<AllGatherPart>& parts, void* stream);
  // send [world_size() * count] fp32; recv [count] is the sum over ranks of segment rank().
  // recv may be send + rank() * count (in place, as NCCL allows).
  Status reduce_scatter_sum(const float* send, int64_t count, float* recv, void* stream);
  // Small host blobs of any length, every rank's (in rank order); synchronizes the host.
  Status exchange_host(const std::vector<uint8_t>& mine, std::vector<std::vector<uint8_t>>* all);
  // Waits on the host until the work enqueued so far on `stream` (this communicator's
  // collectives among it) has finished, for at most the communicator's timeout (`what` names
  // the wait in the error). Past it, or where the transport reports the work failed, the
  // communicator breaks (see the class comment); one this process created (create_nccl) is
  // aborted first, which ends its pending collectives. The host transport has nothing to wait
  // for.
  Status wait(void* stream, const char* what);
  // Idempotent (see the class comment); a broken communicator is released once, as a live one.
  Status release();

 protected:
  Communicator(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  virtual Status do_all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes,
                                 void* recv, const std::vector<int64_t>& recv_bytes,
                                 void* stream) = 0;
  virtual Status do_all_gather(const void* send, int64_t bytes, void* recv, void* stream) = 0;
  // The grouped forms: by default each part in turn.
  virtual Status do_all_to_all_v_parts(const std::vector<AllToAllPart>& parts, void* stream);
  virtual Status do_all_gather_parts(const std::vector<AllGatherPart>& parts, void* stream);
  virtual Status do_reduce_scatter_sum(const float* send, int64_t count, float* recv,
                                       void* stream) = 0;
  virtual Status do_exchange_host(const std::vector<uint8_t>& mine,
                                  std::vector<std::vector<uint8_t>>* all) = 0;
  // Device transports wait for `stream` here (the host transport's collectives are done when
  // they return); a kComm result breaks the communicator.
  virtual Status do_wait(void* /*stream*/, const std::string& /*what*/) { return {}; }
  virtual Status do_release() = 0;
  // Breaks the communicator with `reason` (a kComm status) unless it is already released,
  // poisoned or broken; returns `reason`.
  Status mark_broken(const Status& reason);

 private:
  const int rank_, world_size_;
  mutable std::mutex state_mutex_;
  std::mutex release_mutex_;  // one release at a time, without state_mutex_ held (a transport's
                              // watchdog may break the communicator meanwhile)
  State state_ = State::kLive;
  Status release_status_;
  Status broken_reason_;
};

// An in-process world of `world_size` ranks (one thread per rank) over host memory, for tests
// and for checking the EP logic without GPUs. Every collective is a rendezvous of all ranks; a
// rank that waits longer than `timeout` for the others (one of them failed or was released)
// gets kComm, never a hang.
struct HostWorldOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Tests: the release of this rank fails (and poisons its communicator); -1 none.
  int failing_release_rank = -1;
};
// One communicator per rank; communicator r is rank r. They share the world's state.
std::vector<std::unique_ptr<Communicator>> make_host_world(int world_size,
                                                           const HostWorldOptions& options = {});

// Rank 0 serves `blob` (e.g. the NCCL unique id) over TCP at addr:port; every other rank
// connects, retrying until `timeout`, and receives it. Each rank also sends its rank and world
// size, which rank 0 checks (world sizes equal, ranks distinct and below the world size); a
// mismatch is kComm on every rank that got that far, naming both values. No answer within
// `timeout` is kComm naming the address, port and time. Sockets are closed on every path.
// Rank 0 returns once every rank received the blob.
Status tcp_rendezvous(const std::string& addr, int port, int rank, int world_size,
                      std::vector<uint8_t>* blob, std::chrono::milliseconds timeout);

// NCCL communicators (built with CUDA and NCCL; elsewhere these throw Error(kUnsupported)).
// (a) Wraps a communicator the caller owns (an ncclComm_t, passed as void*) bound to GPU
//     device_index; release() never destroys it. A wait that times out (`wait_timeout`) breaks
//     the wrapper but does not abort the caller's communicator: its pending collectives stay
//     on the GPU until the caller aborts it (ncclCommAbort, or torch.distributed's watchdog).
std::unique_ptr<Communicator> wrap_nccl(
    void* nccl_comm, int device_index,
    std::chrono::milliseconds wait_timeout = std::chrono::minutes(10));
// (b) Creates one from the launcher's environment (parse_launch_env with the visible GPUs):
//     binds GPU env.local_rank, exchanges the unique id by tcp_rendezvous at
//     MASTER_ADDR:rendezvous_port, initializes NCCL; release() destroys it. A failure midway
//     releases what was made and throws Error (kComm, kCuda or kInvalidArgument). `timeout`
//     bounds the rendezvous and every later host wait on the communicator's work; one that
//     times out aborts the communicator.
std::unique_ptr<Communicator> create_nccl(const LaunchEnv& env, std::chrono::milliseconds timeout);

}  // namespace moekit::comm
