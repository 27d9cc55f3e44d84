// The NCCL communicator on the GPUs of one machine (one thread per GPU, communicators from
// ncclCommInitAll wrapped with wrap_nccl): every collective moves what the host transport's
// tests expect, the binding to the wrong GPU is refused, and a caller's communicator survives
// its wrapper's release. Skips where fewer than two GPUs are visible or the build has no NCCL.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <numeric>
#include <thread>

#include "moekit/comm.hpp"
#ifdef MOEKIT_WITH_NCCL
#include <nccl.h>
#endif

namespace moekit::comm {
namespace {

#ifdef MOEKIT_WITH_NCCL

class NcclWorld : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2)
      GTEST_SKIP() << "expert parallelism over NCCL needs at least two visible GPUs; " << n
                   << " visible";
    n_ = std::min(n, 8);
    comms_.resize(n_);
    std::vector<int> devices(n_);
    std::iota(devices.begin(), devices.end(), 0);
    ASSERT_EQ(ncclCommInitAll(comms_.data(), n_, devices.data()), ncclSuccess);
  }
  void TearDown() override {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  // Runs body(rank, communicator, stream) on one thread per GPU; the failures stay per thread.
  void each_rank(const std::function<void(int, Communicator&, cudaStream_t)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) {
      threads.emplace_back([&, r] {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        cudaStream_t s = nullptr;
        ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
        auto c = wrap_nccl(comms_[r], r);
        body(r, *c, s);
        EXPECT_TRUE(c->release().ok());
        EXPECT_TRUE(c->release().ok());
        cudaStreamDestroy(s);
      });
    }
    for (auto& t : threads) t.join();
  }
  int n_ = 0;
  std::vector<ncclComm_t> comms_;
};

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, host.size()) * sizeof(T)), cudaSuccess);
  if (!host.empty()) cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <class T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

TEST_F(NcclWorld, CollectivesMoveWhatTheHostTransportDoes) {
  const int n = n_;
  each_rank([&](int r, Communicator& c, cudaStream_t s) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.world_size(), n);
    EXPECT_EQ(c.device_index(), r);
    // all_to_all_v: rank r sends (r + d) % 3 + 1 bytes of 16 r + d to rank d.
    std::vector<int64_t> sb(n), rb(n);
    std::vector<uint8_t> send;
    for (int d = 0; d < n; ++d) {
      sb[d] = (r + d) % 3 + 1;
      rb[d] = (d + r) % 3 + 1;
      send.insert(send.end(), sb[d], static_cast<uint8_t>(16 * r + d));
    }
    const int64_t total = std::accumulate(rb.begin(), rb.end(), int64_t{0});
    uint8_t* dsend = device_copy(send);
    uint8_t* drecv = device_copy(std::vector<uint8_t>(total, 0xee));
    ASSERT_TRUE(c.all_to_all_v(dsend, sb, drecv, rb, s).ok());
    cudaStreamSynchronize(s);
    const auto got = host_copy(drecv, total);
    size_t at = 0;
    for (int src = 0; src < n; ++src)
      for (int64_t i = 0; i < rb[src]; ++i) EXPECT_EQ(got[at++], 16 * src + r);
    // reduce_scatter_sum and all_gather.
    std::vector<float> rs(3 * n);
    for (int i = 0; i < 3 * n; ++i) rs[i] = static_cast<float>(r * 1000 + i);
    float* drs = device_copy(rs);
    float* dout = device_copy(std::vector<float>(3));
    ASSERT_TRUE(c.reduce_scatter_sum(drs, 3, dout, s).ok());
    int64_t* dmine = device_copy(std::vector<int64_t>{r});
    int64_t* dall = device_copy(std::vector<int64_t>(n, -1));
    ASSERT_TRUE(c.all_gather(dmine, 8, dall, s).ok());
    cudaStreamSynchronize(s);
    const auto sums = host_copy(dout, 3);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(sums[i], static_cast<float>(1000 * n * (n - 1) / 2 + n * (3 * r + i)));
    const auto ranks = host_copy(dall, n);
    for (int q = 0; q < n; ++q) EXPECT_EQ(ranks[q], q);
    // Host blobs of different lengths.
    std::vector<std::vector<uint8_t>> blobs;
    ASSERT_TRUE(c.exchange_host(std::vector<uint8_t>(r, static_cast<uint8_t>(r)), &blobs).ok());
    for (int q = 0; q < n; ++q)
      EXPECT_EQ(blobs[q], std::vector<uint8_t>(q, static_cast<uint8_t>(q)));
    for (void* p : {static_cast<void*>(dsend), static_cast<void*>(drecv), static_cast<void*>(drs),
                    static_cast<void*>(dout), static_cast<void*>(dmine), static_cast<void*>(dall)})
      cudaFree(p);
  });
}

TEST_F(NcclWorld, WrappingOnAnotherGpuIsRefused) {
  try {
    wrap_nccl(comms_[0], 1);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

// A wait on a stream with finished work returns at once and leaves the communicator live; a
// wait timeout that is not positive is refused, naming it.
TEST_F(NcclWorld, WaitOnFinishedWorkAndBadTimeouts) {
  auto c = wrap_nccl(comms_[0], 0, std::chrono::seconds(5));
  EXPECT_TRUE(c->wait(nullptr, "nothing pending").ok());
  EXPECT_EQ(c->state(), Communicator::State::kLive);
  try {
    wrap_nccl(comms_[0], 0, std::chrono::milliseconds(0));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("0 ms"), std::string::npos) << e.what();
  }
}

#else

TEST(NcclWorld, Skipped) { GTEST_SKIP() << "this CUDA build found no NCCL"; }

#endif

}  // namespace
}  // namespace moekit::comm
