// A watchdog over asynchronous work (internal to src/comm): the NCCL transport hands it each
// collective it enqueues (a probe of whether it finished), and a thread of its own checks them
// in order. An item not finished within the timeout (counted from when it was given, or when the
// item before it finished, whichever is later: no progress for that long), or a probe's error
// (NCCL's asynchronous error: a peer died), fires `on_stall` once, with kComm naming the rank, the
// item and the time, so that the transport can abort its communicator: pending collectives end
// instead of hanging the caller's next synchronize. After that it watches nothing.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "moekit/status.hpp"

namespace moekit::comm {

class Watchdog {
 public:
  using Probe = std::function<Status(bool* done)>;
  Watchdog(std::chrono::milliseconds timeout, int rank,
           std::function<void(const Status&)> on_stall);
  ~Watchdog();  // stops the thread (joins it)
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `done` (called from the watchdog's thread, in the order items were given) from now.
  void watch(std::string what, Probe done);
  // Items not yet seen finished (for tests).
  std::size_t pending() const;

 private:
  struct Item {
    std::string what;
    Probe done;
    std::chrono::steady_clock::time_point since;
  };
  void run();

  const std::chrono::milliseconds timeout_;
  const int rank_;
  const std::function<void(const Status&)> on_stall_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Item> items_;
  bool stopping_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace moekit::comm
