// Finalize kernel (finalize.hpp): one thread per 8 output columns of one token; the slots are
// summed in slot order, so the result does not depend on scheduling.
#include <algorithm>
#include <climits>
#include <string>

#include "finalize/finalize.hpp"
#include "pipeline/elem8.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::finalize {
namespace {

constexpr int kThreads = 256, kMaxBlocks = 132 * 16;

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

// kN slots of token t from s0: their rows, weights and, with an FC2 bias, their experts' bias
// at this thread's eight columns (vector v). A dead item (past the last) holds no slot.
template <int kN, bool kBias>
struct Slots {
  int32_t row[kN];
  float w[kN];
  float4 bias[kBias ? kN : 1][2];
};

template <int kN, bool kBias>
__device__ __forceinline__ void load_slots(const Args& a, int64_t t, int64_t v, int s0, bool live,
                                           Slots<kN, kBias>& sl) {
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const bool in = live && s0 + j < a.top_k;
    const int64_t i = t * a.top_k + s0 + j;
    sl.row[j] = in ? __ldg(a.slot_row + i) : -1;
    sl.w[j] = in ? __ldg(a.weights + i) : 0.0f;
    if constexpr (kBias) {
      // Issued with the slots, not after FC2's rows arrive: the bias is a weight and the
      // experts are slot data, so with settled slots this happens before the PDL wait.
      const int32_t e = in ? __ldg(a.slot_expert + i) : -1;
      const float4* p = reinterpret_cast<const float4*>(a.bias + int64_t(e) * a.hidden + 8 * v);
      sl.bias[j][0] = e >= 0 ? __ldg(p) : float4{};
      sl.bias[j][1] = e >= 0 ? __ldg(p + 1) : float4{};
    }
  }
}

// Each thread sums kItems (token, 8 columns) items per step, kN slots at a time: the items'
// slot indices load together, then all their rows, so that a thread keeps kItems x kN row
// vectors in flight (the rows come from DRAM behind the slot indices). One item of 8 slots at
// k = 2 (2 rows in flight) ran mixtral's finalize at 48% of the copy rate at T=16384, against
// 93-96% for qwen3 and deepseek (k = 8); 2 slots x 4 items took it from 195 to 126 us (H200,
// 2026-12-03). Each item sums its slots in slot order.
// kBias: FC2 has a bias, whose eight fp32 values per slot load with the slots and take registers
// (kN = 8 took 148, one block per SM), so its slots go four at a time, one item per thread. Two
// items with the bias loaded after the rows, to fit, made gpt-oss's finalize 166 -> 217 us.
template <class T, bool kBias, int kN, int kItems>
__global__ void __launch_bounds__(kThreads) finalize_kernel(Args a) {
  static_assert(!kBias || kItems == 1, "the bias of several items' slots is too many registers");
  const int64_t n = a.tokens * a.vecs;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;  // item u at + u x this
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t t[kItems], v[kItems];
  auto locate = [&] {
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      t[u] = (idx + u * threads) / a.vecs;
      v[u] = idx + u * threads - t[u] * a.vecs;
    }
  };
  Slots<kN, kBias> sl[kItems];
  auto load = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kItems; ++u) load_slots(a, t[u], v[u], s0, idx + u * threads < n, sl[u]);
  };
  // Settled slots (slots_ready): the first batch of this thread's first items loads before the
  // wait, so after FC2 only its output remains to be read.
  bool preloaded = a.slots_ready && idx < n;
  if (preloaded) {
    locate();
    load(0);
  }
  pipeline::pdl_wait();  // FC2's output (and, unless settled, the slots) come from earlier kernels
  pipeline::pdl_launch_dependents();
  for (; idx < n; idx += kItems * threads) {
    if (!preloaded) locate();
    float acc[kItems][8] = {};
    for (int s0 = 0; s0 < a.top_k; s0 += kN) {
      if (!preloaded) load(s0);
      preloaded = false;
      uint4 yv[kItems][kN];
#pragma unroll
      for (int u = 0; u < kItems; ++u)
#pragma unroll
        for (int j = 0; j < kN; ++j)
          yv[u][j] = sl[u].row[j] >= 0
                         ? __ldg(a.y + static_cast<int64_t>(sl[u].row[j]) * a.vecs + v[u])
                         : uint4{};
#pragma unroll
      for (int u = 0; u < kItems; ++u)
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          if (sl[u].row[j] < 0) continue;
          float y[8];
          pipeline::unpack8<T>(yv[u][j], y);
          if constexpr (kBias) {  // pipeline::add8, from registers
            const float4 b0 = sl[u].bias[j][0], b1 = sl[u].bias[j][1];
            y[0] += b0.x;
            y[1] += b0.y;
            y[2] += b0.z;
            y[3] += b0.w;
            y[4] += b1.x;
            y[5] += b1.y;
            y[6] += b1.z;
            y[7] += b1.w;
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[u][i] = fmaf(sl[u].w[j], y[i], acc[u][i]);
        }
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u)
      if (idx + u * threads < n) a.out[idx + u * threads] = pipeline::pack8<T>(acc[u]);
  }
}

