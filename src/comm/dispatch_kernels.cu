// Device kernels of expert-parallel dispatch and combine (dispatch_device.hpp): the plan (each
// token once per destination rank, its row in that rank's segment by a block-wide scan in token
// order), the packing of rows / ids / weights, the combine in rank order and the masked layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "comm/dispatch.hpp"
#include "comm/dispatch_device.hpp"
#include "common/cuda_status.hpp"
#include "pipeline/elem8.cuh"

namespace moekit::comm::device {
namespace {

constexpr int kScanThreads = 256;
constexpr int kScanWarps = kScanThreads / 32;
constexpr int kTokensPerThread = 8;  // plan_kernel's tokens per thread and round
constexpr int kCopyThreads = 128;
constexpr int64_t kMaxGrid = 65535;
constexpr unsigned kFull = 0xffffffffu;

// Exclusive prefix of `v` over the block (kScanThreads threads, all of them calling); *total is
// the block's sum. warp_sums: shared [kScanWarps + 1], free again when it returns.
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int w = 0; w < kScanWarps; ++w) {
      const int s = warp_sums[w];
      warp_sums[w] = acc;
      acc += s;
    }
    warp_sums[kScanWarps] = acc;
  }
  __syncthreads();
  const int exclusive = warp_sums[warp] + x - v;
  *total = warp_sums[kScanWarps];
  __syncthreads();
  return exclusive;
}

__device__ bool valid_id(int32_t id, int experts) { return id >= 0 && id < experts; }

// One block per destination rank d: row_of[t, d] and send_counts[d]. Each thread takes
// kTokensPerThread consecutive tokens per round (fewer rounds of the block-wide scan: the
// scan's barriers, not the id loads, bound this kernel). Block 0 also records the first bad id
// (the lowest token * k + slot, as the permute does).
__global__ void plan_kernel(DispatchShape s, const int32_t* __restrict__ ids, DispatchBuffers b) {
  __shared__ int warp_sums[kScanWarps + 1];
  const int d = blockIdx.x, k = s.top_k, n = s.ep_size;
  const int per_rank = s.num_experts / n;
  int64_t running = 0;
  for (int64_t c = 0; c < s.tokens; c += kScanThreads * kTokensPerThread) {
    const int64_t first = c + static_cast<int64_t>(threadIdx.x) * kTokensPerThread;
    const int64_t left = s.tokens - first;
    const int mine = left <= 0                 ? 0
                     : left < kTokensPerThread ? static_cast<int>(left)
                                               : kTokensPerThread;
    unsigned goes = 0;  // bit i: token first + i goes to d
    for (int i = 0; i < mine; ++i) {
      const int64_t t = first + i;
      for (int j = 0; j < k; ++j) {
        const int32_t id = ids[t * k + j];
        if (!valid_id(id, s.num_experts)) {
          if (d == 0) {
            const unsigned long long where = static_cast<unsigned long long>(t * k + j);
            atomicMin(b.error_word, (where << 32) | static_cast<uint32_t>(id));
          }
        } else if (id / per_rank == d) {
          goes |= 1u << i;
        }
      }
    }
    int total = 0;
    int at = block_exclusive_scan(__popc(goes), warp_sums, &total);
    for (int i = 0; i < mine; ++i)
      b.row_of[(first + i) * n + d] = (goes >> i) & 1u ? static_cast<int32_t>(running + at++) : -1;
    running += total;
  }
  if (threadIdx.x == 0) b.send_counts[d] = running;
}

// Where rank d's segment starts, in rows, for every d: shared [n], filled by thread 0.
__device__ void segment_bases(const DispatchShape& s, const int64_t* counts, int64_t* base) {
  if (threadIdx.x == 0) {
    int64_t acc = 0;
    for (int d = 0; d < s.ep_size; ++d) {
      base[d] = s.segment_rows > 0 ? d * s.segment_rows : acc;
      acc += counts[d];
    }
  }
  __syncthreads();
}

// Grid-stride over tokens: each token's row, ids and weights into every segment it goes to.
// Unit: uint4 where rows and pointers are 16-byte aligned, else uint16_t (any even row_bytes).
template <class Unit>
__global__ void pack_kernel(DispatchShape s, const Unit* __restrict__ hidden,
                            const int32_t* __restrict__ ids, const float* __restrict__ weights,
                            DispatchBuffers b) {
  extern __shared__ int64_t base[];
  segment_bases(s, b.send_counts, base);
  const int k = s.top_k, n = s.ep_size;
  const int64_t units = s.row_bytes / static_cast<int64_t>(sizeof(Unit));
  Unit* rows = static_cast<Unit*>(b.send_rows);
  for (int64_t t = blockIdx.x; t < s.tokens; t += gridDim.x) {
    const Unit* src = hidden + t * units;
    for (int d = 0; d < n; ++d) {
      const int32_t r = b.row_of[t * n + d];
      if (r < 0) continue;
      const int64_t pos = base[d] + r;
      Unit* dst = rows + pos * units;
      for (int64_t i = threadIdx.x; i < units; i += blockDim.x) dst[i] = src[i];
      for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int32_t id = ids[t * k + j];
        const bool ok = valid_id(id, s.num_experts);
        b.send_ids[pos * k + j] = ok ? id : -1;
        b.send_weights[pos * k + j] = ok ? weights[t * k + j] : 0.0f;
      }
    }
  }
}

