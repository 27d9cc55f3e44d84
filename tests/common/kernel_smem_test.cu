// raise_dynamic_smem_limit (common/kernel_smem.hpp): a kernel's dynamic shared-memory limit is
// shared by every caller that launches it, so a caller that needs less must not lower it under
// one that needs more (that launch would fail with "invalid argument").
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "common/kernel_smem.hpp"
#include "support/gpu.hpp"

namespace moekit {
namespace {

__global__ void touch_shared(int* out) {
  extern __shared__ int words[];
  words[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) *out = words[blockDim.x - 1];
}

class KernelSmemTest : public devtest::GpuTest {};

TEST_F(KernelSmemTest, ALaterSmallerNeedDoesNotLowerTheLimit) {
  const void* k = reinterpret_cast<const void*>(touch_shared);
  const std::size_t big = 96 * 1024, small = 56 * 1024;
  ASSERT_TRUE(raise_dynamic_smem_limit(k, big, "the test kernel").ok());
  ASSERT_TRUE(raise_dynamic_smem_limit(k, small, "the test kernel").ok());
  cudaFuncAttributes attr{};
  ASSERT_EQ(cudaFuncGetAttributes(&attr, k), cudaSuccess);
  EXPECT_GE(static_cast<std::size_t>(attr.maxDynamicSharedSizeBytes), big);
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0xff, sizeof(int)), cudaSuccess);  // poisoned
  touch_shared<<<1, 128, big>>>(out);  // the first caller's launch, after the second's set-up
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int host = 0;
  ASSERT_EQ(cudaMemcpy(&host, out, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 127);
  cudaFree(out);
}

TEST_F(KernelSmemTest, MoreThanTheDeviceHasIsAnErrorNamingTheKernel) {
  const Status st = raise_dynamic_smem_limit(reinterpret_cast<const void*>(touch_shared),
                                             std::size_t{1} << 30, "the test kernel");
  // Refused before any CUDA call fails (compute-sanitizer reports none).
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("the test kernel"), std::string::npos);
  EXPECT_NE(st.message().find(std::to_string(std::size_t{1} << 30)), std::string::npos);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace moekit
