// IntGroupedGemm's decode tactic (int_grouped_gemm.hpp): a grouped GEMV of int codes on the
// tensor cores (mma.sync m16n8k16), each weight element loaded once and multiplied with every row
// of its group in one MMA column tile.
//
// Why the tensor cores: a CUDA-core GEMV decodes each code to fp32 and spends an FMA per code and
// row, ~8 instructions per int4 code at one row (H100: ~30 T lane-instructions/s against 6.1 T
// int4 codes/s at the 3.05 TB/s stream): it is issue-bound before it is memory-bound, and each
// row adds its own loads and FMAs. Here a code becomes a bf16/fp16 integer in ~1.4 instructions
// (int4: a LOP3 that drops the biased nibble into the mantissa of 128 or 1024 and one packed
// subtract per two codes; int8: a PRMT and a subtract per code, through fp32 for bf16), exact
// (|q| <= 128 fits both types), and one MMA multiplies 16 weight rows x 16 k with 8 group rows.
//
// The math stays exact up to fp32 accumulation: the MMA sums code x activation over a 64-wide
// k span (inside one scale group: groups are multiples of 64) in fp32; the span's sum is then
// scaled by the fp32 group scale of its weight row and the zero term times the span's fp32 sum
// of the activations is added:
//   D[m, n] = round(sum over spans sp of (s[g(sp), n] * sum_k q[n, k] x[m, k]
//                                           + z[g(sp), n] * sum_k x[m, k]) + bias[n])
// (the reference's (q * s + z) * x, regrouped; fp32 throughout, one rounding).
//
// Work: a block (8 warps) owns an item of weight rows of one non-empty group: 32 rows (2 m-tiles
// of 16 x 4 k parts: warp w takes the spans w / 2, w / 2 + 4, ..., the parts summed at the
// item's end through shared memory in a fixed order, deterministic) where one slice of staged
// rows holds the whole k, else 128 rows (8 m-tiles x all of k). Each block takes a contiguous
// range of items, so a group's rows are staged once for its row tiles in a row. The group's
// rows (up to NT at a time; more re-stream the weights) are staged in shared memory, in slices
// of k where the whole does not fit, in the order of the MMA's B fragments, with each span's
// fp32 sum for the zero points. Lane (r, c) (r = lane / 4, c = lane % 4) loads, per span, 16
// codes (8 bytes of int4, 16 of int8) of weight rows r and r + 8 of its m-tile at k = span +
// 16c, and their scales, into a ring of kDepth spans of registers that runs ahead across spans,
// slices and items (the stream does not drain at a barrier). Blocks compact the non-empty
// groups from row_offsets themselves (empty experts cost nothing). Launched plainly (no
// programmatic dependent launch): it reads what the kernels before wrote.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cuda_status.hpp"
#include "gemm/int_tactic.hpp"
#include "gemm/stream_gemv.cuh"