// Fixed segments: ids and weights of the padding rows (count .. segment_rows) of each segment.
__global__ void pad_kernel(DispatchShape s, DispatchBuffers b) {
  const int k = s.top_k;
  const int per_rank = s.num_experts / s.ep_size;
  const int64_t per_segment = s.segment_rows * k, all = per_segment * s.ep_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < all;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i / per_segment);
    const int64_t row = (i % per_segment) / k;
    const int j = static_cast<int>(i % k);
    if (row < b.send_counts[d]) continue;
    const int64_t expert = s.pad_ids == DispatchShape::PadIds::kRoundRobin
                               ? (s.pad_origin + row) * k + j
                               : static_cast<int64_t>(d + 1) * per_rank + j;
    b.send_ids[i] = static_cast<int32_t>(expert % s.num_experts);
    b.send_weights[i] = 0.0f;
  }
}

// Adds 8 consecutive returned elements (16-byte aligned) to acc in fp32.
template <class R>
__device__ __forceinline__ void accumulate8(const R* p, float (&acc)[8]) {
  float f[8];
  pipeline::unpack8<R>(*reinterpret_cast<const uint4*>(p), f);
  for (int i = 0; i < 8; ++i) acc[i] += f[i];
}
__device__ __forceinline__ void accumulate8(const float* p, float (&acc)[8]) {
  pipeline::add8(p, acc);
}
template <class R>
__device__ __forceinline__ float returned_value(R v) {
  return pipeline::elem_to_float(v);
}
template <>
__device__ __forceinline__ float returned_value<float>(float v) {
  return v;
}

// Grid-stride over tokens: out[t] = sum over d ascending of the row back from d, in fp32,
// starting from 0 (the host's order, so the results agree bit for bit). R: the returned rows'
// type (T, or fp32 sums). kVec8: 8 elements per 16-byte load or store (H a multiple of 8,
// aligned rows), else one at a time.
// Shared: [n] segment bases, then [n] this token's rows (-1: not sent).
template <class T, class R, bool kVec8>
__global__ void combine_kernel(DispatchShape s, const int32_t* __restrict__ row_of,
                               const int64_t* __restrict__ counts, const R* __restrict__ returned,
                               T* __restrict__ out) {
  extern __shared__ int64_t base[];
  int64_t* rows = base + s.ep_size;
  segment_bases(s, counts, base);
  const int n = s.ep_size;
  const int64_t H = s.row_bytes / static_cast<int64_t>(sizeof(T));
  for (int64_t t = blockIdx.x; t < s.tokens; t += gridDim.x) {
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
      const int32_t r = row_of[t * n + d];
      rows[d] = r < 0 ? -1 : (base[d] + r) * H;
    }
    __syncthreads();
    if constexpr (kVec8) {
      for (int64_t h = 8 * static_cast<int64_t>(threadIdx.x); h < H; h += 8 * blockDim.x) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int d = 0; d < n; ++d) {
          if (rows[d] >= 0) accumulate8(returned + rows[d] + h, acc);
        }
        *reinterpret_cast<uint4*>(out + t * H + h) = pipeline::pack8<T>(acc);
      }
    } else {
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.0f;
        for (int d = 0; d < n; ++d) {
          if (rows[d] >= 0) acc += returned_value(returned[rows[d] + h]);
        }
        out[t * H + h] = pipeline::float_to_elem<T>(acc);
      }
    }
    __syncthreads();  // rows is rewritten for the next token
  }
}

