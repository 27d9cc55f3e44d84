// The prefill kernel of the weight-only formats whose scales CUTLASS 4.2 cannot apply (MX's per-32
// and NVFP4's per-16 scales, int groups of 32; sm90_mx_wgmma.cu, sm90_int_wgmma.cu): a grouped
// GEMM whose packed weights are decoded to bf16 in registers, by a format's decoder, and are the
// register operand A of `wgmma m64nNk16` (D^T = W A^T: weight rows are the MMA's m, tokens its
// n); the bf16 activations are the shared-memory operand B.
//
// A block: warpgroup 0 is the producer (one thread issues TMA: per 64-deep k stage, the N token
// rows of activations, 128-byte swizzled, and 256 weight rows of packed bytes), warpgroups 1 and
// 2 the consumers, each 128 of the 256 weight rows (two m64 tiles) times the stage's N tokens. A
// consumer decodes each 32-deep half stage into registers while the MMAs of the half before run
// (two register sets; wait_group 1), its scales loaded from global memory one stage ahead. Tiles
// are (expert, token tile, 256-row tile), the row tile fastest (the token tile's activations
// stay in L2), every block walking the same table built in shared memory from row_offsets (no
// host sync; graph-capturable). Rows past an expert's n or tokens past its rows are computed
// (they read the next expert's bytes or TMA's zeros) and not stored. D = the fp32 sums times
// the decoder's sum scale, plus the bias, rounded once to bf16.
//
// A decoder (one thread's view of one tile's weights) has:
//   static constexpr int kBits;      bits per packed weight (4 or 8)
//   using Args;                      what it reads besides the packed weights (device pointers)
//   struct Stage;                    its scales for one k stage
//   Dec(const Args&, int g, int n, int k, const int (&rows)[4]);   rows: the thread's weight
//                                    rows (clamped below n), m64 tile 0's g, g + 8, then tile 1's
//   Stage load(int kb) const;        stage kb's scales (issued a stage before they are used)
//   static void decode(const uint8_t* const (&wrow)[4], int h, uint32_t c, const Stage&,
//                      uint32_t (&a)[2][2][4]);   (host and device: tested on the host)
//                                    half stage h of the rows' bytes in shared memory (wrow[r]:
//                                    row r's kBoxK * kBits / 8 bytes) into the A fragments:
//                                    a[tile][k16 step][register], c = lane % 4
//   float sum_scale() const;         multiplies the fp32 sums (NVFP4's global scale), else 1
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "common/cuda_status.hpp"
#include "common/kernel_smem.hpp"
#include "gemm/sm90_decoded_wgmma_tiles.cuh"
#include "gemm/tensor_map.hpp"
#include "moekit/status.hpp"

namespace moekit::gemm::detail {

namespace decoded_wgmma {

namespace gmma = cute::SM90::GMMA;
using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

constexpr int kBoxK = 64;      // k per stage: one 128-byte row of bf16 activations
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr std::size_t kAlign = 1024;  // the 128-byte swizzle's period
constexpr int kSmemBudget = 192 * 1024;

template <int kBits, int N>
struct Layout {
  static constexpr int kRowBytes = kBoxK * kBits / 8;  // a weight row's bytes per stage
  static constexpr int kActBytes = N * kBoxK * 2;
  static constexpr int kWeightBytes = kTileRows * kRowBytes;
  static constexpr int kStageBytes = kActBytes + kWeightBytes;
  static constexpr int kStages = std::min(8, kSmemBudget / kStageBytes);
  static_assert(kActBytes % kAlign == 0, "each stage's activations start on a swizzle period");

  uint8_t* acts;     // [kStages][N][128 B], swizzled
  uint8_t* weights;  // [kStages][kTileRows][kRowBytes]
  uint64_t* full;    // [kStages]
  uint64_t* empty;   // [kStages]
  int* tile_end;     // [groups]: tiles of groups 0..g, inclusive
  int* offsets;      // [groups + 1]: row_offsets