namespace moekit::gemm::int_detail {
namespace {

using gemm::detail::kStreamThreads;
using gemm::detail::kStreamWarps;

constexpr int kSpan = 64;  // k per scale application: 16 codes from each of 4 lanes
// An item's warps: kMTiles m-tiles of 16 weight rows x kKParts = 8 / kMTiles parts of k. 2 x 4
// (32-row items: enough items for a few experts' narrow matrices) where one slice holds the
// whole k, so that a block stages its group's rows once for all its items, and in the 8-row
// pass; 8 x 1 (128-row items) where the 16-row pass slices k, so that each restaging of its
// rows serves 4x the codes. The 8-row pass with sliced k on 128-row items left mixtral's FC2
// (k = 14336) at one token 64 items for 132 SMs: 190.7 us against 65.4 for the CUDA-core GEMV
// it replaced (H200, bench/results/2026-12-07-h200-8e8399d-gemv-ab-tune.md).
constexpr int kNarrowMTiles = 2, kTallMTiles = 8;
constexpr int kSpanBytes = kSpan * 2;  // one staged row's span (bf16 / fp16)
// Shared memory a block may use: two blocks per SM on an H100 / H200 (228 KB each SM).
constexpr std::size_t kSmemBudget = 100 * 1024;

struct GemvArgs {
  gemm::detail::StreamGemvArgs base;
  const uint8_t* w;     // [groups, n, k * bits / 8]
  const float* scales;  // [groups, k / group, n]
  const float* zeros;   // [groups, k / group, n] or null
  int group_size;
  int slice_spans;  // spans of k staged at once
};

// Dynamic shared memory: the compacted groups, the staged rows (NT x (slice_spans x kSpanBytes
// + 64): a row stride of 64 mod 128 bytes keeps the B fragment loads free of bank conflicts),
// each span's row sums (zero points), and the k parts' partial sums.
__host__ __device__ constexpr std::size_t active_bytes(int groups) {
  return (sizeof(int) * static_cast<std::size_t>(groups) + 15) / 16 * 16;
}
__host__ __device__ constexpr int row_stride(int slice_spans) {
  return slice_spans * kSpanBytes + 64;
}
template <int NT, bool kZero>
__host__ __device__ constexpr std::size_t span_bytes() {
  return std::size_t(NT) * kSpanBytes + (kZero ? sizeof(float) * NT : 0);
}
template <int NT>
__host__ __device__ constexpr std::size_t red_bytes() {
  return sizeof(float) * kStreamWarps * (NT / 8) * 4 * 32;  // per warp, per C entry
}
template <int NT, bool kZero>
__host__ __device__ constexpr std::size_t smem_bytes(int groups, int slice_spans) {
  return active_bytes(groups) + std::size_t(NT) * row_stride(slice_spans) +
         (kZero ? sizeof(float) * NT * slice_spans : 0) + red_bytes<NT>();
}

// A lane's 16 codes of one weight row (kBits / 2 words): 8 bytes of int4, 16 of int8, read once.
template <int kBits>
__device__ __forceinline__ void load_codes(const uint8_t* p, uint32_t (&w)[kBits / 2]) {
  if constexpr (kBits == 4) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    const uint4 v = gemm::detail::load_stream(p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  }
}

template <class T>
constexpr bool kIsBF16 = std::is_same_v<T, __nv_bfloat16>;

// Two exact integers in one bf16x2 / fp16x2 register: the packed value minus `bias` in both
// halves (an exact subtraction: both results are integers of at most 8 bits).
template <class T>
__device__ __forceinline__ uint32_t minus_bias(uint32_t packed, float bias) {
  if constexpr (kIsBF16<T>) {
    __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&packed);
    h = __hsub2(h, __float2bfloat162_rn(bias));
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    __half2 h = *reinterpret_cast<const __half2*>(&packed);
    h = __hsub2(h, __float2half2_rn(bias));
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The 8 int4 codes of `word` (code i in nibble i, two's complement) as 4 registers of two exact
// integers each: pairs (i, i + 4) for i = 0..3. (nibble ^ 8) is the code + 8 (0..15); in the low
// mantissa bits of 128 (bf16 0x4300) or 1024 (fp16 0x6400) it is 136 + q or 1032 + q, one LOP3
// ((word & 0x000f000f) ^ magic), less the constant.
template <class T>
__device__ __forceinline__ void int4_pairs(uint32_t word, uint32_t (&p)[4]) {
  constexpr uint32_t kMagic = kIsBF16<T> ? 0x43084308u : 0x64086408u;
  constexpr float kBias = kIsBF16<T> ? 136.0f : 1032.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;"
        : "=r"(r)
        : "r"(word >> (4 * i)), "n"(0x000f000f), "n"(kMagic));
    p[i] = minus_bias<T>(r, kBias);
  }
}

// The 4 int8 codes of `word` (code i in byte i, two's complement) as 2 registers: pairs (0, 1)
// and (2, 3). fp16: the biased byte (code ^ 0x80) in the mantissa of 1024 by one PRMT per pair,
// less 1152. bf16 (7 mantissa bits): each biased byte in the mantissa of 2^23 in fp32, less
// 2^23 + 128, and the pair converted (exactly) by one cvt.
template <class T>
__device__ __forceinline__ void int8_pairs(uint32_t word, uint32_t (&p)[2]) {
  const uint32_t biased = word ^ 0x80808080u;
  if constexpr (kIsBF16<T>) {
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      f[i] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440 | i)) - 8388736.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
      p[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
  } else {
    p[0] = minus_bias<T>(__byte_perm(biased, 0x64646464u, 0x4140), 1152.0f);
    p[1] = minus_bias<T>(__byte_perm(biased, 0x64646464u, 0x4342), 1152.0f);
  }
}

// One span's lane operands: 16 codes of weight rows r and r + 8, their scales and zero terms.
template <int kBits>
struct Slot {
  uint32_t w[2][kBits / 2];
  float s[2], z[2];
};

// Where a block's walk over its work stands: an item (group g, rows row0 .. row0 + 31), the
// group rows from c0, the k slice (its spans, and the steps that cover them), and the step j in
// it (the span kpart + 4j of the slice).
struct Cursor {
  int64_t item, row0;
  int g, m0, mg, c0, slice, spans, steps, j;
};

// The walk every warp of a block takes, in the same order: items [.., end), each group's rows
// NT at a time, the slices of k, ceil(spans / 4) steps in each (a step past the slice's spans
// does nothing but keeps the warps' barriers in step).
template <int kMTiles>
struct Walk {
  static constexpr int kKParts = kStreamWarps / kMTiles;
  const int32_t* offsets;
  const int* active;
  int row_tiles, spans, slice_spans, slices;
  int64_t end;

