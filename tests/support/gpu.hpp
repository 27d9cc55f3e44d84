// Helpers of every device test (routing, permute, gemm, activation, finalize, the sm90 engine):
// skipping without an sm_90 GPU, device buffers, element conversions, random fills, fresh seeds.
// C++17: the *_test.cu files include it.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/numeric.hpp"
#include "moekit/types.hpp"

namespace moekit::devtest {

// Empty when an sm_90 device is usable, else why not.
inline std::string gpu_skip_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device";
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0)
    return "device 0 is sm_" + std::to_string(major * 10 + minor) + ", the kernels need sm_90a";
  return {};
}

// Fixture of every GPU test: skips with the reason where there is no sm_90 device.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = gpu_skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

// Whether compute-sanitizer runs the tests (scripts/device.sh sets MOEKIT_SANITIZER_RUN=1):
// tests whose largest sizes or repeat counts add only time under the tools then run smaller.
inline bool sanitizer_run() {
  const char* v = std::getenv("MOEKIT_SANITIZER_RUN");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// A fresh seed per process (MOEKIT_TEST_SEED pins it), printed so a failure can be replayed.
inline uint64_t base_seed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("MOEKIT_TEST_SEED");
    const uint64_t v = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    std::printf("[ moekit ] device tests use MOEKIT_TEST_SEED=%llu\n",
                static_cast<unsigned long long>(v));
    return v;
  }();
  return seed;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&ptr, n ? n : 16), cudaSuccess);
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
  // Fills with 0xff bytes: NaN in bf16, fp16 and fp32, -1 in integers. Waits for it: tests
  // run kernels on non-blocking streams, which do not order after the legacy stream.
  void poison() {
    EXPECT_EQ(cudaMemset(ptr, 0xff, bytes), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty())
    EXPECT_EQ(cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // see poison()
  return b;
}

// Overwrites a buffer's first bytes in place (same pointer, as a captured graph needs); waits
// for it, see poison().
template <class T>
void upload(DeviceBuffer& b, const std::vector<T>& v) {
  if (!v.empty())
    EXPECT_EQ(cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

template <class T>
std::vector<T> to_host(const void* p, std::size_t count) {
  std::vector<T> v(count);
  if (count)
    EXPECT_EQ(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// bf16 / fp16 bits of a float (round to nearest even) and back.
inline uint16_t to_bits(DType t, float v) {
  return t == DType::kFloat16 ? numeric::float_to_fp16_hd(v) : numeric::float_to_bf16(v);
}
inline float from_bits(DType t, uint16_t u) {
  return t == DType::kFloat16 ? numeric::fp16_to_float_hd(u) : numeric::bf16_to_float(u);
}

// Every element a draw of `dist`, rounded to t's bits. By reference: the caller's draws go on
// from where these stop.
template <class Dist, class Rng>
void fill_bits(std::vector<uint16_t>& v, DType t, Dist& dist, Rng& rng) {
  for (auto& x : v) x = to_bits(t, dist(rng));
}

}  // namespace moekit::devtest