  __device__ __forceinline__ Layout(uint8_t* raw, int groups) {
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    acts = raw + ((kAlign - base % kAlign) % kAlign);
    weights = acts + kStages * kActBytes;
    full = reinterpret_cast<uint64_t*>(weights + kStages * kWeightBytes);
    empty = full + kStages;
    tile_end = reinterpret_cast<int*>(empty + kStages);
    offsets = tile_end + groups;
  }
  static std::size_t smem_bytes(int groups) {
    return kAlign + std::size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) +
           sizeof(int) * (2 * static_cast<std::size_t>(groups) + 1);
  }
};

template <class DecArgs>
struct Args {
  const int32_t* row_offsets;  // [groups + 1]
  const float* bias;           // [groups, n] or null
  __nv_bfloat16* d;            // [rows, n]
  int groups, n, k;
  DecArgs dec;
};

// The tile table in shared memory (every thread calls it): offsets copied, and per group
// ceil(rows / N) x row_tiles tiles, scanned. Returns the tile count.
template <int N>
__device__ int build_tiles(const int32_t* row_offsets, int groups, int row_tiles, int* tile_end,
                           int* offsets) {
  __shared__ int s_warp[kThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int g = tid; g <= groups; g += kThreads) offsets[g] = row_offsets[g];
  __syncthreads();
  int carry = 0;
  for (int g0 = 0; g0 < groups; g0 += kThreads) {
    const int g = g0 + tid;
    int v = g < groups ? (offsets[g + 1] - offsets[g] + N - 1) / N * row_tiles : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += y;
    }
    if (lane == 31) s_warp[warp] = v;
    __syncthreads();
    int before = carry;
    for (int w = 0; w < warp; ++w) before += s_warp[w];
    if (g < groups) tile_end[g] = before + v;
    for (int w = 0; w < kThreads / 32; ++w) carry += s_warp[w];
    __syncthreads();
  }
  return carry;
}

// The wgmma descriptor of a K-major bf16 tile whose 128-byte rows TMA wrote with the 128-byte
// swizzle: 8-row core groups 1024 bytes apart; a 16-deep k step is 32 bytes further in.
__device__ __forceinline__ uint64_t act_desc(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((addr & 0x3ffff) >> 4);
  d.bitfield.leading_byte_offset_ = 1;  // not read with a swizzled K-major layout
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(gmma::LayoutType::B128);
  return d.desc_;
}

template <int N>
struct Mma;
template <>
struct Mma<128> {
  using Op = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct Mma<64> {
  using Op = gmma::MMA_64x64x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};

template <int N, std::size_t... I>
__device__ __forceinline__ void wgmma_rs(const uint32_t (&a)[4], uint64_t desc, float (&acc)[N / 2],
                                         bool zero, std::index_sequence<I...>) {
  Mma<N>::Op::fma(a[0], a[1], a[2], a[3], desc, acc[I]...,
                  zero ? gmma::ScaleOut::Zero : gmma::ScaleOut::One);
}

template <int N>
__device__ __forceinline__ void fence_acc(float (&acc)[2][N / 2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < N / 2; ++j) cute::warpgroup_fence_operand(acc[i][j]);
}

// The MMAs of one half stage: both m64 tiles, both k16 steps; `zero` starts the sums.
template <int N>
__device__ __forceinline__ void mma_half(const uint32_t (&a)[2][2][4], uint32_t act_stage, int h,
                                         float (&acc)[2][N / 2], bool zero) {
  cute::warpgroup_arrive();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint64_t desc = act_desc(act_stage + 32 * (2 * h + j));
#pragma unroll
    for (int i = 0; i < 2; ++i)
      wgmma_rs<N>(a[i][j], desc, acc[i], zero && j == 0, std::make_index_sequence<N / 2>{});
  }
  cute::warpgroup_commit_batch();
}

// D[m0 + token, row] for this thread's accumulators: fp32 times `scale`, plus the bias, rounded
// once. A pair of rows per 32-bit store: lanes g and g ^ 1 swap so that each holds rows
// (2 floor(g / 2), + 1) of one token. row0: the warp's first weight row.
template <int N, class DecArgs>
__device__ __forceinline__ void store_tile(const Args<DecArgs>& p, const float (&acc)[2][N / 2],
                                           const Tile& t, int m0, int mg, int row0, float scale,
                                           int lane) {
  const int gq = lane >> 2, c = lane & 3;
  const bool odd = gq & 1;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + i * 64 + 8 * half + (gq & ~1);  // the pair's first weight row
      const bool row_ok = row < p.n;
      float2 b = make_float2(0.0f, 0.0f);
      if (p.bias != nullptr && row_ok)
        b = __ldg(reinterpret_cast<const float2*>(p.bias + int64_t(t.g) * p.n + row));
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const float v0 = acc[i][4 * j + 2 * half], v1 = acc[i][4 * j + 2 * half + 1];
        const float recv = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
        const float lo = odd ? recv : v0, hi = odd ? v1 : recv;
        const int token = t.t0 + 8 * j + 2 * c + (odd ? 1 : 0);
        if (row_ok && token < mg) {
          const __nv_bfloat162 out =
              __floats2bfloat162_rn(fmaf(lo, scale, b.x), fmaf(hi, scale, b.y));
          *reinterpret_cast<__nv_bfloat162*>(p.d + (int64_t(m0) + token) * p.n + row) = out;
        }
      }
    }
}

