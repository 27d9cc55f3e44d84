// Grouped GEMV-style kernel for decode: few token rows per expert, so the layer is bound by
// reading the hit experts' weights once. Weights are the M side of mma.sync m16n8k16 (16 weight
// rows per warp), the expert's tokens the N side (8 per fragment, NT fragments), fp32 accumulate.
//
// Each lane loads 16 contiguous bytes (8 k values) of its weight rows and of its token row. Within
// a 32-wide k block, lane quad q holds physical k [8q, 8q+8) and feeds them to two mma k-steps as
// the logical k pairs {2q, 2q+1} and {2q+8, 2q+9} of each step. The sum over k is unchanged
// because A and B use the same permutation; in return every load is a full 16-byte vector.
//
// A block of 8 warps owns 16*rw weight rows of one expert; its warps split k kw ways (rw*kw = 8)
// and reduce through shared memory, so no split-K workspace or second pass is needed. Blocks are
// persistent over (non-empty expert, row tile) items: each block compacts the non-empty groups
// from row_offsets itself, so experts with no rows cost nothing. An expert with more than 8*NT
// rows is handled in chunks (correct for any distribution, re-reading its weights from L2).
//
// The "+act" kernels apply FC1's bias and gated activation in the final reduction: with the
// blocked gate/up row order (activation_math.hpp) a warp's 16 rows are 8 gates and their ups, so
// one thread sums a gate and its up and writes one activation of [rows, n / 2].
//
// Launched with programmatic dependent launch (pipeline/pdl.cuh): the kernel waits for the
// previous one before its first read, so only its launch overlaps that kernel's tail, and it
// lets the next kernel launch as soon as it has passed that wait.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gemm/gemv_common.cuh"
#include "gemm/live_groups.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::gemm::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// 32-wide k blocks per warp step: 2 * kSub 16-byte weight loads in flight per lane. Fewer for
// the widest token tile, whose activation fragments take the registers. (8 for one fragment
// spilled and was no faster: bench/NOTES.md.)
template <int NT>
constexpr int kSub = NT >= 4 ? 2 : 4;
// Largest block item (16 * rw weight rows) that FC2 prefetches into L2 before its wait.
constexpr int64_t kPrefetchMaxBytes = 48 * 1024;

template <bool kBF16, int NT, bool kAct>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemv_kernel(GemvParams p) {
  extern __shared__ int s_active[];  // [groups]: non-empty groups, in order
  __shared__ int s_warp_live[kWarps];
  // Two buffers for the kw partial tiles, used by alternate passes: a pass's write follows the
  // previous pass's barrier, which every thread reaches only after reading the buffer two
  // passes back, so one barrier per pass suffices (the single buffer needed a second one).
  __shared__ float s_red_pair[2][kWarps][NT * 4][32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  wait_for_offsets(p);
  const int live_count =
      compact_live_groups<kWarps>(p.row_offsets, p.groups, s_active, s_warp_live);
  if (p.offsets_ready) {
    // While the previous kernel finishes, pull this block's first weight rows (contiguous) into
    // L2, so its first loads after the wait do not start from DRAM. Only short items: measured
    // in one process against the version without it (bench/NOTES.md), the 48 KB items of qwen3's
    // FC2 gained 0.7 us at T=1, while 64 KB to 458 KB items (deepseek, gpt-oss, mixtral) lost
    // 1-5 us: all blocks' prefetches together then compete with the stream (mixtral: 121 MB).
    const int64_t first = blockIdx.x;
    const int64_t item_bytes = int64_t(16) * p.rw * p.k * 2;
    if (item_bytes <= kPrefetchMaxBytes && first < int64_t(live_count) * p.row_tiles) {
      const int g = s_active[first / p.row_tiles];
      const int64_t row0 = int64_t(first % p.row_tiles) * 16 * p.rw;
      const int64_t rows = min(int64_t(16) * p.rw, int64_t(p.n) - row0);
      const char* base = reinterpret_cast<const char*>(p.w + (int64_t(g) * p.n + row0) * p.k);
      const int64_t bytes = rows * p.k * 2;
      for (int64_t off = int64_t(tid) * 128; off < bytes; off += int64_t(kThreads) * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
    }
    pipeline::pdl_wait();  // the activations come from the kernel before
  }
  pipeline::pdl_launch_dependents();

  const int rw = warp / p.kw, kw = warp % p.kw;
  const int q = lane & 3, r = lane >> 2;
  const int64_t n = p.n, k = p.k;
  const int64_t items = int64_t(live_count) * p.row_tiles;
  int pass = 0;  // this block's passes so far: the buffer is pass & 1
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int g = s_active[item / p.row_tiles];
    const int tile_row0 = int(item % p.row_tiles) * 16 * p.rw;
    const int row = tile_row0 + rw * 16 + r;
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    const bool ok0 = row < n, ok1 = row + 8 < n;
    const uint16_t* w0 = p.w + (int64_t(g) * n + row) * k;
    const uint16_t* w1 = w0 + 8 * k;
    const uint16_t* a0 = p.a + int64_t(m0) * k;

    for (int c0 = 0; c0 < mg; c0 += 8 * NT, ++pass) {
      auto& s_red = s_red_pair[pass & 1];
      float acc[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

      constexpr int kS = kSub<NT>;
      for (int64_t kb = int64_t(kw) * 32 * kS; kb < k; kb += int64_t(p.kw) * 32 * kS) {
        uint4 wa[kS], wb[kS], x[NT][kS];
#pragma unroll
        for (int u = 0; u < kS; ++u) {
          const int64_t kk = kb + u * 32 + q * 8;
          const bool kin = kk < k;  // k % 8 == 0: a 16-byte chunk is wholly in or out
          const uint4 zero = make_uint4(0, 0, 0, 0);
          wa[u] = (ok0 && kin) ? load_stream(w0 + kk) : zero;
          wb[u] = (ok1 && kin) ? load_stream(w1 + kk) : zero;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const int t = c0 + j * 8 + r;
            x[j][u] = (t < mg && kin)
                          ? __ldg(reinterpret_cast<const uint4*>(a0 + int64_t(t) * k + kk))
                          : zero;
          }
        }
#pragma unroll
        for (int u = 0; u < kS; ++u)
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma16816<kBF16>(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, x[j][u].x, x[j][u].y);
            mma16816<kBF16>(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, x[j][u].z, x[j][u].w);
          }
      }

      // Sum the kw partial tiles; fixed order, so results are deterministic.
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) s_red[warp][j * 4 + i][lane] = acc[j][i];
      __syncthreads();
      if constexpr (kAct) {
        for (int idx = tid; idx < p.rw * NT * 2 * 32; idx += kThreads) {
          const int l = idx & 31, ji = (idx >> 5) % (NT * 2), wr = (idx >> 5) / (NT * 2);
          const int i = ji & 1, j = ji >> 1;
          float gate = 0.f, up = 0.f;
          for (int x2 = 0; x2 < p.kw; ++x2) {
            gate += s_red[wr * p.kw + x2][j * 4 + i][l];
            up += s_red[wr * p.kw + x2][j * 4 + i + 2][l];
          }
          store_gated<kBF16>(p, g, tile_row0 + wr * 16, c0 + j * 8, m0, mg, l, i, gate, up);
        }
      } else {
        for (int idx = tid; idx < p.rw * NT * 4 * 32; idx += kThreads) {
          const int l = idx & 31, ji = (idx >> 5) % (NT * 4), wr = (idx >> 5) / (NT * 4);
          float s = 0.f;
          for (int x2 = 0; x2 < p.kw; ++x2) s += s_red[wr * p.kw + x2][ji][l];
          store_entry<kBF16>(p, tile_row0 + wr * 16, c0 + (ji >> 2) * 8, m0, mg, l, ji & 3, s);
        }
      }
    }
  }
}

