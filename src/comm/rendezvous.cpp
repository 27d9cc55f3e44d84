// A TCP rendezvous: rank 0 hands one small blob (the NCCL unique id) to every other rank and
// checks that they all describe the same world. POSIX sockets, a deadline on every wait.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "moekit/comm.hpp"

namespace moekit::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x6d6f6531;       // "moe1"
constexpr uint32_t kMaxBlobBytes = 1u << 20;  // far above NCCL's 128-byte unique id
constexpr uint32_t kOk = 0, kMismatch = 1;

// Closes the descriptor on every path.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  ~Socket() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

Status comm_error(const std::string& sentence) { return Status(ErrorCode::kComm, sentence); }

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Waits until fd is ready for `events` or the deadline passes.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

Status send_all(int fd, const void* data, size_t n, Clock::time_point deadline,
                const std::string& peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLOUT, deadline))
      return comm_error("rendezvous: timed out sending to " + peer);
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0)
      return comm_error("rendezvous: sending to " + peer + " failed: " + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Status recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline))
      return comm_error("rendezvous: timed out waiting for " + peer);
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k == 0) return comm_error("rendezvous: " + peer + " closed the connection");
    if (k < 0)
      return comm_error("rendezvous: receiving from " + peer + " failed: " + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Status send_u32s(int fd, std::initializer_list<uint32_t> values, Clock::time_point deadline,
                 const std::string& peer) {
  for (uint32_t v : values) {
    const uint32_t be = htonl(v);
    if (Status st = send_all(fd, &be, 4, deadline, peer); !st.ok()) return st;
  }
  return {};
}

Status recv_u32(int fd, uint32_t* v, Clock::time_point deadline, const std::string& peer) {
  uint32_t be = 0;
  if (Status st = recv_all(fd, &be, 4, deadline, peer); !st.ok()) return st;
  *v = ntohl(be);
  return {};
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

std::string where(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

Status serve(int port, int world_size, std::vector<uint8_t>* blob, Clock::time_point deadline,
             std::chrono::milliseconds timeout) {
  Socket listener(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = listener.fd() >= 0;
  if (!v6) listener = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd() < 0)
    return comm_error(std::string("rendezvous: socket() failed: ") + std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // v4 clients too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(listener.fd(), world_size) != 0)
    return comm_error("rendezvous: rank 0 cannot listen on port " + std::to_string(port) + ": " +
                      std::strerror(errno) + " (set MOEKIT_RENDEZVOUS_PORT to a free port)");
  set_nonblocking(listener.fd());

  std::vector<Socket> peers;
  std::vector<bool> seen(world_size, false);
  seen[0] = true;
  Status mismatch;
  while (static_cast<int>(peers.size()) < world_size - 1) {
    if (!wait_ready(listener.fd(), POLLIN, deadline))
      return comm_error("rendezvous: rank 0 heard from " + std::to_string(peers.size()) + " of " +
                        std::to_string(world_size - 1) + " ranks within " +
                        std::to_string(timeout.count()) + " ms on port " + std::to_string(port));
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;
    set_nonblocking(peer.fd());
    uint32_t magic = 0, rank = 0, size = 0;
    const std::string who = "a rank connecting to port " + std::to_string(port);
    // A connection that is not a moekit rank (silent, or another greeting) is dropped after
    // at most a few seconds, not waited on until the deadline.
    const Clock::time_point hello_by = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!recv_u32(peer.fd(), &magic, hello_by, who).ok() || magic != kMagic ||
        !recv_u32(peer.fd(), &rank, hello_by, who).ok() ||
        !recv_u32(peer.fd(), &size, hello_by, who).ok())
      continue;
    if (mismatch.ok()) {
      if (static_cast<int64_t>(size) != world_size)
        mismatch =
            comm_error("rendezvous: rank " + std::to_string(rank) + " has world size " +
                       std::to_string(size) + " but rank 0 has " + std::to_string(world_size));
      else if (rank == 0 || rank >= size || seen[rank])
        mismatch = comm_error("rendezvous: rank " + std::to_string(rank) +
                              " arrived twice or is out of range in a world of " +
                              std::to_string(world_size));
      else
        seen[rank] = true;
    }
    peers.push_back(std::move(peer));
  }
  for (Socket& p : peers) {
    const std::string who = "a rank";
    if (!mismatch.ok()) {
      const std::string& m = mismatch.message();
      // Best effort: every rank that got this far learns the same sentence.
      (void)send_u32s(p.fd(), {kMismatch, static_cast<uint32_t>(m.size())}, deadline, who);
      (void)send_all(p.fd(), m.data(), m.size(), deadline, who);
      continue;
    }
    if (Status st = send_u32s(p.fd(), {kOk, static_cast<uint32_t>(blob->size())}, deadline, who);
        !st.ok())
      return st;
    if (Status st = send_all(p.fd(), blob->data(), blob->size(), deadline, who); !st.ok())
      return st;
  }
  if (!mismatch.ok()) return mismatch;
  for (Socket& p : peers) {  // one byte back: the blob arrived
    uint8_t ack = 0;
    if (Status st = recv_all(p.fd(), &ack, 1, deadline, "a rank's acknowledgement"); !st.ok())
      return st;
  }
  return {};
}

// Connects to addr:port, retrying while rank 0 is not listening yet.
Status connect_until(const std::string& addr, int port, Clock::time_point deadline,
                     std::chrono::milliseconds timeout, Socket* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (const int rc = ::getaddrinfo(addr.c_str(), port_text.c_str(), &hints, &found); rc != 0)
    return Status(ErrorCode::kInvalidArgument,
                  "rendezvous: MASTER_ADDR='" + addr + "' does not resolve: " + ::gai_strerror(rc));
  std::string last = "no address";
  for (;;) {
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      Socket s(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (s.fd() < 0) continue;
      set_nonblocking(s.fd());
      int rc = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        if (wait_ready(s.fd(), POLLOUT, deadline)) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) {
        ::freeaddrinfo(found);
        *out = std::move(s);
        return {};
      }
      last = std::strerror(errno);
    }
    if (ms_left(deadline) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, ms_left(deadline))));
  }
  ::freeaddrinfo(found);
  return comm_error("rendezvous: no rank 0 at " + where(addr, port) + " within " +
                    std::to_string(timeout.count()) + " ms (" + last + ")");
}