  __device__ __forceinline__ void enter_slice(Cursor& cu, int slice) const {
    cu.slice = slice;
    cu.spans = min(slice_spans, spans - slice * slice_spans);
    cu.steps = (cu.spans + kKParts - 1) / kKParts;
    cu.j = 0;
  }
  __device__ __forceinline__ void start(Cursor& cu) const {
    if (cu.item < end) {
      const int64_t gi = cu.item / row_tiles;
      cu.g = active[gi];
      cu.row0 = (cu.item - gi * row_tiles) * (16 * kMTiles);
      cu.m0 = offsets[cu.g];
      cu.mg = offsets[cu.g + 1] - cu.m0;
    }
    cu.c0 = 0;
    enter_slice(cu, 0);
  }
  __device__ __forceinline__ bool last_step(const Cursor& cu) const {
    return cu.j + 1 == cu.steps && cu.slice + 1 == slices;
  }
  __device__ __forceinline__ void advance(Cursor& cu, int nt_max) const {
    if (++cu.j < cu.steps) return;
    if (cu.slice + 1 < slices) {
      enter_slice(cu, cu.slice + 1);
      return;
    }
    enter_slice(cu, 0);
    cu.c0 += nt_max;
    if (cu.c0 < cu.mg) return;
    ++cu.item;
    start(cu);
  }
};

// Stages rows row0 .. row0 + nt - 1 of `a`, k from k0 over `spans` spans, into s_act: span sp of
// row t at t * stride + sp * kSpanBytes, its 8 vectors of 8 columns (16c + 8v ..) at (4v + c) *
// 16, the order lane c's B fragments read them in; int4 interleaves each vector's columns as
// (0, 4, 1, 5, 2, 6, 3, 7), the pairs its codes decode to. With zero points, each span's fp32
// sum of the row to s_xsum[sp * NT + t] (8 lanes' sums by a fixed shuffle tree). Every thread
// calls it.
template <class T, int kBits, int NT, bool kZero>
__device__ __forceinline__ void stage_rows(const T* a, int64_t k, int64_t row0, int nt, int64_t k0,
                                           int spans, char* s_act, int stride, float* s_xsum) {
  const int vecs_row = spans * (kSpan / 8);
  const int total = nt * vecs_row;  // a multiple of 8: a span's vectors on 8 aligned lanes
  for (int base = 0; base < total; base += kStreamThreads) {
    const int idx = base + static_cast<int>(threadIdx.x);
    const bool on = idx < total;
    uint4 v = make_uint4(0, 0, 0, 0);
    const int t = on ? idx / vecs_row : 0, j = idx - t * vecs_row;
    if (on) {
      v = __ldg(reinterpret_cast<const uint4*>(a + (row0 + t) * k + k0) + j);
      uint4 st = v;
      if constexpr (kBits == 4) {
        st.x = __byte_perm(v.x, v.z, 0x5410);
        st.y = __byte_perm(v.x, v.z, 0x7632);
        st.z = __byte_perm(v.y, v.w, 0x5410);
        st.w = __byte_perm(v.y, v.w, 0x7632);
      }
      const int jj = j & 7;
      *reinterpret_cast<uint4*>(s_act + t * stride + (j >> 3) * kSpanBytes +
                                ((jj & 1) * 4 + (jj >> 1)) * 16) = st;
    }
    if constexpr (kZero) {
      float x[8];
      pipeline::unpack8<T>(v, x);
      float s = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (on && (j & 7) == 0) s_xsum[(j >> 3) * NT + t] = s;
    }
  }
}

// NT: the group's rows per pass over its weights (8 per MMA column tile); kMTiles: the item's
// m-tiles (above). Two blocks per SM.
template <class T, int kBits, bool kZero, int NT, int kMTiles>
__global__ void __launch_bounds__(kStreamThreads, 2) int_gemv_kernel(GemvArgs p) {
  constexpr int kNTiles = NT / 8;
  constexpr int kKParts = Walk<kMTiles>::kKParts;
  // Steps in flight: 2 KB of codes per warp either way (16 KB per block, 32 KB per SM).
  constexpr int kDepth = kBits == 4 ? 4 : 2;
  constexpr bool kBF16 = kIsBF16<T>;
  extern __shared__ __align__(16) char smem[];
  __shared__ int s_warp_live[kStreamWarps];
  const int groups = p.base.groups;
  int* s_active = reinterpret_cast<int*>(smem);
  const int stride = row_stride(p.slice_spans);
  char* s_act = smem + active_bytes(groups);
  float* s_xsum = reinterpret_cast<float*>(s_act + NT * stride);
  float* s_red = s_xsum + (kZero ? NT * p.slice_spans : 0);

  const int live = gemm::detail::compact_live_groups<kStreamWarps>(p.base.row_offsets, groups,
                                                                   s_active, s_warp_live);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mtile = warp % kMTiles, kpart = warp / kMTiles, r = lane >> 2, c = lane & 3;
  const int64_t n = p.base.n, k = p.base.k;
  const int64_t scale_groups = k / p.group_size;
  const T* act = static_cast<const T*>(p.base.a);
  T* out = static_cast<T*>(p.base.d);
  const int64_t items = int64_t(live) * p.base.row_tiles;
  const int spans = static_cast<int>(k / kSpan);
  Walk<kMTiles> walk{p.base.row_offsets,
                     s_active,
                     p.base.row_tiles,
                     spans,
                     p.slice_spans,
                     (spans + p.slice_spans - 1) / p.slice_spans,
                     items * (blockIdx.x + 1) / gridDim.x};

  // The producer: span loads of `cu` into `sl` (zeros where the step or the rows are past the
  // end).
  auto issue = [&](Slot<kBits>& sl, const Cursor& cu) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kBits / 2; ++i) sl.w[h][i] = 0;
      sl.s[h] = 0.0f;
      sl.z[h] = 0.0f;
    }
    if (cu.item >= walk.end) return;
    const int local = kpart + kKParts * cu.j;
    if (local >= cu.spans) return;
    const int64_t sp = int64_t(cu.slice) * p.slice_spans + local;
    const int64_t code = sp * kSpan + 16 * c;
    const int64_t gi = sp * kSpan / p.group_size;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = cu.row0 + mtile * 16 + r + 8 * h;
      if (row >= n) continue;  // n is a multiple of 8: whole 8-row halves
      load_codes<kBits>(p.w + ((int64_t(cu.g) * n + row) * k + code) * kBits / 8, sl.w[h]);
      const int64_t at = (int64_t(cu.g) * scale_groups + gi) * n + row;
      sl.s[h] = __ldg(p.scales + at);
      if constexpr (kZero) sl.z[h] = __ldg(p.zeros + at);
    }
  };

  float acc[kNTiles][4];
