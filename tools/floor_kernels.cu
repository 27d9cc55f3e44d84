// The kernels that the bench's machine floors time (cli_cuda.cpp): an empty kernel (a graph
// replay of it is the launch floor) and a read-only stream (the bytes floor).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::cli {
namespace {

__global__ void empty_kernel() {}

// Reads every 16-byte word of `words` once, four independent loads in flight per thread per
// step, and folds them into one value that is written only when it matches `never`, so that
// the loads are kept and almost nothing is written.
__global__ void read_stream_kernel(const uint4* __restrict__ words, int64_t count, uint32_t never,
                                   uint32_t* sink) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint32_t fold = 0;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = __ldg(words + i), b = __ldg(words + i + stride),
                c = __ldg(words + i + 2 * stride), d = __ldg(words + i + 3 * stride);
    fold ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
            d.z ^ d.w;
  }
  for (; i < count; i += stride) {
    const uint4 a = __ldg(words + i);
    fold ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (fold == never) *sink = fold;
}

}  // namespace

cudaError_t launch_empty_kernel(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_read_stream(const void* data, int64_t bytes, int blocks, uint32_t* sink,
                               cudaStream_t stream) {
  read_stream_kernel<<<blocks, 512, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16,
                                                 0x9e3779b9u, sink);
  return cudaGetLastError();
}

}  // namespace moekit::cli