template <class Dec, int N>
__global__ void __launch_bounds__(kThreads, 1)
    decoded_wgmma_kernel(const __grid_constant__ CUtensorMap acts,
                         const __grid_constant__ CUtensorMap weights, Args<typename Dec::Args> p) {
  using L = Layout<Dec::kBits, N>;
  extern __shared__ uint8_t raw[];
  const L sm(raw, p.groups);
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      FullBarrier::init(&sm.full[s], 1);
      EmptyBarrier::init(&sm.empty[s], kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  const int row_tiles = (p.n + kTileRows - 1) / kTileRows;
  const int tiles =
      build_tiles<N>(p.row_offsets, p.groups, row_tiles, sm.tile_end, sm.offsets);  // syncs
  const int k_stages = p.k / kBoxK;
  const int wg = tid / 128;

  if (wg == 0) {  // the producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (tid != 0) return;
    cute::prefetch_tma_descriptor(&acts);
    cute::prefetch_tma_descriptor(&weights);
    int stage = 0;
    uint32_t phase = 0;
    for (int i = blockIdx.x; i < tiles; i += gridDim.x) {
      const Tile t = tile_at<N>(i, sm.tile_end, p.groups, row_tiles);
      const int act_row = sm.offsets[t.g] + t.t0, weight_row = t.g * p.n + t.n0;
      for (int kb = 0; kb < k_stages; ++kb) {
        EmptyBarrier::wait(&sm.empty[stage], phase ^ 1);
        FullBarrier::arrive_and_expect_tx(&sm.full[stage], L::kStageBytes);
        cute::SM90_TMA_LOAD_2D::copy(&acts, &sm.full[stage],
                                     uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                     sm.acts + stage * L::kActBytes, kb * kBoxK, act_row);
        cute::SM90_TMA_LOAD_2D::copy(
            &weights, &sm.full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
            sm.weights + stage * L::kWeightBytes, kb * L::kRowBytes, weight_row);
        if (++stage == L::kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int lane = tid & 31;
  const uint32_t c = lane & 3;
  const int warp_row0 = (wg - 1) * 128 + ((tid >> 5) & 3) * 16;  // the warp's first row
  const int first_row = warp_row0 + (lane >> 2);                 // + 64 tile + 8 half
  int stage = 0;
  uint32_t phase = 0;
  float acc[2][N / 2];
  for (int i = blockIdx.x; i < tiles; i += gridDim.x) {
    const Tile t = tile_at<N>(i, sm.tile_end, p.groups, row_tiles);
    const int m0 = sm.offsets[t.g], mg = sm.offsets[t.g + 1] - m0;
    int rows[4];
#pragma unroll
    for (int r = 0; r < 4; ++r)  // rows past n decode the last row (not stored)
      rows[r] = min(t.n0 + first_row + 64 * (r >> 1) + 8 * (r & 1), p.n - 1);
    const Dec dec(p.dec, t.g, p.n, p.k, rows);
    typename Dec::Stage sc = dec.load(0);
    int prev = 0;
    for (int kb = 0; kb < k_stages; ++kb) {
      const typename Dec::Stage next = kb + 1 < k_stages ? dec.load(kb + 1) : sc;
      FullBarrier::wait(&sm.full[stage], phase);
      const uint8_t* wbase = sm.weights + stage * L::kWeightBytes;
      const uint8_t* wrow[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        wrow[r] = wbase + (first_row + 64 * (r >> 1) + 8 * (r & 1)) * L::kRowBytes;
      const uint32_t act_stage =
          static_cast<uint32_t>(__cvta_generic_to_shared(sm.acts + stage * L::kActBytes));
      uint32_t a0[2][2][4], a1[2][2][4];
      dec.decode(wrow, 0, c, sc, a0);
      if (kb == 0) fence_acc<N>(acc);
      mma_half<N>(a0, act_stage, 0, acc, kb == 0);
      cute::warpgroup_wait<1>();  // the stage before is done: free it
      if (kb > 0 && lane == 0) EmptyBarrier::arrive(&sm.empty[prev]);
      dec.decode(wrow, 1, c, sc, a1);
      mma_half<N>(a1, act_stage, 1, acc, false);
      cute::warpgroup_wait<1>();
      prev = stage;
      if (++stage == L::kStages) {
        stage = 0;
        phase ^= 1;
      }
      sc = next;
    }
    cute::warpgroup_wait<0>();
    fence_acc<N>(acc);
    if (lane == 0) EmptyBarrier::arrive(&sm.empty[prev]);
    store_tile<N>(p, acc, t, m0, mg, t.n0 + warp_row0, dec.sum_scale(), lane);
  }
}

}  // namespace decoded_wgmma

// The host half of one (decoder, N) kernel: loads it, and per run encodes the tensor maps (again
// only when a tensor moves) and launches a persistent grid, one block per SM at most.
template <class Dec, int N>
class DecodedWgmma {
  using L = decoded_wgmma::Layout<Dec::kBits, N>;

 public:
  static constexpr int kTokens = N;

  Status init(const std::string& what, int groups, int64_t n, int64_t k, int64_t max_rows,
              int sm_count) {
    what_ = what;
    groups_ = groups;
    n_ = n;
    k_ = k;
    max_rows_ = max_rows;
    sm_count_ = sm_count;
    if (k % decoded_wgmma::kBoxK != 0)
      return Status(ErrorCode::kUnsupported, what_ + ": k must be a multiple of 64");
    if (int64_t(groups) * n + decoded_wgmma::kTileRows > INT32_MAX || max_rows + N > INT32_MAX)
      return Status(ErrorCode::kUnsupported, what_ + ": groups x n or max_rows exceed int32 rows");
    Status st;
    encode_ = tensor_map_encoder(st);
    if (!st.ok()) return Status(st.code(), what_ + ": " + st.message());
    smem_ = L::smem_bytes(groups);
    const void* kernel = reinterpret_cast<const void*>(decoded_wgmma::decoded_wgmma_kernel<Dec, N>);
    cudaFuncAttributes attr{};
    st = cuda_status(cudaFuncGetAttributes(&attr, kernel), what_ + ": loading the kernel");
    if (!st.ok()) return st;
    return raise_dynamic_smem_limit(kernel, smem_, what_);
  }

  // a: bf16 [max_rows, k]; w: [groups * n, k * kBits / 8] bytes; d: bf16 [rows, n].
  Status run(const void* a, const void* w, const int32_t* row_offsets, const float* bias, void* d,
             const typename Dec::Args& dec, int64_t rows_bound, cudaStream_t stream) {
    const int64_t row_bytes = k_ * Dec::kBits / 8;
    Status st = acts_.encode(encode_, a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, k_, max_rows_,
                             decoded_wgmma::kBoxK, N, CU_TENSOR_MAP_SWIZZLE_128B, what_ + ": A");
    if (!st.ok()) return st;
    st = weights_.encode(encode_, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, row_bytes,
                         int64_t(groups_) * n_, L::kRowBytes, decoded_wgmma::kTileRows,
                         CU_TENSOR_MAP_SWIZZLE_NONE, what_ + ": the weights");
    if (!st.ok()) return st;
    // At most rows_bound's token tiles plus one per group with rows, times the row tiles.
    const int64_t rows = rows_bound > 0 ? std::min(rows_bound, max_rows_) : max_rows_;
    const int64_t row_tiles = (n_ + decoded_wgmma::kTileRows - 1) / decoded_wgmma::kTileRows;
    const int64_t tiles = ((rows + N - 1) / N + std::min<int64_t>(groups_, rows)) * row_tiles;
    const int64_t grid = std::min<int64_t>(tiles, sm_count_);
    if (grid <= 0) return {};
    const decoded_wgmma::Args<typename Dec::Args> args{
        row_offsets,          bias, static_cast<__nv_bfloat16*>(d), groups_, static_cast<int>(n_),
        static_cast<int>(k_), dec};
    decoded_wgmma::decoded_wgmma_kernel<Dec, N>
        <<<static_cast<unsigned>(grid), decoded_wgmma::kThreads, smem_, stream>>>(
            acts_.desc, weights_.desc, args);
    return cuda_status(cudaGetLastError(), what_ + ": kernel launch");
  }

 private:
  std::string what_;
  int groups_ = 0;
  int64_t n_ = 0, k_ = 0, max_rows_ = 0;
  int sm_count_ = 0;
  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  std::size_t smem_ = 0;
  TensorMap2d acts_, weights_;
};

}  // namespace moekit::gemm::detail