#pragma unroll
  for (int t = 0; t < kNTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
  int staged_g = -1, staged_c0 = 0, staged_slice = 0;

  // The consumer: one step of `cu` from `sl`, with the block's stage and item-end barriers.
  auto consume = [&](const Slot<kBits>& sl, const Cursor& cu) {
    const int nt = min(NT, cu.mg - cu.c0);
    if (cu.j == 0 && (cu.g != staged_g || cu.c0 != staged_c0 || cu.slice != staged_slice)) {
      __syncthreads();  // every warp is done with the rows staged before
      stage_rows<T, kBits, NT, kZero>(act, k, cu.m0 + cu.c0, nt,
                                      int64_t(cu.slice) * p.slice_spans * kSpan, cu.spans, s_act,
                                      stride, s_xsum);
      __syncthreads();
      staged_g = cu.g;
      staged_c0 = cu.c0;
      staged_slice = cu.slice;
    }
    const int local = kpart + kKParts * cu.j;
    if (local < cu.spans) {
      float part[kNTiles][4];
#pragma unroll
      for (int t = 0; t < kNTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[t][e] = 0.0f;
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        // The A fragments of the two MMA k steps of vector v: {row r, row r + 8} x {k slots
        // 2c.., 8 + 2c..}, each a register pair of codes.
        uint32_t a[2][4];
        if constexpr (kBits == 4) {
          uint32_t lo[4], hi[4];
          int4_pairs<T>(sl.w[0][v], lo);
          int4_pairs<T>(sl.w[1][v], hi);
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            a[s][0] = lo[2 * s];
            a[s][1] = hi[2 * s];
            a[s][2] = lo[2 * s + 1];
            a[s][3] = hi[2 * s + 1];
          }
        } else {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            uint32_t lo[2], hi[2];
            int8_pairs<T>(sl.w[0][2 * v + s], lo);
            int8_pairs<T>(sl.w[1][2 * v + s], hi);
            a[s][0] = lo[0];
            a[s][1] = hi[0];
            a[s][2] = lo[1];
            a[s][3] = hi[1];
          }
        }
#pragma unroll
        for (int t = 0; t < kNTiles; ++t) {
          if (t > 0 && nt <= 8 * t) break;  // warp-uniform: no group rows in this tile
          // B column r is group row 8t + r (rows past nt read the last one: not stored).
          const int row = min(8 * t + r, nt - 1);
          const uint4 b = *reinterpret_cast<const uint4*>(s_act + row * stride +
                                                          local * kSpanBytes + (4 * v + c) * 16);
          gemm::detail::mma16816<kBF16>(part[t], a[0][0], a[0][1], a[0][2], a[0][3], b.x, b.y);
          gemm::detail::mma16816<kBF16>(part[t], a[1][0], a[1][1], a[1][2], a[1][3], b.z, b.w);
        }
      }
      // C entry e: weight row r + 8 (e / 2), group row 8t + 2c + e % 2.
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
        if (t > 0 && nt <= 8 * t) break;
        float xs[2] = {0.0f, 0.0f};
        if constexpr (kZero)
#pragma unroll
          for (int e = 0; e < 2; ++e) xs[e] = s_xsum[local * NT + min(8 * t + 2 * c + e, nt - 1)];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[t][e] = fmaf(sl.s[e >> 1], part[t][e], acc[t][e]);
          if constexpr (kZero) acc[t][e] = fmaf(sl.z[e >> 1], xs[e & 1], acc[t][e]);
        }
      }
    }
    if (walk.last_step(cu)) {
      // The item's rows c0 .. c0 + nt are done: the k parts' sums, in k-part order; warp
      // (mtile, kpart) finishes C entries kpart, kpart + kKParts, .. of its m-tile.
      auto red = [&](int kp, int mt, int t, int e) -> float& {
        return s_red[(((kp * kMTiles + mt) * kNTiles + t) * 4 + e) * 32 + lane];
      };
#pragma unroll
      for (int t = 0; t < kNTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          red(kpart, mtile, t, e) = acc[t][e];
          acc[t][e] = 0.0f;
        }
      __syncthreads();
#pragma unroll
      for (int e0 = 0; e0 < 4; e0 += kKParts) {
        const int e = e0 + kpart;
        const int64_t row = cu.row0 + mtile * 16 + r + (e >= 2 ? 8 : 0);
        if (row >= n) continue;
        const float b =
            p.base.bias != nullptr ? __ldg(p.base.bias + int64_t(cu.g) * n + row) : 0.0f;
#pragma unroll
        for (int t = 0; t < kNTiles; ++t) {
          const int tok = 8 * t + 2 * c + (e & 1);
          if (tok >= nt) continue;
          float sum = red(0, mtile, t, e);
#pragma unroll
          for (int kp = 1; kp < kKParts; ++kp) sum += red(kp, mtile, t, e);
          out[int64_t(cu.m0 + cu.c0 + tok) * n + row] = pipeline::float_to_elem<T>(sum + b);
        }
      }
      __syncthreads();  // s_red is written again at the next item's end
    }
  };

  // The ring: kDepth steps of loads in flight ahead of the step being computed.
  Cursor prod{items * blockIdx.x / gridDim.x, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  walk.start(prod);
  Cursor cons = prod;
  Slot<kBits> ring[kDepth];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    issue(ring[d], prod);
    walk.advance(prod, NT);
  }
  while (cons.item < walk.end) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (cons.item < walk.end) {  // block-uniform
        consume(ring[d], cons);
        issue(ring[d], prod);
        walk.advance(prod, NT);
        walk.advance(cons, NT);
      }
    }
  }
}

