// The host transport's collectives over worlds of 1, 2, 4 and 8 ranks (threads), mismatched
// calls failing on every rank, and the teardown rules: idempotent release, a failed release
// poisoning the communicator, a departed rank failing the others instead of hanging them; the
// device transports' deadline-bounded host wait and the broken state it leaves.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>

#include "comm/host_wait.hpp"
#include "comm/watchdog.hpp"
#include "comm/ranks.hpp"

namespace moekit::comm {
namespace {

using test::run_ranks;

TEST(HostCommunicator, AllToAllVMovesEachSegmentToItsRank) {
  for (int n : {1, 2, 4, 8}) {
    SCOPED_TRACE(n);
    auto world = make_host_world(n);
    const auto codes = run_ranks(world, [&](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world_size(), n);
      // Rank r sends (r + d) % 3 bytes to rank d, each byte 16 r + d.
      std::vector<int64_t> sb(n), rb(n);
      std::vector<uint8_t> send;
      for (int d = 0; d < n; ++d) {
        sb[d] = (r + d) % 3;
        rb[d] = (d + r) % 3;
        for (int64_t i = 0; i < sb[d]; ++i) send.push_back(static_cast<uint8_t>(16 * r + d));
      }
      std::vector<uint8_t> recv(std::accumulate(rb.begin(), rb.end(), int64_t{0}), 0xee);
      throw_if_error(c.all_to_all_v(send.data(), sb, recv.data(), rb, nullptr));
      size_t at = 0;
      for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < rb[s]; ++i) EXPECT_EQ(recv[at++], 16 * s + r);
      }
    });
    for (ErrorCode c : codes) EXPECT_EQ(c, ErrorCode::kOk);
  }
}

TEST(HostCommunicator, AllGatherReduceScatterAndExchange) {
  for (int n : {1, 2, 4, 8}) {
    SCOPED_TRACE(n);
    auto world = make_host_world(n);
    const auto codes = run_ranks(world, [&](int r, Communicator& c) {
      const int64_t mine[2] = {r, 100 + r};
      std::vector<int64_t> all(2 * n);
      throw_if_error(c.all_gather(mine, sizeof mine, all.data(), nullptr));
      for (int s = 0; s < n; ++s) {
        EXPECT_EQ(all[2 * s], s);
        EXPECT_EQ(all[2 * s + 1], 100 + s);
      }
      std::vector<float> send(3 * n);
      for (int i = 0; i < 3 * n; ++i) send[i] = static_cast<float>(r * 1000 + i);
      float recv[3];
      throw_if_error(c.reduce_scatter_sum(send.data(), 3, recv, nullptr));
      const float ranks_sum = static_cast<float>(1000 * n * (n - 1) / 2);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(recv[i], ranks_sum + n * (3 * r + i));
      // In place: this rank's segment of its own send buffer receives the sums.
      throw_if_error(c.reduce_scatter_sum(send.data(), 3, send.data() + 3 * r, nullptr));
      for (int i = 0; i < 3; ++i) EXPECT_EQ(send[3 * r + i], recv[i]);
      std::vector<uint8_t> blob(r, static_cast<uint8_t>(r));  // lengths differ
      std::vector<std::vector<uint8_t>> blobs;
      throw_if_error(c.exchange_host(blob, &blobs));
      ASSERT_EQ(static_cast<int>(blobs.size()), n);
      for (int s = 0; s < n; ++s)
        EXPECT_EQ(blobs[s], std::vector<uint8_t>(s, static_cast<uint8_t>(s)));
    });
    for (ErrorCode c : codes) EXPECT_EQ(c, ErrorCode::kOk);
  }
}

TEST(HostCommunicator, MismatchedCountsFailOnEveryRank) {
  auto world = make_host_world(2);
  const auto codes = run_ranks(world, [&](int r, Communicator& c) {
    std::vector<int64_t> sb = {4, 4}, rb = {4, r == 1 ? 8 : 4};  // rank 1 expects 8 from rank 1
    std::vector<uint8_t> send(8), recv(12);
    throw_if_error(c.all_to_all_v(send.data(), sb, recv.data(), rb, nullptr));
  });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kComm, ErrorCode::kComm}));
}