// run_slices: a block sums kQuads x 4 columns of one token over its slots' partials, kLanes
// threads per column quad, each over every kLanes-th (slot, slice) pair in order. The lanes'
// sums then add in a fixed tree (so the result does not depend on scheduling): by shuffles
// within a warp (lanes l and l ^ 1, then ^ 2, then ^ 4), then the warps' sums in warp order,
// then each slot's weighted bias in slot order. 64 lanes: about 180 blocks for an H of 2880, so
// the few MB of partials load from the L2 on most SMs. What runs after the PDL wait is the
// forward's tail at one token, so everything that does not read the partials comes before it:
// the slots (settled) and the bias rows of their experts (weights). H200, 2026-12-02: a serial sum
// of the 64 lanes and bias loads after it took ~4 us from the sliced kernel's end on gpt-oss.
constexpr int kQuads = 4, kLanes = 64, kMaxSliceSlots = 32;
constexpr int kSliceThreads = kQuads * kLanes, kSliceWarps = kSliceThreads / 32;
constexpr int kLanesPerWarp = 32 / kQuads;  // 8: the xor steps 4, 8, 16 of the shuffles

struct SliceArgs {
  const float* partials;  // [rows][slices][hidden]
  const int32_t* slot_row;
  const float* weights;
  const int32_t* slot_expert;
  const float* bias;
  void* out;
  int64_t hidden, slices;
  int top_k;
};

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ float4 shfl_xor4(float4 v, int mask) {
  return make_float4(
      __shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask),
      __shfl_xor_sync(0xffffffffu, v.z, mask), __shfl_xor_sync(0xffffffffu, v.w, mask));
}

template <class T, bool kBias>
__global__ void __launch_bounds__(kSliceThreads) finalize_slices_kernel(SliceArgs a) {
  __shared__ int32_t s_row[kMaxSliceSlots];
  __shared__ float s_w[kMaxSliceSlots];
  __shared__ float4 s_bias[kBias ? kMaxSliceSlots : 1][kQuads];
  __shared__ float4 s_sum[kSliceWarps][kQuads];
  const int64_t t = blockIdx.y;
  const int quad = threadIdx.x % kQuads, lane = threadIdx.x / kQuads;
  const int64_t col = (int64_t(blockIdx.x) * kQuads + quad) * 4;
  // Settled slots, and the bias of each slot's expert at this block's columns: before the wait
  // (run_slices' contract). Thread j * kQuads + q loads slot j's bias for quad q.
  if (threadIdx.x < a.top_k) {
    const int64_t i = t * a.top_k + threadIdx.x;
    s_row[threadIdx.x] = __ldg(a.slot_row + i);
    s_w[threadIdx.x] = __ldg(a.weights + i);
  }
  if constexpr (kBias) {
    if (threadIdx.x < a.top_k * kQuads) {
      const int j = threadIdx.x / kQuads;
      const int64_t i = t * a.top_k + j;
      const int32_t row = __ldg(a.slot_row + i), e = __ldg(a.slot_expert + i);
      s_bias[j][quad] =
          row >= 0 && col < a.hidden
              ? __ldg(reinterpret_cast<const float4*>(a.bias + int64_t(e) * a.hidden + col))
              : float4{};
    }
  }
  pipeline::pdl_wait();  // the partials come from the kernel before
  pipeline::pdl_launch_dependents();
  __syncthreads();
  float4 acc = {0.f, 0.f, 0.f, 0.f};
  if (col < a.hidden) {
    const int n = a.top_k * static_cast<int>(a.slices);
#pragma unroll 4
    for (int p = lane; p < n; p += kLanes) {
      const int q = p / static_cast<int>(a.slices), s = p - q * static_cast<int>(a.slices);
      const int32_t row = s_row[q];
      if (row < 0) continue;
      const float4 v = __ldcg(reinterpret_cast<const float4*>(
          a.partials + (int64_t(row) * a.slices + s) * a.hidden + col));
      const float w = s_w[q];
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
  }
  // Lanes l and l ^ m of a quad are kQuads * m threads apart; a + b == b + a, so both
  // partners hold the same sum after each step.
#pragma unroll
  for (int m = 1; m < kLanesPerWarp; m *= 2) acc = add4(acc, shfl_xor4(acc, m * kQuads));
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < kQuads) s_sum[warp][quad] = acc;
  __syncthreads();
  if (threadIdx.x >= kQuads || col >= a.hidden) return;
  float4 sum = s_sum[0][quad];
#pragma unroll
  for (int w = 1; w < kSliceWarps; ++w) sum = add4(sum, s_sum[w][quad]);
  if constexpr (kBias) {
    for (int j = 0; j < a.top_k; ++j) {
      if (s_row[j] < 0) continue;
      const float4 b = s_bias[j][quad];
      sum.x = fmaf(s_w[j], b.x, sum.x);
      sum.y = fmaf(s_w[j], b.y, sum.y);
      sum.z = fmaf(s_w[j], b.z, sum.z);
      sum.w = fmaf(s_w[j], b.w, sum.w);
    }
  }
  const float four[8] = {sum.x, sum.y, sum.z, sum.w, 0.f, 0.f, 0.f, 0.f};
  const uint4 packed = pipeline::pack8<T>(four);  // the first 8 bytes hold the four values
  *reinterpret_cast<uint2*>(static_cast<T*>(a.out) + t * a.hidden + col) =
      make_uint2(packed.x, packed.y);
}