Status join(const std::string& addr, int port, int rank, int world_size, std::vector<uint8_t>* blob,
            Clock::time_point deadline, std::chrono::milliseconds timeout) {
  Socket s;
  if (Status st = connect_until(addr, port, deadline, timeout, &s); !st.ok()) return st;
  const std::string peer = "rank 0 at " + where(addr, port);
  if (Status st = send_u32s(
          s.fd(), {kMagic, static_cast<uint32_t>(rank), static_cast<uint32_t>(world_size)},
          deadline, peer);
      !st.ok())
    return st;
  uint32_t verdict = 0, n = 0;
  if (Status st = recv_u32(s.fd(), &verdict, deadline, peer); !st.ok()) return st;
  if (Status st = recv_u32(s.fd(), &n, deadline, peer); !st.ok()) return st;
  if (n > kMaxBlobBytes)
    return comm_error("rendezvous: " + peer + " announced " + std::to_string(n) +
                      " bytes (not a moekit rank 0?)");
  std::vector<uint8_t> payload(n);
  if (Status st = recv_all(s.fd(), payload.data(), n, deadline, peer); !st.ok()) return st;
  if (verdict != kOk) return comm_error(std::string(payload.begin(), payload.end()));
  *blob = std::move(payload);
  const uint8_t ack = 1;
  return send_all(s.fd(), &ack, 1, deadline, peer);
}

}  // namespace

Status tcp_rendezvous(const std::string& addr, int port, int rank, int world_size,
                      std::vector<uint8_t>* blob, std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    return Status(ErrorCode::kInvalidArgument, "rendezvous: rank " + std::to_string(rank) +
                                                   " in a world of " + std::to_string(world_size));
  if (port < 1 || port > 65535)
    return Status(ErrorCode::kInvalidArgument,
                  "rendezvous: port " + std::to_string(port) + " is outside 1..65535");
  if (rank == 0 && blob->size() > kMaxBlobBytes)
    return Status(ErrorCode::kInvalidArgument,
                  "rendezvous: a blob of " + std::to_string(blob->size()) + " bytes (at most " +
                      std::to_string(kMaxBlobBytes) + ")");
  if (world_size == 1) return {};
  const Clock::time_point deadline = Clock::now() + timeout;
  if (rank == 0) return serve(port, world_size, blob, deadline, timeout);
  return join(addr, port, rank, world_size, blob, deadline, timeout);
}

}  // namespace moekit::comm