// dst = float(src), grid-stride; kVec8: 8 elements per step (count a multiple of 8, aligned).
template <class T, bool kVec8>
__global__ void widen_kernel(const T* __restrict__ src, int64_t count, float* __restrict__ dst) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if constexpr (kVec8) {
    for (int64_t i = first; i < count / 8; i += step) {
      float f[8];
      pipeline::unpack8<T>(reinterpret_cast<const uint4*>(src)[i], f);
      float4* d = reinterpret_cast<float4*>(dst) + 2 * i;
      d[0] = make_float4(f[0], f[1], f[2], f[3]);
      d[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
  } else {
    for (int64_t i = first; i < count; i += step) dst[i] = pipeline::elem_to_float(src[i]);
  }
}

// One block per local expert: its slots over every source segment in (source, row) order.
__global__ void masked_kernel(DispatchShape s, int dest_rank, int64_t capacity,
                              const int32_t* __restrict__ recv_ids,
                              const int64_t* __restrict__ recv_counts, MaskedDeviceLayout out) {
  __shared__ int warp_sums[kScanWarps + 1];
  const int e = blockIdx.x, k = s.top_k;
  const int per_rank = s.num_experts / s.ep_size;
  const int32_t expert = dest_rank * per_rank + e;
  int64_t running = 0;
  for (int src = 0; src < s.ep_size; ++src) {
    // A count outside [0, segment_rows] is clamped: nothing past the segment is read.
    const int64_t sent = recv_counts[src];
    const int64_t rows = sent < 0 ? 0 : sent > s.segment_rows ? s.segment_rows : sent;
    const int32_t* seg = recv_ids + src * s.segment_rows * k;
    for (int64_t c = 0; c < rows; c += kScanThreads) {
      const int64_t i = c + threadIdx.x;
      int slot = -1;
      if (i < rows) {
        for (int j = 0; j < k && slot < 0; ++j) {
          if (seg[i * k + j] == expert) slot = j;
        }
      }
      int total = 0;
      const int before = block_exclusive_scan(slot >= 0 ? 1 : 0, warp_sums, &total);
      const int64_t pos = running + before;
      if (slot >= 0 && pos < capacity) {
        const int64_t at = e * capacity + pos;
        out.slot_rank[at] = src;
        out.slot_row[at] = static_cast<int32_t>(i);
        out.slot_k[at] = slot;
      }
      running += total;
    }
  }
  if (threadIdx.x == 0) {
    out.count[e] = running < capacity ? running : capacity;
    if (running > capacity)
      atomicAdd(reinterpret_cast<unsigned long long*>(out.dropped),
                static_cast<unsigned long long>(running - capacity));
  }
}

Status invalid(const std::string& m) { return Status(ErrorCode::kInvalidArgument, m); }

Status check_shape(const DispatchShape& s) {
  if (s.ep_size > kMaxDispatchRanks)
    return invalid("ep_size " + std::to_string(s.ep_size) + " above the kernels' " +
                   std::to_string(kMaxDispatchRanks) + " ranks");
  if (s.ep_size < 1 || s.num_experts < s.ep_size || s.num_experts % s.ep_size != 0)
    return invalid("ep_size " + std::to_string(s.ep_size) + " does not divide num_experts " +
                   std::to_string(s.num_experts));
  if (s.top_k < 1 || s.top_k > s.num_experts)
    return invalid("top_k " + std::to_string(s.top_k) + " outside [1, " +
                   std::to_string(s.num_experts) + "]");
  if (s.tokens < 0 || s.tokens > INT32_MAX / s.top_k)
    return invalid("dispatch of " + std::to_string(s.tokens) + " tokens");
  if (s.row_bytes <= 0 || s.row_bytes % 2 != 0)
    return invalid("row of " + std::to_string(s.row_bytes) + " bytes (a positive even size)");
  if (s.segment_rows < 0 || (s.segment_rows > 0 && s.tokens > s.segment_rows))
    return invalid(std::to_string(s.tokens) + " tokens do not fit segments of " +
                   std::to_string(s.segment_rows) + " rows");
  if (s.pad_origin < 0 || s.pad_origin > INT64_MAX / 2 / s.top_k - s.segment_rows)
    return invalid("padding origin " + std::to_string(s.pad_origin));
  return {};
}

Status check_half_dtype(DType dtype, const char* what) {
  if (dtype == DType::kBFloat16 || dtype == DType::kFloat16) return {};
  return Status(ErrorCode::kUnsupported,
                std::string(what) + " of " + to_string(dtype) + " rows (bf16 or fp16)");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int grid_for(int64_t items) {
  return static_cast<int>(std::max<int64_t>(1, std::min(items, kMaxGrid)));
}

template <class T, class R>
void launch_combine(const DispatchShape& s, bool vec8, const int32_t* row_of, const int64_t* counts,
                    const void* returned, void* out, cudaStream_t stream) {
  const size_t smem = 2 * sizeof(int64_t) * s.ep_size;
  auto kernel = vec8 ? combine_kernel<T, R, true> : combine_kernel<T, R, false>;
  kernel<<<grid_for(s.tokens), kCopyThreads, smem, stream>>>(
      s, row_of, counts, static_cast<const R*>(returned), static_cast<T*>(out));
}

template <class T>
void launch_combine(const DispatchShape& s, bool vec8, bool returned_f32, const int32_t* row_of,
                    const int64_t* counts, const void* returned, void* out, cudaStream_t stream) {
  if (returned_f32)
    launch_combine<T, float>(s, vec8, row_of, counts, returned, out, stream);
  else
    launch_combine<T, T>(s, vec8, row_of, counts, returned, out, stream);
}

template <class T>
void launch_widen(const void* src, int64_t count, float* dst, cudaStream_t stream) {
  const bool vec8 = count % 8 == 0 && aligned16(src) && aligned16(dst);
  const int64_t items = vec8 ? count / 8 : count;
  auto kernel = vec8 ? widen_kernel<T, true> : widen_kernel<T, false>;
  kernel<<<grid_for((items + 255) / 256), 256, 0, stream>>>(static_cast<const T*>(src), count, dst);
}

}  // namespace

Status pack_dispatch(const DispatchShape& s, const void* hidden, const int32_t* ids,
                     const float* weights, const DispatchBuffers& b, cudaStream_t stream) {
  if (Status st = check_shape(s); !st.ok()) return st;
  plan_kernel<<<s.ep_size, kScanThreads, 0, stream>>>(s, ids, b);
  const size_t smem = sizeof(int64_t) * s.ep_size;
  if (s.tokens > 0) {
    if (s.row_bytes % 16 == 0 && aligned16(hidden) && aligned16(b.send_rows))
      pack_kernel<uint4><<<grid_for(s.tokens), kCopyThreads, smem, stream>>>(
          s, static_cast<const uint4*>(hidden), ids, weights, b);
    else
      pack_kernel<uint16_t><<<grid_for(s.tokens), kCopyThreads, smem, stream>>>(
          s, static_cast<const uint16_t*>(hidden), ids, weights, b);
  }
  if (s.segment_rows > 0) {
    const int64_t entries = s.segment_rows * s.top_k * s.ep_size;
    pad_kernel<<<grid_for((entries + 255) / 256), 256, 0, stream>>>(s, b);
  }
  return cuda_status(cudaGetLastError(), "launching the EP dispatch kernels");
}

Status combine(const DispatchShape& s, DType dtype, const int32_t* row_of,
               const int64_t* send_counts, const void* returned, void* out, cudaStream_t stream,
               bool returned_f32) {
  if (Status st = check_shape(s); !st.ok()) return st;
  if (Status st = check_half_dtype(dtype, "EP combine"); !st.ok()) return st;
  if (s.tokens == 0) return {};
  const bool vec8 = s.row_bytes % 16 == 0 && aligned16(returned) && aligned16(out);
  if (dtype == DType::kBFloat16)
    launch_combine<__nv_bfloat16>(s, vec8, returned_f32, row_of, send_counts, returned, out,
                                  stream);
  else
    launch_combine<__half>(s, vec8, returned_f32, row_of, send_counts, returned, out, stream);
  return cuda_status(cudaGetLastError(), "launching the EP combine kernel");
}

Status widen_to_f32(DType dtype, const void* src, int64_t count, float* dst, cudaStream_t stream) {
  if (Status st = check_half_dtype(dtype, "EP widening"); !st.ok()) return st;
  if (count < 0) return invalid("widening " + std::to_string(count) + " elements");
  if (count == 0) return {};
  if (dtype == DType::kBFloat16)
    launch_widen<__nv_bfloat16>(src, count, dst, stream);
  else
    launch_widen<__half>(src, count, dst, stream);
  return cuda_status(cudaGetLastError(), "launching the EP widening kernel");
}

Status build_masked_layout(const DispatchShape& s, int dest_rank, int64_t capacity,
                           const int32_t* recv_ids, const int64_t* recv_counts,
                           const MaskedDeviceLayout& out, cudaStream_t stream) {
  if (Status st = check_shape(s); !st.ok()) return st;
  if (s.segment_rows < 1)
    return invalid("the masked layout reads low-latency segments; segment_rows " +
                   std::to_string(s.segment_rows));
  if (dest_rank < 0 || dest_rank >= s.ep_size)
    return invalid("destination rank " + std::to_string(dest_rank) + " in a world of " +
                   std::to_string(s.ep_size));
  if (capacity < 0 || capacity > INT32_MAX)
    return invalid("masked layout with capacity " + std::to_string(capacity));
  if (Status st = cuda_status(cudaMemsetAsync(out.dropped, 0, sizeof(int64_t), stream),
                              "clearing the masked layout's drop count");
      !st.ok())
    return st;
  masked_kernel<<<s.num_experts / s.ep_size, kScanThreads, 0, stream>>>(s, dest_rank, capacity,
                                                                        recv_ids, recv_counts, out);
  return cuda_status(cudaGetLastError(), "launching the EP masked layout kernel");
}

}  // namespace moekit::comm::device