using SliceKernelFn = void (*)(SliceArgs);

SliceKernelFn pick_slices(DType elem, bool bias) {
  if (elem == DType::kFloat16)
    return bias ? finalize_slices_kernel<__half, true> : finalize_slices_kernel<__half, false>;
  return bias ? finalize_slices_kernel<__nv_bfloat16, true>
              : finalize_slices_kernel<__nv_bfloat16, false>;
}

using KernelFn = void (*)(Args);

// Slots per batch and items per thread: 2 x 4 where k <= 2 without a bias and the grid's
// threads would otherwise hold more than one item each (past kMaxBlocks x kThreads; below, the
// finalize is the forward's latency-bound tail); else 8 slots a batch (4 with a bias), one item.
// k 3-4 without a bias stays on one item: no preset has such a k to measure 4 x 2 on.
template <class T, bool kBias>
KernelFn pick_shape(int top_k, int64_t work) {
  if constexpr (!kBias)
    if (top_k <= 2 && work > int64_t(kMaxBlocks) * kThreads) return finalize_kernel<T, false, 2, 4>;
  return finalize_kernel < T, kBias, kBias ? 4 : 8, 1 > ;
}

KernelFn pick(DType elem, bool bias, int top_k, int64_t work) {
  if (elem == DType::kFloat16)
    return bias ? pick_shape<__half, true>(top_k, work) : pick_shape<__half, false>(top_k, work);
  return bias ? pick_shape<__nv_bfloat16, true>(top_k, work)
              : pick_shape<__nv_bfloat16, false>(top_k, work);
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
  const bool bias = f.fc2_bias != nullptr;
  cudaError_t e = cudaFuncGetAttributes(&attr, pick(f.elem, bias, f.top_k, 0));
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, pick(f.elem, bias, f.top_k, INT64_MAX));
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, pick_slices(f.elem, bias));
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("loading the finalize kernels failed: ") + cudaGetErrorString(e));
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
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
  const cudaError_t e = pipeline::launch_pdl(pick(f.elem, a.bias != nullptr, f.top_k, work), blocks,
                                             kThreads, 0, stream, a);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("launching the finalize kernel failed: ") + cudaGetErrorString(e));
  return {};
}

Status run_slices(const DeviceFinalize& f, int64_t tokens, const float* partials, int64_t slices,
                  const int32_t* slot_row, const float* weights, const int32_t* slot_expert,
                  void* out, cudaStream_t stream) {
  Status s = check(f);
  if (!s.ok()) return s;
  if (f.top_k > kMaxSliceSlots)
    return Status(ErrorCode::kUnsupported, "top_k " + std::to_string(f.top_k) +
                                               " exceeds the sliced finalize's " +
                                               std::to_string(kMaxSliceSlots));
  if (slices < 1 || slices * f.top_k > INT32_MAX)
    return Status(ErrorCode::kInvalidArgument,
                  "slices " + std::to_string(slices) + " is outside [1, 2^31 / top_k)");
  if (tokens <= 0) return {};
  if (tokens > 65535)
    return Status(ErrorCode::kUnsupported,
                  "the sliced finalize runs at most 65535 tokens, not " + std::to_string(tokens));
  SliceArgs a{partials, slot_row, weights, slot_expert, f.fc2_bias, out, f.hidden, slices, f.top_k};
  const dim3 grid(static_cast<unsigned>((f.hidden / 4 + kQuads - 1) / kQuads),
                  static_cast<unsigned>(tokens));
  const cudaError_t e = pipeline::launch_pdl(pick_slices(f.elem, a.bias != nullptr), grid,
                                             kSliceThreads, 0, stream, a);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda, std::string("launching the sliced finalize kernel failed: ") +
                                        cudaGetErrorString(e));
  return {};
}

}  // namespace moekit::finalize
