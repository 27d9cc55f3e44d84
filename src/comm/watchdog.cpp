// Watchdog (watchdog.hpp): one thread, a queue of probes checked in order every millisecond.
#include "comm/watchdog.hpp"

#include <utility>

#include "comm/host_wait.hpp"

namespace moekit::comm {

Watchdog::Watchdog(std::chrono::milliseconds timeout, int rank,
                   std::function<void(const Status&)> on_stall)
    : timeout_(timeout), rank_(rank), on_stall_(std::move(on_stall)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lk(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::string what, Probe done) {
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (fired_ || stopping_) return;
    items_.push_back({std::move(what), std::move(done), std::chrono::steady_clock::now()});
  }
  wake_.notify_all();
}

std::size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return items_.size();
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lk(mutex_);
  for (;;) {
    // Idle: sleep until there is work; busy: look again every millisecond.
    if (items_.empty())
      wake_.wait(lk, [&] { return stopping_ || !items_.empty(); });
    else
      wake_.wait_for(lk, std::chrono::milliseconds(1), [&] { return stopping_; });
    if (stopping_) return;
    Status stall;
    while (!items_.empty() && stall.ok()) {
      Item& front = items_.front();
      bool done = false;
      const Status probed = front.done(&done);
      if (!probed.ok()) {
        stall = Status(ErrorCode::kComm, "rank " + std::to_string(rank_) + ": " + front.what +
                                             " failed: " + probed.message());
      } else if (done) {
        items_.pop_front();
        // The timeout bounds a lack of progress: the next item's clock starts now (collectives
        // on a stream end in order, and a long queue of them is not a stall).
        if (!items_.empty()) items_.front().since = std::chrono::steady_clock::now();
      } else {
        if (std::chrono::steady_clock::now() - front.since > timeout_)
          stall = peer_timeout(rank_, front.what, timeout_);
        break;
      }
    }
    if (!stall.ok()) {
      fired_ = true;
      items_.clear();
      lk.unlock();
      on_stall_(stall);  // without the lock: it may abort the transport, which may call back
      lk.lock();
    }
  }
}

}  // namespace moekit::comm