TEST(HostCommunicator, DifferentCollectivesFailOnEveryRank) {
  auto world = make_host_world(2);
  const auto codes = run_ranks(world, [&](int r, Communicator& c) {
    std::vector<uint8_t> buf(16);
    if (r == 0)
      throw_if_error(c.all_gather(buf.data(), 4, buf.data() + 8, nullptr));
    else {
      std::vector<std::vector<uint8_t>> all;
      throw_if_error(c.exchange_host(buf, &all));
    }
  });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kComm, ErrorCode::kComm}));
}

// The grouped forms move what the single forms do, part by part, in one call.
TEST(HostCommunicator, GroupedPartsMoveWhatSeparateCallsDo) {
  for (int n : {1, 2, 4, 8}) {
    SCOPED_TRACE(n);
    auto world = make_host_world(n);
    const auto codes = run_ranks(world, [&](int r, Communicator& c) {
      // Part p: rank r sends (r + d + p) % 3 + p bytes to rank d, each byte 16 r + d + 64 p.
      std::vector<AllToAllPart> parts(3);
      std::vector<std::vector<uint8_t>> send(3), recv(3);
      for (int p = 0; p < 3; ++p) {
        parts[p].send_bytes.resize(n);
        parts[p].recv_bytes.resize(n);
        for (int d = 0; d < n; ++d) {
          parts[p].send_bytes[d] = (r + d + p) % 3 + p;
          parts[p].recv_bytes[d] = (d + r + p) % 3 + p;
          for (int64_t i = 0; i < parts[p].send_bytes[d]; ++i)
            send[p].push_back(static_cast<uint8_t>(16 * r + d + 64 * p));
        }
        recv[p].assign(
            std::accumulate(parts[p].recv_bytes.begin(), parts[p].recv_bytes.end(), int64_t{0}),
            0xee);
        parts[p].send = send[p].data();
        parts[p].recv = recv[p].data();
      }
      throw_if_error(c.all_to_all_v(parts, nullptr));
      for (int p = 0; p < 3; ++p) {
        size_t at = 0;
        for (int s = 0; s < n; ++s)
          for (int64_t i = 0; i < parts[p].recv_bytes[s]; ++i)
            EXPECT_EQ(recv[p][at++], static_cast<uint8_t>(16 * s + r + 64 * p)) << "part " << p;
      }
      const int64_t a[1] = {r}, b[2] = {10 * r, 10 * r + 1};
      std::vector<int64_t> all_a(n), all_b(2 * n);
      throw_if_error(
          c.all_gather({{a, sizeof a, all_a.data()}, {b, sizeof b, all_b.data()}}, nullptr));
      for (int s = 0; s < n; ++s) {
        EXPECT_EQ(all_a[s], s);
        EXPECT_EQ(all_b[2 * s], 10 * s);
        EXPECT_EQ(all_b[2 * s + 1], 10 * s + 1);
      }
      throw_if_error(c.all_gather(std::vector<AllGatherPart>{}, nullptr));  // nothing to move
    });
    for (ErrorCode c : codes) EXPECT_EQ(c, ErrorCode::kOk);
  }
}