std::string gemv_name(int nt) { return "sm90.gemv.n" + std::to_string(8 * nt); }

template <bool kBF16, int NT, bool kAct>
class GemvTactic final : public GemvTacticBase {
 public:
  Status init(const TacticContext& ctx) override {
    Status s = setup(ctx, gemv_name(NT), kAct);
    if (!s.ok()) return s;
    // Split k over warps (a power of two up to 8) so that each gets at least two warp steps:
    // its second step's loads are then in flight during the first's latency. The rest of the
    // block's warps take further 16-row slices. (One step per warp, as qwen3's FC2 had with k =
    // 768 and 4 warps, measured 15.5 us against 14.1 with 2 warps on k; the 8-way split of the
    // longer k of the other presets stays: a device-side choice that also took 4-way splits for
    // mixtral's and deepseek's FC2 lost 2-3 us of the T=1 forward. H200, 2026-11-30.)
    constexpr int64_t kStepK = 32 * kSub<NT>;
    const int64_t steps = (ctx.shape.k + kStepK - 1) / kStepK;
    p_.kw = 1;
    while (p_.kw * 2 <= kWarps && p_.kw * 4 <= steps) p_.kw *= 2;
    p_.rw = kWarps / p_.kw;
    const int64_t rows_per_tile = 16 * p_.rw;
    p_.row_tiles = static_cast<int>((ctx.shape.n + rows_per_tile - 1) / rows_per_tile);
    return size_grid(reinterpret_cast<const void*>(grouped_gemv_kernel<kBF16, NT, kAct>), ctx,
                     sizeof(int) * static_cast<std::size_t>(ctx.shape.groups), kThreads);
  }

  Status run(const RunArgs& a) override {
    if (grid_ == 0) return {};  // max_rows == 0: nothing can ever be computed
    const GemvParams p = params(a);
    const cudaError_t err = pipeline::launch_pdl(grouped_gemv_kernel<kBF16, NT, kAct>, grid_for(a),
                                                 kThreads, smem_, a.stream, p);
    if (err != cudaSuccess) return cuda_status(err, "kernel launch", what_);
    return {};
  }
};

template <bool kBF16, int NT>
void add_gemv(std::vector<TacticEntry>& v) {
  add_store_and_act(
      v, gemv_name(NT), TacticKind::kGemv,
      []() -> std::unique_ptr<Tactic> { return std::make_unique<GemvTactic<kBF16, NT, false>>(); },
      []() -> std::unique_ptr<Tactic> { return std::make_unique<GemvTactic<kBF16, NT, true>>(); });
}

template <bool kBF16>
std::vector<TacticEntry> gemv_list() {
  std::vector<TacticEntry> v;
  add_gemv<kBF16, 1>(v);
#if !defined(MOEKIT_ONE_TACTIC)
  add_gemv<kBF16, 2>(v);
  add_gemv<kBF16, 4>(v);
#endif
  return v;
}

}  // namespace

std::vector<TacticEntry> sm90_gemv_tactics(Elem elem) {
  return elem == Elem::kBF16 ? gemv_list<true>() : gemv_list<false>();
}

}  // namespace moekit::gemm::detail
