// A host wait with a deadline (internal to src/comm): what the device transports use instead of
// a blocking synchronize, so that a dead or stalled peer ends in an error, never a hang.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include "moekit/status.hpp"

namespace moekit::comm {

// kComm for work that did not finish within `timeout`: names `rank`, `what`, the time and the
// likely causes (the host waits' and the watchdog's message).
Status peer_timeout(int rank, const std::string& what, std::chrono::milliseconds timeout);

// Calls `poll` until it sets *done or returns an error (returned as it is), for at most
// `timeout`, sleeping between calls (20 us, doubling to 1 ms). Past the timeout: kComm naming
// `rank`, `what` and the time, and the likely causes.
Status wait_until_done(const std::function<Status(bool* done)>& poll,
                       std::chrono::milliseconds timeout, int rank, const std::string& what);

}  // namespace moekit::comm