TEST(HostCommunicator, BadArgumentsAreRefusedBeforeCommunicating) {
  auto world = make_host_world(2);
  uint8_t b[8];
  EXPECT_EQ(world[0]->all_to_all_v(b, {1}, b, {1, 1}, nullptr).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(world[0]->all_to_all_v(b, {1, -1}, b, {1, 1}, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(world[0]->all_gather(b, -1, b, nullptr).code(), ErrorCode::kInvalidArgument);
  // A grouped call with one bad part moves nothing and names the part.
  const Status parts =
      world[0]->all_to_all_v({{b, {1, 1}, b, {1, 1}}, {b, {1}, b, {1, 1}}}, nullptr);
  EXPECT_EQ(parts.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(parts.message().find("part 1"), std::string::npos) << parts.message();
  const Status gathers = world[0]->all_gather({{b, 1, b}, {b, -3, b}}, nullptr);
  EXPECT_EQ(gathers.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(gathers.message().find("part 1 of -3 bytes"), std::string::npos) << gathers.message();
  float f[2];
  EXPECT_EQ(world[0]->reduce_scatter_sum(f, -2, f, nullptr).code(), ErrorCode::kInvalidArgument);
  try {
    make_host_world(0);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(HostCommunicator, ReleaseTwiceIsHarmlessAndUseAfterReleaseFails) {
  auto world = make_host_world(1);
  Communicator& c = *world[0];
  EXPECT_TRUE(c.release().ok());
  EXPECT_TRUE(c.release().ok());
  EXPECT_EQ(c.state(), Communicator::State::kReleased);
  std::vector<std::vector<uint8_t>> all;
  EXPECT_EQ(c.exchange_host({1}, &all).code(), ErrorCode::kComm);
  uint8_t b[1];
  EXPECT_EQ(c.all_gather(b, 1, b, nullptr).code(), ErrorCode::kComm);
}

TEST(HostCommunicator, FailedReleasePoisons) {
  HostWorldOptions o;
  o.failing_release_rank = 0;
  auto world = make_host_world(1, o);
  Communicator& c = *world[0];
  const Status first = c.release();
  EXPECT_EQ(first.code(), ErrorCode::kComm);
  EXPECT_EQ(c.state(), Communicator::State::kPoisoned);
  // No second attempt: the same status, and nothing usable.
  EXPECT_EQ(c.release().code(), ErrorCode::kComm);
  EXPECT_EQ(c.state(), Communicator::State::kPoisoned);
  std::vector<std::vector<uint8_t>> all;
  EXPECT_EQ(c.exchange_host({1}, &all).code(), ErrorCode::kComm);
}

TEST(HostCommunicator, ADepartedRankFailsTheOthersInsteadOfHangingThem) {
  HostWorldOptions o;
  o.timeout = std::chrono::seconds(20);  // far beyond the test: the departure must end the wait
  auto world = make_host_world(3, o);
  const auto codes = run_ranks(world, [&](int r, Communicator& c) {
    if (r == 2) {
      throw_if_error(c.release());
      return;
    }
    std::vector<std::vector<uint8_t>> all;
    throw_if_error(c.exchange_host({1}, &all));
  });
  EXPECT_EQ(codes, (std::vector<ErrorCode>{ErrorCode::kComm, ErrorCode::kComm, ErrorCode::kOk}));
}

TEST(HostCommunicator, AMissingRankTimesOut) {
  HostWorldOptions o;
  o.timeout = std::chrono::milliseconds(100);
  auto world = make_host_world(2, o);
  std::vector<std::vector<uint8_t>> all;
  const Status st = world[0]->exchange_host({1}, &all);  // rank 1 never comes
  EXPECT_EQ(st.code(), ErrorCode::kComm);
  EXPECT_NE(st.message().find("100 ms"), std::string::npos) << st.message();
  // The world stays broken for every rank.
  EXPECT_EQ(world[1]->exchange_host({1}, &all).code(), ErrorCode::kComm);
}

}  // namespace
}  // namespace moekit::comm

namespace moekit::comm {
namespace {

// The deadline-bounded host wait of the device transports (comm/host_wait.hpp).
TEST(HostWait, EndsWhenDoneOnAnErrorOrAtTheDeadline) {
  int calls = 0;
  const auto three_calls = [&](bool* done) {
    *done = ++calls == 3;
    return Status{};
  };
  EXPECT_TRUE(wait_until_done(three_calls, std::chrono::seconds(20), 1, "the counts").ok());
  EXPECT_EQ(calls, 3);
  const Status failed =
      wait_until_done([](bool*) { return Status(ErrorCode::kCuda, "an illegal address"); },
                      std::chrono::seconds(20), 1, "the counts");
  EXPECT_EQ(failed.code(), ErrorCode::kCuda);
  const auto start = std::chrono::steady_clock::now();
  const Status late = wait_until_done([](bool*) { return Status{}; }, std::chrono::milliseconds(50),
                                      3, "the EP row counts");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_EQ(late.code(), ErrorCode::kComm);
  for (const char* part : {"rank 3", "50 ms", "the EP row counts", "peer rank died"})
    EXPECT_NE(late.message().find(part), std::string::npos) << part << ": " << late.message();
}

// A device-like transport whose waits time out: the wait breaks the communicator, every later
// call names the reason, and release still runs once.
class StalledTransport final : public Communicator {
 public:
  StalledTransport() : Communicator(0, 2) {}
  int releases = 0;
  Device device() const override { return Device::kCuda; }
  std::string transport() const override { return "stalled"; }
  bool graph_capturable() const override { return true; }

 protected:
  Status do_all_to_all_v(const void*, const std::vector<int64_t>&, void*,
                         const std::vector<int64_t>&, void*) override {
    return {};
  }
  Status do_all_gather(const void*, int64_t, void*, void*) override { return {}; }
  Status do_reduce_scatter_sum(const float*, int64_t, float*, void*) override { return {}; }
  Status do_exchange_host(const std::vector<uint8_t>&,
                          std::vector<std::vector<uint8_t>>*) override {
    return {};
  }
  Status do_wait(void*, const std::string& what) override {
    return wait_until_done([](bool*) { return Status{}; }, std::chrono::milliseconds(10), rank(),
                           what);
  }
  Status do_release() override {
    ++releases;
    return {};
  }
};

TEST(HostWait, ATimedOutWaitBreaksTheCommunicator) {
  StalledTransport c;
  const Status first = c.wait(nullptr, "the EP row counts");
  EXPECT_EQ(first.code(), ErrorCode::kComm);
  EXPECT_EQ(c.state(), Communicator::State::kBroken);
  uint8_t b[2];
  const Status after = c.all_gather(b, 1, b, nullptr);
  EXPECT_EQ(after.code(), ErrorCode::kComm);
  EXPECT_NE(after.message().find("broken"), std::string::npos) << after.message();
  EXPECT_NE(after.message().find("the EP row counts"), std::string::npos) << after.message();
  EXPECT_EQ(c.wait(nullptr, "again").code(), ErrorCode::kComm);
  EXPECT_TRUE(c.release().ok());
  EXPECT_TRUE(c.release().ok());
  EXPECT_EQ(c.releases, 1);
  EXPECT_EQ(c.state(), Communicator::State::kReleased);
}

// The host transport has nothing to wait for.
TEST(HostWait, TheHostTransportsWaitReturnsAtOnce) {
  auto world = make_host_world(2);
  EXPECT_TRUE(world[0]->wait(nullptr, "nothing").ok());
  EXPECT_EQ(world[0]->state(), Communicator::State::kLive);
}

}  // namespace
}  // namespace moekit::comm

namespace moekit::comm {
namespace {

// The NCCL transport's watchdog (comm/watchdog.hpp) over fake work: finished items leave the
// queue; one past the timeout, or one whose probe fails, fires once with kComm naming the rank,
// the item and the time, and nothing is watched after that.
TEST(Watchdog, FiresOnceForAStalledOrFailedItem) {
  const auto fired_with = [](auto make_probe, std::chrono::milliseconds timeout) {
    std::mutex m;
    std::condition_variable cv;
    std::vector<Status> fired;
    {
      Watchdog w(timeout, 2, [&](const Status& s) {
        std::lock_guard<std::mutex> lk(m);
        fired.push_back(s);
        cv.notify_all();
      });
      w.watch("all_gather", [](bool* done) {
        *done = true;
        return Status{};
      });
      w.watch("all_to_all_v", make_probe());
      std::unique_lock<std::mutex> lk(m);
      cv.wait_for(lk, std::chrono::seconds(20), [&] { return !fired.empty(); });
      lk.unlock();
      w.watch("reduce_scatter_sum", [](bool*) { return Status{}; });  // after firing: ignored
      EXPECT_EQ(w.pending(), 0u);
    }
    return fired;
  };
  const std::vector<Status> stalled =
      fired_with([] { return [](bool*) { return Status{}; }; }, std::chrono::milliseconds(30));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].code(), ErrorCode::kComm);
  for (const char* part : {"rank 2", "all_to_all_v", "30 ms", "peer rank died"})
    EXPECT_NE(stalled[0].message().find(part), std::string::npos) << stalled[0].message();
  const std::vector<Status> failed = fired_with(
      [] {
        return [](bool*) { return Status(ErrorCode::kComm, "NCCL reported \"remote error\""); };
      },
      std::chrono::seconds(20));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].message().find("remote error"), std::string::npos) << failed[0].message();
  EXPECT_NE(failed[0].message().find("all_to_all_v"), std::string::npos) << failed[0].message();
}

TEST(Watchdog, FinishedWorkNeverFires) {
  bool fired = false;
  {
    Watchdog w(std::chrono::seconds(5), 0, [&](const Status&) { fired = true; });
    std::atomic<int> polls{0};
    for (int i = 0; i < 50; ++i)
      w.watch("all_gather", [&polls](bool* done) {
        *done = ++polls % 2 == 0;  // finished by its second look
        return Status{};
      });
    for (int i = 0; i < 4000 && w.pending() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(w.pending(), 0u);
  }
  EXPECT_FALSE(fired);
}

}  // namespace
}  // namespace moekit::comm
