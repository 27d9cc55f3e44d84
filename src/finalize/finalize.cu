// Finalize kernel (finalize.hpp): one thread per 8 output columns of one token; the slots are
// summed in slot order, so the result does not depend on scheduling.
#include <algorithm>
#include <string>

#include "finalize/finalize.hpp"
#include "pipeline/elem8.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::finalize {
namespace {

struct Args {
  const uint4* y;
  const int32_t* slot_row;
  const float* weights;
  const int32_t* slot_expert;
  const float* bias;
  uint4* out;
  int64_t tokens;
  int64_t vecs;  // 16-byte vectors per row (H / 8)
  int64_t hidden;
  int top_k;
};

template <class T>
__global__ void __launch_bounds__(256) finalize_kernel(Args a) {
  pipeline::pdl_wait();  // FC2's output and the slots come from earlier kernels
  pipeline::pdl_launch_dependents();
  const int64_t n = a.tokens * a.vecs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.vecs, v = idx - t * a.vecs;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    // Eight slots at a time: their indices, then their rows, load together (latency matters
    // for small batches); the sum still runs in slot order.
    for (int s0 = 0; s0 < a.top_k; s0 += 8) {
      int32_t row[8], expert[8];
      float w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const bool in = s0 + j < a.top_k;
        const int64_t i = t * a.top_k + s0 + j;
        row[j] = in ? __ldg(a.slot_row + i) : -1;
        w[j] = in ? __ldg(a.weights + i) : 0.0f;
        expert[j] = in && a.bias ? __ldg(a.slot_expert + i) : 0;
      }
      uint4 yv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        yv[j] = row[j] >= 0 ? __ldg(a.y + static_cast<int64_t>(row[j]) * a.vecs + v) : uint4{};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (row[j] < 0) continue;
        float y[8];
        pipeline::unpack8<T>(yv[j], y);
        if (a.bias) pipeline::add8(a.bias + static_cast<int64_t>(expert[j]) * a.hidden + 8 * v, y);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(w[j], y[i], acc[i]);
      }
    }
    a.out[idx] = pipeline::pack8<T>(acc);
  }
}

using KernelFn = void (*)(Args);

KernelFn pick(DType elem) {
  return elem == DType::kFloat16 ? finalize_kernel<__half> : finalize_kernel<__nv_bfloat16>;
}

Status check(const DeviceFinalize& f) {
  if (f.elem != DType::kBFloat16 && f.elem != DType::kFloat16)
    return Status(ErrorCode::kUnsupported, std::string("finalize element type ") +
                                               to_string(f.elem) + " has no device kernel");
  if (f.hidden <= 0 || f.hidden % 8 != 0)
    return Status(ErrorCode::kUnsupported,
                  "hidden " + std::to_string(f.hidden) + " is not a positive multiple of 8");
  if (f.top_k < 1)
    return Status(ErrorCode::kInvalidArgument, "top_k " + std::to_string(f.top_k) + " is below 1");
  return {};
}

}  // namespace

Status prepare(const DeviceFinalize& f) {
  Status s = check(f);
  if (!s.ok()) return s;
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, pick(f.elem));
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("loading the finalize kernel failed: ") + cudaGetErrorString(e));
  return {};
}

Status run(const DeviceFinalize& f, int64_t tokens, const void* y, const int32_t* slot_row,
           const float* weights, const int32_t* slot_expert, void* out, cudaStream_t stream) {
  Status s = check(f);
  if (!s.ok()) return s;
  if (tokens <= 0) return {};
  Args a{};
  a.y = static_cast<const uint4*>(y);
  a.slot_row = slot_row;
  a.weights = weights;
  a.slot_expert = slot_expert;
  a.bias = f.fc2_bias;
  a.out = static_cast<uint4*>(out);
  a.tokens = tokens;
  a.vecs = f.hidden / 8;
  a.hidden = f.hidden;
  a.top_k = f.top_k;
  const int64_t work = tokens * a.vecs;
  const int blocks = static_cast<int>(std::clamp<int64_t>((work + 255) / 256, 1, 132 * 16));
  const cudaError_t e = pipeline::launch_pdl(pick(f.elem), blocks, 256, 0, stream, a);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("launching the finalize kernel failed: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace moekit::finalize