template <class T, int kBits, bool kZero, int NT>
class IntGemvTactic final : public IntTactic {
 public:
  Status init(const IntGroupedShape& s, int device, int sm_count) override {
    (void)device;
    if (s.group_size % kSpan != 0 || s.k % kSpan != 0)
      return Status(ErrorCode::kUnsupported, "int tactic " + name() + ": the group size " +
                                                 std::to_string(s.group_size) + " and k " +
                                                 std::to_string(s.k) + " must be multiples of " +
                                                 std::to_string(kSpan) + " (the MMA's k spans)");
    group_size_ = s.group_size;
    // As much of k per slice as the budget holds (whole k where it fits: staged once per group).
    const std::size_t fixed = smem_bytes<NT, kZero>(s.groups, 0);
    const std::size_t per_span = span_bytes<NT, kZero>();
    if (fixed + per_span > kSmemBudget)
      return Status(ErrorCode::kUnsupported, "int tactic " + name() + ": " +
                                                 std::to_string(s.groups) +
                                                 " groups leave no shared memory for the rows");
    slice_spans_ = static_cast<int>(
        std::min<int64_t>(s.k / kSpan, static_cast<int64_t>((kSmemBudget - fixed) / per_span)));
    const bool narrow = slice_spans_ * kSpan == s.k || NT == 8;
    kernel_ = narrow ? int_gemv_kernel<T, kBits, kZero, NT, kNarrowMTiles>
                     : int_gemv_kernel<T, kBits, kZero, NT, kTallMTiles>;
    return grid_.init(reinterpret_cast<const void*>(kernel_), name(), s.groups, s.n, s.k,
                      s.max_rows, sm_count, smem_bytes<NT, kZero>(s.groups, slice_spans_),
                      16 * (narrow ? kNarrowMTiles : kTallMTiles));
  }

