// The TCP rendezvous on localhost: the blob reaches every rank, a world-size mismatch fails on
// every rank, and a missing rank 0 or missing peers time out instead of hanging.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <thread>

#include "moekit/comm.hpp"

namespace moekit::comm {
namespace {

using namespace std::chrono_literals;

// A port nobody listens on right now (the kernel's pick, released again).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<Status> run(int world, const std::vector<int>& claimed_world, int port,
                        std::vector<std::vector<uint8_t>>* blobs,
                        std::chrono::milliseconds timeout) {
  std::vector<Status> out(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      out[r] = tcp_rendezvous("127.0.0.1", port, r, claimed_world[r], &(*blobs)[r], timeout);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(TcpRendezvous, EveryRankGetsRankZerosBlob) {
  for (int n : {2, 4}) {
    SCOPED_TRACE(n);
    std::vector<std::vector<uint8_t>> blobs(n);
    blobs[0] = {1, 2, 3, 250};
    const auto st = run(n, std::vector<int>(n, n), free_port(), &blobs, 10s);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(st[r].ok()) << r << ": " << st[r].message();
      EXPECT_EQ(blobs[r], blobs[0]);
    }
  }
}

TEST(TcpRendezvous, WorldSizeMismatchFailsOnEveryRank) {
  std::vector<std::vector<uint8_t>> blobs(2);
  blobs[0] = {7};
  const auto st = run(2, {2, 3}, free_port(), &blobs, 10s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), ErrorCode::kComm) << r;
    EXPECT_NE(st[r].message().find("world size 3"), std::string::npos) << st[r].message();
  }
}

TEST(TcpRendezvous, NoRankZeroTimesOut) {
  std::vector<uint8_t> blob;
  const int port = free_port();
  const Status st = tcp_rendezvous("127.0.0.1", port, 1, 2, &blob, 300ms);
  EXPECT_EQ(st.code(), ErrorCode::kComm);
  EXPECT_NE(st.message().find(std::to_string(port)), std::string::npos) << st.message();
}

TEST(TcpRendezvous, MissingPeersTimeOut) {
  std::vector<uint8_t> blob = {1};
  const Status st = tcp_rendezvous("127.0.0.1", free_port(), 0, 3, &blob, 300ms);
  EXPECT_EQ(st.code(), ErrorCode::kComm);
  EXPECT_NE(st.message().find("0 of 2"), std::string::npos) << st.message();
}

TEST(TcpRendezvous, BadArgumentsAreNamed) {
  std::vector<uint8_t> blob;
  EXPECT_EQ(tcp_rendezvous("127.0.0.1", 0, 0, 2, &blob, 1s).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(tcp_rendezvous("127.0.0.1", 70000, 0, 2, &blob, 1s).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(tcp_rendezvous("127.0.0.1", 1234, 2, 2, &blob, 1s).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(tcp_rendezvous("no-such-host.invalid", 1234, 1, 2, &blob, 1s).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE(tcp_rendezvous("127.0.0.1", 1234, 0, 1, &blob, 1s).ok());  // alone: nothing to do
}

TEST(NcclCommunicator, RefusedWithoutNccl) {
#ifndef MOEKIT_WITH_CUDA
  try {
    create_nccl(LaunchEnv{}, 1s);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  EXPECT_THROW(wrap_nccl(nullptr, 0), Error);
#else
  GTEST_SKIP() << "a CUDA build: the NCCL communicator's GPU test covers it";
#endif
}

}  // namespace
}  // namespace moekit::comm
