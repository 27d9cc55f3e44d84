// The CUDA-core grouped GEMV of the microscaling decode tactics (sm90_mx_gemv.cu: MXFP4, NVFP4,
// MXFP8), and the host half (StreamGemvGrid) that the int GEMV (sm90_int_gemv.cu, on the tensor
// cores) shares with it: it streams the packed weights once for the few rows of each group. A block
// of 8 warps owns 32 weight rows of one group (an item); each warp takes 4 of them, one at a time,
// its lanes walking the row in 16-byte chunks two at a time, both loads in flight before either is
// converted. A chunk's weights become fp32 in registers (the format's row decoder, below), and are
// multiplied with the group's rows, NT (8 or 2) at a time (a group with more rows re-reads its
// weights, from L2), into fp32 sums that the warp adds up in a fixed tree (deterministic). The bias
// is added before the one rounding. Blocks are persistent over (non-empty group, row tile) items:
// every block compacts the non-empty groups from row_offsets itself, so empty experts cost nothing.
// Launched plainly (no programmatic dependent launch): it reads what the kernels before wrote.
//
// A row decoder (one weight row of one group) has:
//   static constexpr int kVals;          weights per 16-byte chunk
//   const uint4* chunks;                 the row's packed weights, 16-byte chunks
//   Scale scale(int64_t chunk) const;    the scale(s) of the chunk's weights, loaded and decoded
//   static void decode8(const uint4& v, int j, const Scale& s, float (&w)[8]);
//                                        weights 8j .. 8j + 7 of chunk v, in fp32
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cuda_status.hpp"
#include "common/kernel_smem.hpp"
#include "gemm/gemv_common.cuh"
#include "gemm/live_groups.cuh"
#include "moekit/status.hpp"
#include "pipeline/elem8.cuh"

namespace moekit::gemm::detail {

constexpr int kStreamWarps = 8;
constexpr int kStreamThreads = kStreamWarps * 32;
constexpr int kStreamRowsPerWarp = 4;
constexpr int kStreamRowsPerBlock = kStreamWarps * kStreamRowsPerWarp;

// 32-bit word i (0..3) of a 16-byte chunk: what the row decoders take their values from.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// What every streaming GEMV kernel reads besides its weights.
struct StreamGemvArgs {
  const int32_t* row_offsets;  // [groups + 1], device
  const float* bias;           // [groups, n] or null
  const void* a;               // [rows, k] elem
  void* d;                     // [rows, n] elem
  int groups, n, k, row_tiles;
};

// One weight row's dot products with N (1..NT) of its group's rows, added to acc[0, N): this
// lane's 16-byte chunks of the row, two loads in flight before either is converted. NT is a
// template argument so that every index of acc is static (registers, no local memory).
template <class T, int N, int NT, class Row>
__device__ __forceinline__ void stream_dot_rows(const Row& wr, const T* rows, int64_t k, int lane,
                                                float (&acc)[NT]) {
  constexpr int kVecs = Row::kVals / 8;  // 16-byte vectors of activations per chunk
  const int64_t chunks = k / Row::kVals;
  auto chunk = [&](const uint4& v, int64_t ch) {
    const int64_t k0 = ch * Row::kVals;
    const auto s = wr.scale(ch);
    // Eight weights at a time, each times the same 8 columns of every row.
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      float w[8];
      Row::decode8(v, j, s, w);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float xf[8];
        pipeline::unpack8<T>(__ldg(reinterpret_cast<const uint4*>(rows + int64_t(t) * k + k0) + j),
                             xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[t] = fmaf(w[e], xf[e], acc[t]);
      }
    }
  };
  for (int64_t ch0 = lane; ch0 < chunks; ch0 += 64) {
    const bool second = ch0 + 32 < chunks;
    const uint4 v0 = load_stream(wr.chunks + ch0);
    const uint4 v1 = second ? load_stream(wr.chunks + ch0 + 32) : make_uint4(0, 0, 0, 0);
    chunk(v0, ch0);
    if (second) chunk(v1, ch0 + 32);
  }
}

// stream_dot_rows for a warp-uniform run-time count nt in 1..NT.
template <class T, int NT, class Row, int N = 1>
__device__ __forceinline__ void stream_dot_rows_for(int nt, const Row& wr, const T* rows, int64_t k,
                                                    int lane, float (&acc)[NT]) {
  if constexpr (N < NT) {
    if (nt == N) {
      stream_dot_rows<T, N>(wr, rows, k, lane, acc);
      return;
    }
    stream_dot_rows_for<T, NT, Row, N + 1>(nt, wr, rows, k, lane, acc);
  } else {
    stream_dot_rows<T, NT>(wr, rows, k, lane, acc);
  }
}

