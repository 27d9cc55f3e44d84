// The Communicator's state rules (idempotent release, poisoning) and the in-process host
// transport that tests use to simulate a world of ranks with threads.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <string>
#include <thread>

#include "comm/host_wait.hpp"
#include "moekit/comm.hpp"

namespace moekit::comm {

Communicator::State Communicator::state() const {
  std::lock_guard<std::mutex> lk(state_mutex_);
  return state_;
}

Status Communicator::usable(const char* what) const {
  std::lock_guard<std::mutex> lk(state_mutex_);
  if (state_ == State::kLive) return {};
  const std::string which = state_ == State::kReleased ? "released"
                            : state_ == State::kPoisoned
                                ? "poisoned by a failed release"
                                : "broken (" + broken_reason_.message() + ")";
  return Status(ErrorCode::kComm, std::string(what) + " on rank " + std::to_string(rank_) +
                                      "'s communicator, which is " + which + ": build a new one");
}

Status Communicator::mark_broken(const Status& reason) {
  std::lock_guard<std::mutex> lk(state_mutex_);
  if (state_ == State::kLive) {
    state_ = State::kBroken;
    broken_reason_ = reason;
  }
  return reason;
}

Status Communicator::wait(void* stream, const char* what) {
  if (Status st = usable(what); !st.ok()) return st;
  const Status st = do_wait(stream, what);
  if (st.code() == ErrorCode::kComm) return mark_broken(st);
  // The work may have ended because a watchdog aborted it meanwhile: then it is broken.
  return st.ok() ? usable(what) : st;
}

Status peer_timeout(int rank, const std::string& what, std::chrono::milliseconds timeout) {
  return Status(ErrorCode::kComm, "rank " + std::to_string(rank) + ": " + what +
                                      " did not finish within " + std::to_string(timeout.count()) +
                                      " ms: a peer rank died, stalled or did not call the same "
                                      "collectives");
}

Status wait_until_done(const std::function<Status(bool* done)>& poll,
                       std::chrono::milliseconds timeout, int rank, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now(), deadline = start + timeout;
  std::chrono::microseconds pause(20);
  for (;;) {
    bool done = false;
    if (Status st = poll(&done); !st.ok()) return st;
    if (done) return {};
    if (Clock::now() >= deadline) return peer_timeout(rank, what, timeout);
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

namespace {

// The counts of one all_to_all_v (`what` names it: the call, or the call and its part).
Status check_all_to_all_counts(const std::string& what, int world_size,
                               const std::vector<int64_t>& send_bytes,
                               const std::vector<int64_t>& recv_bytes) {
  const auto n = static_cast<size_t>(world_size);
  if (send_bytes.size() != n || recv_bytes.size() != n)
    return Status(ErrorCode::kInvalidArgument,
                  what + " with " + std::to_string(send_bytes.size()) + " send and " +
                      std::to_string(recv_bytes.size()) + " receive counts in a world of " +
                      std::to_string(world_size));
  for (size_t r = 0; r < n; ++r) {
    if (send_bytes[r] < 0 || recv_bytes[r] < 0)
      return Status(ErrorCode::kInvalidArgument,
                    what + " with a negative count for rank " + std::to_string(r));
  }
  return {};
}

Status check_all_gather_bytes(const std::string& what, int64_t bytes) {
  if (bytes < 0)
    return Status(ErrorCode::kInvalidArgument, what + " of " + std::to_string(bytes) + " bytes");
  return {};
}

std::string part_name(const char* call, std::size_t i) {
  return std::string(call) + " part " + std::to_string(i);
}

}  // namespace

Status Communicator::all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes,
                                  void* recv, const std::vector<int64_t>& recv_bytes,
                                  void* stream) {
  if (Status st = usable("all_to_all_v"); !st.ok()) return st;
  if (Status st = check_all_to_all_counts("all_to_all_v", world_size_, send_bytes, recv_bytes);
      !st.ok())
    return st;
  return do_all_to_all_v(send, send_bytes, recv, recv_bytes, stream);
}

Status Communicator::all_gather(const void* send, int64_t bytes, void* recv, void* stream) {
  if (Status st = usable("all_gather"); !st.ok()) return st;
  if (Status st = check_all_gather_bytes("all_gather", bytes); !st.ok()) return st;
  return do_all_gather(send, bytes, recv, stream);
}

Status Communicator::all_to_all_v(const std::vector<AllToAllPart>& parts, void* stream) {
  if (Status st = usable("all_to_all_v"); !st.ok()) return st;
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (Status st = check_all_to_all_counts(part_name("all_to_all_v", i), world_size_,
                                            parts[i].send_bytes, parts[i].recv_bytes);
        !st.ok())
      return st;
  return do_all_to_all_v_parts(parts, stream);
}

Status Communicator::all_gather(const std::vector<AllGatherPart>& parts, void* stream) {
  if (Status st = usable("all_gather"); !st.ok()) return st;
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (Status st = check_all_gather_bytes(part_name("all_gather", i), parts[i].bytes); !st.ok())
      return st;
  return do_all_gather_parts(parts, stream);
}

Status Communicator::do_all_to_all_v_parts(const std::vector<AllToAllPart>& parts, void* stream) {
  for (const AllToAllPart& p : parts)
    if (Status st = do_all_to_all_v(p.send, p.send_bytes, p.recv, p.recv_bytes, stream); !st.ok())
      return st;
  return {};
}

Status Communicator::do_all_gather_parts(const std::vector<AllGatherPart>& parts, void* stream) {
  for (const AllGatherPart& p : parts)
    if (Status st = do_all_gather(p.send, p.bytes, p.recv, stream); !st.ok()) return st;
  return {};
}

Status Communicator::reduce_scatter_sum(const float* send, int64_t count, float* recv,
                                        void* stream) {
  if (Status st = usable("reduce_scatter_sum"); !st.ok()) return st;
  if (count < 0)
    return Status(ErrorCode::kInvalidArgument,
                  "reduce_scatter_sum of " + std::to_string(count) + " elements");
  return do_reduce_scatter_sum(send, count, recv, stream);
}

Status Communicator::exchange_host(const std::vector<uint8_t>& mine,
                                   std::vector<std::vector<uint8_t>>* all) {
  if (Status st = usable("exchange_host"); !st.ok()) return st;
  return do_exchange_host(mine, all);
}

Status Communicator::release() {
  std::lock_guard<std::mutex> one_at_a_time(release_mutex_);
  {
    std::lock_guard<std::mutex> lk(state_mutex_);
    if (state_ != State::kLive && state_ != State::kBroken) return release_status_;
  }
  const Status released = do_release();
  std::lock_guard<std::mutex> lk(state_mutex_);
  release_status_ = released;
  state_ = released.ok() ? State::kReleased : State::kPoisoned;
  return released;
}

namespace {

enum class Op : int { kAllToAllV, kAllGather, kReduceScatter, kExchange };
const char* op_name(Op op) {
  switch (op) {
    case Op::kAllToAllV:
      return "all_to_all_v";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter_sum";
    case Op::kExchange:
      return "exchange_host";
  }
  return "?";
}

// What one rank brings to a collective; read by the others between the two barriers.
struct Post {
  Op op = Op::kExchange;
  const void* data = nullptr;
  std::vector<int64_t> send_bytes, recv_bytes;  // all_to_all_v
  int64_t size = 0;                             // bytes (all_gather) or elements (reduce)
  const std::vector<uint8_t>* blob = nullptr;
};

class HostWorld {
 public:
  HostWorld(int n, HostWorldOptions options) : n_(n), options_(options), posts_(n) {}
  int size() const { return n_; }
  const HostWorldOptions& options() const { return options_; }

  // Everyone arrives or, after the timeout, the world breaks for every rank.
  Status barrier(int rank) {
    std::unique_lock<std::mutex> lk(mutex_);
    if (broken_) return broken_status();
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return {};
    }
    const bool done =
        cv_.wait_for(lk, options_.timeout, [&] { return generation_ != gen || broken_; });
    if (done && generation_ != gen) return {};
    if (!broken_) {
      broken_ = true;
      why_ = "rank " + std::to_string(rank) + " waited " +
             std::to_string(options_.timeout.count()) + " ms for the other ranks of the collective";
      cv_.notify_all();
    }
    return broken_status();
  }
  void post(int rank, Post p) {
    std::lock_guard<std::mutex> lk(mutex_);
    posts_[rank] = std::move(p);
  }
  const Post& posted(int rank) const { return posts_[rank]; }
  void depart(int rank) {
    std::lock_guard<std::mutex> lk(mutex_);
    if (!broken_) {
      broken_ = true;
      why_ = "rank " + std::to_string(rank) + " released its communicator";
    }
    cv_.notify_all();
  }

  // The same verdict on every rank (all read the same posts): the first mismatch, or ok.
  Status check_posts() const {
    for (int r = 1; r < n_; ++r) {
      if (posts_[r].op != posts_[0].op)
        return Status(ErrorCode::kComm, "rank 0 called " + std::string(op_name(posts_[0].op)) +
                                            " while rank " + std::to_string(r) + " called " +
                                            op_name(posts_[r].op));
      if (posts_[r].op != Op::kAllToAllV && posts_[r].op != Op::kExchange &&
          posts_[r].size != posts_[0].size)
        return Status(ErrorCode::kComm, std::string(op_name(posts_[0].op)) + " of " +
                                            std::to_string(posts_[0].size) + " on rank 0 but " +
                                            std::to_string(posts_[r].size) + " on rank " +
                                            std::to_string(r));
    }
    if (posts_[0].op == Op::kAllToAllV) {
      for (int s = 0; s < n_; ++s) {
        for (int d = 0; d < n_; ++d) {
          if (posts_[s].send_bytes[d] != posts_[d].recv_bytes[s])
            return Status(ErrorCode::kComm, "all_to_all_v: rank " + std::to_string(s) + " sends " +
                                                std::to_string(posts_[s].send_bytes[d]) +
                                                " bytes to rank " + std::to_string(d) +
                                                ", which expects " +
                                                std::to_string(posts_[d].recv_bytes[s]));
        }
      }
    }
    return {};
  }

 private:
  Status broken_status() const {
    return Status(ErrorCode::kComm, "the host world is broken: " + why_);
  }
  const int n_;
  const HostWorldOptions options_;
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int arrived_ = 0;
  bool broken_ = false;
  std::string why_;
  std::vector<Post> posts_;
};

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(int rank, std::shared_ptr<HostWorld> world)
      : Communicator(rank, world->size()), world_(std::move(world)) {}
  ~HostCommunicator() override { release(); }
  Device device() const override { return Device::kHost; }
  std::string transport() const override { return "host"; }
  bool graph_capturable() const override { return false; }

 protected:
  // Post, meet, check, move the bytes, meet again (the senders' buffers stay valid until then).
  template <class Move>
  Status collective(Post p, Move move) {
    world_->post(rank(), std::move(p));
    if (Status st = world_->barrier(rank()); !st.ok()) return st;
    Status verdict = world_->check_posts();
    if (verdict.ok()) move();
    if (Status st = world_->barrier(rank()); !st.ok()) return st;
    return verdict;
  }

  Status do_all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                         const std::vector<int64_t>& recv_bytes, void*) override {
    Post p;
    p.op = Op::kAllToAllV;
    p.data = send;
    p.send_bytes = send_bytes;
    p.recv_bytes = recv_bytes;
    return collective(std::move(p), [&] {
      int64_t at = 0;
      for (int s = 0; s < world_size(); ++s) {
        const Post& from = world_->posted(s);
        int64_t offset = 0;
        for (int d = 0; d < rank(); ++d) offset += from.send_bytes[d];
        if (recv_bytes[s] > 0)
          std::memcpy(static_cast<uint8_t*>(recv) + at,
                      static_cast<const uint8_t*>(from.data) + offset, recv_bytes[s]);
        at += recv_bytes[s];
      }
    });
  }
  Status do_all_gather(const void* send, int64_t bytes, void* recv, void*) override {
    return collective(Post{Op::kAllGather, send, {}, {}, bytes, nullptr}, [&] {
      for (int s = 0; s < world_size(); ++s) {
        if (bytes > 0)
          std::memcpy(static_cast<uint8_t*>(recv) + s * bytes, world_->posted(s).data, bytes);
      }
    });
  }
  Status do_reduce_scatter_sum(const float* send, int64_t count, float* recv, void*) override {
    return collective(Post{Op::kReduceScatter, send, {}, {}, count, nullptr}, [&] {
      // Sums in rank order, so every run gives the same bits.
      for (int64_t i = 0; i < count; ++i) {
        float acc = 0.0f;
        for (int s = 0; s < world_size(); ++s)
          acc += static_cast<const float*>(world_->posted(s).data)[rank() * count + i];
        recv[i] = acc;
      }
    });
  }
  Status do_exchange_host(const std::vector<uint8_t>& mine,
                          std::vector<std::vector<uint8_t>>* all) override {
    Post p;
    p.op = Op::kExchange;
    p.blob = &mine;
    return collective(std::move(p), [&] {
      all->assign(world_size(), {});
      for (int s = 0; s < world_size(); ++s) (*all)[s] = *world_->posted(s).blob;
    });
  }
  Status do_release() override {
    world_->depart(rank());
    if (rank() == world_->options().failing_release_rank)
      return Status(ErrorCode::kComm,
                    "rank " + std::to_string(rank()) +
                        "'s release failed (HostWorldOptions::failing_release_rank)");
    return {};
  }

 private:
  std::shared_ptr<HostWorld> world_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_host_world(int world_size,
                                                           const HostWorldOptions& options) {
  if (world_size < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "host world of " + std::to_string(world_size) + " ranks (expected 1 or more)");
  auto world = std::make_shared<HostWorld>(world_size, options);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<HostCommunicator>(r, world));
  return out;
}

}  // namespace moekit::comm
