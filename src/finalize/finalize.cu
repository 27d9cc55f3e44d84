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
  int slots_ready;  // slot_row / weights / slot_expert final before the previous kernel started
};

// Eight slots of token t from s0: their rows, weights and (for the bias) experts.
struct Slots8 {
  int32_t row[8], expert[8];
  float w[8];
};

__device__ __forceinline__ void load_slots(const Args& a, int64_t t, int s0, Slots8& sl) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const bool in = s0 + j < a.top_k;
    const int64_t i = t * a.top_k + s0 + j;
    sl.row[j] = in ? __ldg(a.slot_row + i) : -1;
    sl.w[j] = in ? __ldg(a.weights + i) : 0.0f;
    sl.expert[j] = in && a.bias ? __ldg(a.slot_expert + i) : 0;
  }
}

template <class T>
__global__ void __launch_bounds__(256) finalize_kernel(Args a) {
  const int64_t n = a.tokens * a.vecs;
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Settled slots (slots_ready): the first eight of this thread's first token load before the
  // wait, so after FC2 only its output remains to be read.
  bool preloaded = a.slots_ready && idx < n;
  Slots8 first;
  if (preloaded) load_slots(a, idx / a.vecs, 0, first);
  pipeline::pdl_wait();  // FC2's output (and, unless settled, the slots) come from earlier kernels
  pipeline::pdl_launch_dependents();
  for (; idx < n; idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.vecs, v = idx - t * a.vecs;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    // Eight slots at a time: their indices, then their rows, load together (latency matters
    // for small batches); the sum still runs in slot order.
    for (int s0 = 0; s0 < a.top_k; s0 += 8) {
      Slots8 sl;
      if (preloaded) {
        sl = first;
        preloaded = false;
      } else {
        load_slots(a, t, s0, sl);
      }
      uint4 yv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        yv[j] = sl.row[j] >= 0 ? __ldg(a.y + static_cast<int64_t>(sl.row[j]) * a.vecs + v) : uint4{};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (sl.row[j] < 0) continue;
        float y[8];
        pipeline::unpack8<T>(yv[j], y);
        if (a.bias) pipeline::add8(a.bias + static_cast<int64_t>(sl.expert[j]) * a.hidden + 8 * v, y);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(sl.w[j], y[i], acc[i]);
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
           const float* weights, const int32_t* slot_expert, void* out, cudaStream_t stream,
           bool slots_ready) {
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
  a.slots_ready = slots_ready ? 1 : 0;
  const int64_t work = tokens * a.vecs;
  const int blocks = static_cast<int>(std::clamp<int64_t>((work + 255) / 256, 1, 132 * 16));
  const cudaError_t e = pipeline::launch_pdl(pick(f.elem), blocks, 256, 0, stream, a);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("launching the finalize kernel failed: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace moekit::finalize