  Status run(const IntProblem& p, cudaStream_t stream) override {
    const int64_t grid = grid_.grid(p.rows_bound);
    if (grid <= 0) return {};
    const GemvArgs a{grid_.args(p.row_offsets, p.bias, p.a, p.d),
                     p.w,
                     p.scales,
                     kZero ? p.zeros : nullptr,
                     group_size_,
                     slice_spans_};
    kernel_<<<static_cast<unsigned>(grid), kStreamThreads, grid_.smem(), stream>>>(a);
    return cuda_status(cudaGetLastError(), grid_.what() + ": kernel launch");
  }

  std::size_t workspace_bytes() const override { return 0; }

  static std::string name() {
    return "sm90.int" + std::to_string(kBits) + ".gemv.n" + std::to_string(NT);
  }

 private:
  int group_size_ = 0;
  int slice_spans_ = 0;
  void (*kernel_)(GemvArgs) = nullptr;
  gemm::detail::StreamGemvGrid grid_;
};

template <class T, int kBits, bool kZero, int NT>
IntTacticEntry gemv_entry() {
  using Tactic = IntGemvTactic<T, kBits, kZero, NT>;
  return IntTacticEntry{Tactic::name(), true, false,
                        []() -> std::unique_ptr<IntTactic> { return std::make_unique<Tactic>(); }};
}

// The GEMVs of one (element type, width, zero points): 8 group rows per pass (one MMA column
// tile) and 16 (two; IntGroupedGemm::pick_tactic says when). Both in every build: they are
// small, and the pick needs both.
template <class T, int kBits, bool kZero>
std::vector<IntTacticEntry> gemv_list() {
  return {gemv_entry<T, kBits, kZero, 8>(), gemv_entry<T, kBits, kZero, 16>()};
}

template <class T, int kBits>
std::vector<IntTacticEntry> gemv_for_zero(bool zero_points) {
  return zero_points ? gemv_list<T, kBits, true>() : gemv_list<T, kBits, false>();
}

template <class T>
std::vector<IntTacticEntry> gemv_for_bits(int bits, bool zero_points) {
  return bits == 4 ? gemv_for_zero<T, 4>(zero_points) : gemv_for_zero<T, 8>(zero_points);
}

}  // namespace

std::vector<IntTacticEntry> sm90_int_gemv_tactics(const IntGroupedShape& s) {
  return s.elem == DType::kFloat16 ? gemv_for_bits<__half>(s.bits, s.zero_points)
                                   : gemv_for_bits<__nv_bfloat16>(s.bits, s.zero_points);
}

}  // namespace moekit::gemm::int_detail