// The body of a streaming GEMV kernel of kStreamThreads threads: make_row(g, row) gives the
// decoder of weight row `row` (int64_t) of group g. s_active: dynamic shared memory of `groups`
// ints. Every thread of the block calls it.
template <class T, int NT, class MakeRow>
__device__ __forceinline__ void stream_gemv(const StreamGemvArgs& p, int* s_active,
                                            MakeRow make_row) {
  __shared__ int s_warp_live[kStreamWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int live =
      compact_live_groups<kStreamWarps>(p.row_offsets, p.groups, s_active, s_warp_live);
  const int64_t n = p.n, k = p.k;
  const T* act = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.d);
  const int64_t items = int64_t(live) * p.row_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int g = s_active[item / p.row_tiles];
    const int64_t tile_row0 = (item % p.row_tiles) * kStreamRowsPerBlock;
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    for (int i = 0; i < kStreamRowsPerWarp; ++i) {
      // Neighbouring warps on neighbouring rows: their scale loads share lines.
      const int64_t row = tile_row0 + int64_t(i) * kStreamWarps + warp;
      if (row >= n) break;
      const auto wr = make_row(g, row);
      const float b = p.bias != nullptr ? p.bias[int64_t(g) * n + row] : 0.0f;
      for (int c0 = 0; c0 < mg; c0 += NT) {
        const int nt = min(NT, mg - c0);
        const T* rows = act + int64_t(m0 + c0) * k;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
        stream_dot_rows_for<T, NT>(nt, wr, rows, k, lane, acc);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float sum = acc[t];
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if (lane == t && t < nt)
            out[int64_t(m0 + c0 + t) * n + row] = pipeline::float_to_elem<T>(sum + b);
        }
      }
    }
  }
}

// The host half of a streaming GEMV tactic: loads the kernel, sizes its persistent grid (one
// block per (live group, row tile) item, at most as many as fit on the device at once) and
// fills the arguments every such kernel takes.
class StreamGemvGrid {
 public:
  // `tactic` names the tactic in messages (what()). smem: the kernel's dynamic shared memory
  // (0: the `groups` ints of stream_gemv's compaction); rows_per_item: weight rows per item.
  Status init(const void* kernel, const std::string& tactic, int groups, int64_t n, int64_t k,
              int64_t max_rows, int sm_count, std::size_t smem = 0,
              int rows_per_item = kStreamRowsPerBlock) {
    what_ = "tactic " + tactic + " (groups " + std::to_string(groups) + ", n " + std::to_string(n) +
            ", k " + std::to_string(k) + ")";
    groups_ = groups;
    n_ = static_cast<int>(n);
    k_ = static_cast<int>(k);
    max_rows_ = max_rows;
    smem_ = smem > 0 ? smem : sizeof(int) * static_cast<std::size_t>(groups);
    cudaFuncAttributes attr{};
    Status st =
        moekit::cuda_status(cudaFuncGetAttributes(&attr, kernel), what_ + ": loading the kernel");
    if (!st.ok()) return st;
    // Raised, never lowered: FC1's and FC2's GEMMs launch the same kernel with their own sizes.
    st = moekit::raise_dynamic_smem_limit(kernel, smem_, what_);
    if (!st.ok()) return st;
    int per_sm = 0;
    st = moekit::cuda_status(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kStreamThreads, smem_),
        what_ + ": occupancy");
    if (!st.ok()) return st;
    resident_ = static_cast<int64_t>(std::max(per_sm, 1)) * sm_count;
    row_tiles_ = static_cast<int>((n + rows_per_item - 1) / rows_per_item);
    return {};
  }
  // This run's grid: at most min(groups, rows) groups have rows (rows_bound > 0 caps the rows).
  int64_t grid(int64_t rows_bound) const {
    int64_t live = std::min<int64_t>(groups_, max_rows_);
    if (rows_bound > 0) live = std::min(live, rows_bound);
    return std::min(live * row_tiles_, resident_);
  }
  StreamGemvArgs args(const int32_t* row_offsets, const float* bias, const void* a, void* d) const {
    return StreamGemvArgs{row_offsets, bias, a, d, groups_, n_, k_, row_tiles_};
  }
  std::size_t smem() const { return smem_; }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  int groups_ = 0, n_ = 0, k_ = 0, row_tiles_ = 0;
  int64_t max_rows_ = 0;
  std::size_t smem_ = 0;
  int64_t resident_ = 0;
};

}  // namespace moekit::gemm::detail
