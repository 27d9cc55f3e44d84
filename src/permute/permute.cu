// Routing + counting + stable permutation + gather (permute.hpp).
//
// Stability without sorting: tokens are cut into chunks, one warp per chunk walks its tokens in
// order and ranks each slot among the earlier slots of the same expert in its chunk (a token's
// experts are distinct, so lanes never collide). A slot's row is then
//   offsets[e] + (slots of e in earlier chunks) + rank.
// Small batches run all of it in one block (chunks = warps); larger ones in three kernels.
#include <algorithm>
#include <string>

#include "common/cuda_status.hpp"
#include "common/kernel_smem.hpp"
#include "permute/permute.hpp"
#include "pipeline/pdl.cuh"
#include "routing/routing_warp.cuh"

namespace moekit::permute {
namespace {

using routing::warp::kFull;

// Warps of the single-block kernel: up to 32 where the routing fits 64 registers (up to 8
// experts per lane), 16 at 16 per lane (~100 registers). A warp routes its tokens one after
// another, each a dependent chain of 1-2 us, so more warps pay from 17 tokens on (at 64: 2
// tokens per warp, not 4); up to 16 tokens the 16-warp block is no slower (bench/results,
// H200, 2026-11-30). The kernel reads its warp count from blockDim, and its shared memory is sized
// for the warps launched: sized for 32 at every token count, T=1 lost 0.4-0.9 us (DeepSeek-V3,
// gpt-oss; A/B against 16 warps), sized per launch it gained 0.5-1.1 us. Likely cause: the
// permute's SM also hosts the first GEMM's early-launched blocks.
constexpr int max_single_warps(int per_lane) { return per_lane <= 8 ? 32 : 16; }
constexpr int kMinSingleWarps = 16;
int single_warps(int per_lane, int64_t tokens) {
  return tokens <= kMinSingleWarps ? kMinSingleWarps : max_single_warps(per_lane);
}
constexpr int kMultiWarps = 8;  // warps per block of the multi-block kernels

struct Args {
  routing::DeviceRouting r;
  const float* logits;
  const int32_t* ext_ids;
  const float* ext_weights;
  const uint4* hidden;
  uint4* permuted;
  int64_t row_vecs;  // 16-byte vectors per hidden row
  int first_expert;
  int local_experts;
  Buffers b;
  int64_t tokens;
  int chunk_tokens;
  int n_chunks;
  int n_segments;      // of kChunksPerSegment chunks (multi-block path)
  int routing_floats;  // shared floats per warp for routing scratch
  bool pre_scored;     // single block, pre_scoring(), <= kPreScoreMaxTokens: score_tokens() runs
  bool gather;         // Inputs::gather (the multi-block path; the single block's is a template)
};

// DeepSeek-V3 with 8+ experts per lane, up to this many tokens: the single-block kernel scores
// every (token, expert) and (token, group) with the whole block before the per-token selection
// (score_tokens). Measured on the H200 (H200, 2026-11-30): at 1 token it takes ~1 us
// off the permute; at 8, where 8 warps route one token each anyway, it added ~2.7 us.
constexpr int64_t kPreScoreMaxTokens = 4;
static_assert(kPreScoreMaxTokens <= kMinSingleWarps, "pre-scored blocks run 16 warps");

// Routes (or validates the caller's ids of) token t, whose logits are `logits` (routing
// methods). Lane s < k writes slot s to topk_ids / topk_weights and returns its local expert, or
// -1 when the slot does not run here. `pre`: score_tokens()'s output, or null.
template <int kPerLane>
__device__ int32_t route_slots(const Args& a, int64_t t,
                               const routing::warp::Logits<kPerLane>& logits, float* scores,
                               int lane, const float* pre) {
  const int k = a.r.top_k;
  int32_t id = -1;
  float w = 0.0f;
  if (a.r.method == static_cast<int>(RoutingMethod::kExternal)) {
    int32_t v = 0;
    float wv = 0.0f;
    if (lane < k) {
      v = a.ext_ids[t * k + lane];
      wv = a.ext_weights[t * k + lane];
    }
    bool bad = lane < k && (v < 0 || v >= a.r.experts);
    for (int i = 0; i + 1 < k; ++i) {
      const int32_t other = __shfl_sync(kFull, v, i);
      if (i < lane && other == v) bad = true;  // a repeat of an earlier slot
    }
    if (lane < k) {
      if (bad) {
        const unsigned long long where = static_cast<unsigned long long>(t * k + lane);
        atomicMin(a.b.error_word, (where << 32) | static_cast<uint32_t>(v));
      } else {
        id = v;
        w = wv;
      }
    }
  } else {
    const int E = a.r.experts;
    routing::warp::PreScores ps;
    if (pre != nullptr) {  // score_tokens()'s layout
      ps.sel = pre + t * E;
      ps.sigmoid = pre + (a.tokens + t) * E;
      if (a.r.n_group > 1) ps.groups = pre + 2 * a.tokens * E + t * a.r.n_group;
    }
    const routing::warp::Slot s =
        routing::warp::route_token<kPerLane>(a.r, logits, scores, lane, ps);
    id = s.id;
    w = s.weight;
  }
  if (lane < k) {
    a.b.topk_ids[t * k + lane] = id;
    a.b.topk_weights[t * k + lane] = w;
  }
  const int32_t le = id - a.first_expert;
  return (lane < k && id >= 0 && le >= 0 && le < a.local_experts) ? le : -1;
}

// Lane s's slot of the first kKept tokens of a warp's chunk, kept in registers so the
// single-block kernel does not read back what it just stored (a round trip to L2 each).
template <int kKept>
struct KeptSlots {
  int32_t le[kKept], rank[kKept];
};

// One warp routes tokens [t0, t1) in order, ranking each slot in `hist` (L counters, zeroed
// here) and storing slot_expert / slot_rank (and the first kKept tokens' in `kept`).
template <int kPerLane, int kKept>
__device__ void route_and_rank(const Args& a, int64_t t0, int64_t t1, int* hist, float* scores,
                               int lane, KeptSlots<kKept>& kept, const float* pre = nullptr) {
  for (int i = lane; i < a.local_experts; i += 32) hist[i] = 0;
  __syncwarp();
  const int k = a.r.top_k;
  // Each token's logits load while the token before it is routed: a warp's tokens are one
  // dependent chain, and a load at the top of each would add a memory round trip per token.
  // With score_tokens()'s scores (`pre`) route_token reads no logits, so none are loaded: at one
  // token on deepseek that load was ~970 cycles of the chain (H200 timings, 2026-12-01).
  const bool routed = a.r.method != static_cast<int>(RoutingMethod::kExternal);
  const bool load = routed && pre == nullptr;
  routing::warp::Logits<kPerLane> next;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) next.v[j] = -INFINITY;
  if (load && t0 < t1) next.load(a.r, a.logits + t0 * a.r.experts, lane);
  for (int64_t t = t0; t < t1; ++t) {
    const routing::warp::Logits<kPerLane> logits = next;
    if (load && t + 1 < t1) next.load(a.r, a.logits + (t + 1) * a.r.experts, lane);
    const int32_t le = route_slots<kPerLane>(a, t, logits, scores, lane, pre);
    int32_t rank = 0;
    if (le >= 0) {
      rank = hist[le];
      hist[le] = rank + 1;
    }
    if (lane < k) {
      a.b.slot_expert[t * k + lane] = le;
      a.b.slot_rank[t * k + lane] = rank;
    }
#pragma unroll
    for (int i = 0; i < kKept; ++i)
      if (t - t0 == i) {
        kept.le[i] = le;
        kept.rank[i] = rank;
      }
    __syncwarp();
  }
}

// Sum of x over lanes 0..lane.
__device__ __forceinline__ int warp_inclusive_scan(int x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Exclusive scan of v[0, n) in place by one warp; v[n] receives the total.
__device__ void warp_exclusive_scan(int* v, int n, int lane) {
  int carry = 0;
  for (int base = 0; base < n; base += 32) {
    const int x = base + lane < n ? v[base + lane] : 0;
    const int inc = warp_inclusive_scan(x, lane);
    if (base + lane < n) v[base + lane] = carry + inc - x;
    carry += __shfl_sync(kFull, inc, 31);
  }
  if (lane == 0) v[n] = carry;
}

// Exclusive scan of x over the single-block kernel's threads (every thread calls it; it
// synchronizes the block). s_warp holds `warps` ints.
__device__ int block_exclusive_scan(int x, int* s_warp, int lane, int warp, int warps) {
  const int inc = warp_inclusive_scan(x, lane);
  if (lane == 31) s_warp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const int total = lane < warps ? s_warp[lane] : 0;
    const int through = warp_inclusive_scan(total, lane);
    if (lane < warps) s_warp[lane] = through - total;
  }
  __syncthreads();
  return s_warp[warp] + inc - x;
}

// Copies hidden row t to the permuted rows held by lanes 0..k-1 (`row`, -1 = none); the row
// is read once, written k times. Each lane has kScatterLoads 16-byte loads in flight before its
// stores: at 16384 tokens the scatter took 2-9 us less than with one (gpt-oss the most; H200,
// 2026-12-01, bench/results), streaming stores (st.global.cs) or 8 loads no more.
constexpr int kScatterLoads = 4;
__device__ void scatter_row(const Args& a, int64_t t, int32_t row, int lane) {
  const uint4* src = a.hidden + t * a.row_vecs;
  const int k = a.r.top_k;
  for (int64_t base = 0; base < a.row_vecs; base += 32 * kScatterLoads) {  // uniform trip count
    uint4 v[kScatterLoads];
#pragma unroll
    for (int j = 0; j < kScatterLoads; ++j) {
      const int64_t i = base + j * 32 + lane;
      v[j] = i < a.row_vecs ? __ldg(src + i) : uint4{};
    }
    for (int s = 0; s < k; ++s) {
      const int32_t r = __shfl_sync(kFull, row, s);
      if (r < 0) continue;  // the same r in every lane
      uint4* dst = a.permuted + static_cast<int64_t>(r) * a.row_vecs;
#pragma unroll
      for (int j = 0; j < kScatterLoads; ++j) {
        const int64_t i = base + j * 32 + lane;
        if (i < a.row_vecs) dst[i] = v[j];
      }
    }
  }
}

// DeepSeek-V3 at a few tokens, by the whole block, into `pre`: [tokens][E] selection scores,
// [tokens][E] sigmoids, then [tokens][n_group] group scores, one warp per (token, group). One
// warp per token would otherwise run all of its 256 sigmoids and 8 group scans as one dependent
// chain while the block's other warps wait (~5 us of the T=1 permute with sigmoids in double,
// H200, 2026-11-30). Ends with the block synchronized. int indices: tokens <= kPreScoreMaxTokens.
__device__ void score_tokens(const Args& a, float* pre) {
  const int E = a.r.experts, G = a.r.n_group, T = static_cast<int>(a.tokens);
  for (int t = 0; t < T; ++t)
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float s = routing::sigmoid_fp32(routing::warp::clean(__ldg(a.logits + t * E + e)));
      pre[t * E + e] = routing::warp::selection_score(a.r, s, e);
      pre[(T + t) * E + e] = s;
    }
  __syncthreads();
  if (G <= 1) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group_size = E / G;
  for (int task = warp; task < T * G; task += blockDim.x >> 5) {
    const int t = task / G, g = task - t * G;
    const float v = routing::warp::group_top_two(pre + t * E + g * group_size, group_size, lane);
    if (lane == 0) pre[2 * T * E + task] = v;
  }
  __syncthreads();
}

// Everything in one block: warps are the chunks. The block runs alone on the critical path of
// a decode step, so it keeps what it needs on chip: each warp's slots in registers (the chunks
// of up to kSingleBlockMaxTokens tokens), the rows of up to kSingleRows slots in shared memory,
// and the hidden rows to gather are pulled into L2 while the routing runs.
constexpr int kSingleRows = 1024;

// kPreScore: score_tokens() runs first when a.pre_scored (instantiated where pre_scoring() can
// hold, so the other kernels carry none of it).
// Pre-scoring runs at up to kPreScoreMaxTokens (< 17) tokens, always in 16 warps: its kernels are
// built for 16.
template <int kPerLane, bool kGather, bool kPreScore,
          int kMaxWarps = kPreScore ? kMinSingleWarps : max_single_warps(kPerLane)>
__global__ void __launch_bounds__(kMaxWarps * 32) single_block_kernel(Args a) {
  constexpr int kKept = static_cast<int>(kSingleBlockMaxTokens / kMaxWarps);
  const int warps = blockDim.x >> 5;
  // Launched normally (it follows the caller's work); the next kernel reads nothing of ours
  // before its own wait (pipeline/pdl.cuh), except the offsets flag: cleared first, it may
  // start then. One thread clears it and alone lets the next kernel start (a block's first
  // launch_dependents is the one that counts), so that the other warps route during its fence:
  // lane 0 of the last warp, which has no token to route below 16 tokens.
  if (a.b.offsets_flag == nullptr) {
    pipeline::pdl_launch_dependents();
  } else if (threadIdx.x == blockDim.x - 32) {
    *a.b.offsets_flag = 0;
    __threadfence();
    pipeline::pdl_launch_dependents();
  }
  extern __shared__ int smem[];
  const int L = a.local_experts;
  const int k = a.r.top_k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int* hist = smem;              // [warps][L]
  int* offs = hist + warps * L;  // [L + 1]
  int* rows = offs + L + 1;      // [kSingleRows]: slot rows, when the slots fit
  float* scratch = reinterpret_cast<float*>(rows + kSingleRows);
  float* scores = scratch + warp * a.routing_floats;
  // score_tokens()'s floats, after every warp's scratch (single_smem)
  float* pre = kPreScore && a.pre_scored ? scratch + warps * a.routing_floats : nullptr;
  int* my_hist = hist + warp * L;
  __shared__ int s_scan[kMaxWarps];
  const int64_t pairs = a.tokens * k;
  if (kGather) {
    const char* hidden = reinterpret_cast<const char*>(a.hidden);
    const int64_t bytes = a.tokens * a.row_vecs * 16;
    for (int64_t off = int64_t(threadIdx.x) * 128; off < bytes; off += int64_t(blockDim.x) * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(hidden + off));
  }
  const int64_t t0 = static_cast<int64_t>(warp) * a.chunk_tokens;
  const int64_t t1 = min(a.tokens, t0 + a.chunk_tokens);
  if (pre != nullptr) score_tokens(a, pre);
  KeptSlots<kKept> kept;
  route_and_rank<kPerLane>(a, t0, t1, my_hist, scores, lane, kept, pre);
  __syncthreads();
  {  // One expert per thread (L <= kMaxLocalExperts = the block's threads): each warp's start
     // within the expert, then the experts' offsets by one block-wide scan (a single warp
     // scanning 256 experts in turn was ~8 dependent shuffle rounds on the critical path).
    // Warps past a.n_chunks had no tokens.
    static_assert(kMaxLocalExperts <= kMinSingleWarps * 32, "one expert per thread");
    const int e = threadIdx.x;
    int count = 0;
    if (e < L)
      for (int w = 0; w < a.n_chunks; ++w) {
        const int c = hist[w * L + e];
        hist[w * L + e] = count;
        count += c;
      }
    const int offset = block_exclusive_scan(count, s_scan, lane, warp, warps);
    if (e < L) {
      offs[e] = offset;
      a.b.offsets[e] = offset;
      if (a.b.expert_done != nullptr) a.b.expert_done[e] = 0;
    }
    if (e == L - 1) {
      offs[L] = offset + count;
      a.b.offsets[L] = offset + count;
      if (a.b.expert_done != nullptr) a.b.expert_done[L] = a.b.expert_done[L + 1] = 0;
    }
  }
  // The offsets and cleared counters of every thread before the flag: the barrier orders them
  // before thread 0's release, which is cumulative (the pattern of cooperative groups' grid
  // sync), so one fence, not one per thread and then the release's.
  __syncthreads();
  if (a.b.offsets_flag != nullptr && threadIdx.x == 0)
    pipeline::store_release(a.b.offsets_flag, 1u);
  const bool rows_on_chip = pairs <= kSingleRows;
  for (int64_t t = t0; t < t1; ++t) {
    if (lane < k) {
      int32_t le = 0, rank = 0;
      if (t - t0 < kKept) {
#pragma unroll
        for (int i = 0; i < kKept; ++i)
          if (t - t0 == i) {
            le = kept.le[i];
            rank = kept.rank[i];
          }
      } else {  // a chunk longer than kept (a forced single-block run of many tokens)
        le = a.b.slot_expert[t * k + lane];  // written by this thread above
        rank = a.b.slot_rank[t * k + lane];
      }
      const int32_t row = le >= 0 ? offs[le] + my_hist[le] + rank : -1;
      a.b.slot_row[t * k + lane] = row;
      if (rows_on_chip) rows[t * k + lane] = row;
      if (row >= 0) a.b.row_expert[row] = le;
    }
  }
  if (kGather) {
    __syncthreads();  // slot_row of every warp is visible to the block from here
    for (int64_t p = warp; p < pairs; p += warps) {
      const int32_t row = rows_on_chip ? rows[p] : a.b.slot_row[p];
      if (row < 0) continue;
      const uint4* src = a.hidden + (p / k) * a.row_vecs;
      uint4* dst = a.permuted + static_cast<int64_t>(row) * a.row_vecs;
      for (int64_t i = lane; i < a.row_vecs; i += 32) dst[i] = __ldg(src + i);
    }
  }
}

// Grid-wide gather after the single-block kernel: one thread per 16 bytes of hidden.
__global__ void gather_kernel(Args a) {
  pipeline::pdl_wait();  // slot_row comes from the single-block kernel
  pipeline::pdl_launch_dependents();
  const int k = a.r.top_k;
  const int64_t n = a.tokens * a.row_vecs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.row_vecs, i = idx - t * a.row_vecs;
    const uint4 v = __ldg(a.hidden + idx);
    for (int s = 0; s < k; ++s) {
      const int32_t row = a.b.slot_row[t * k + s];
      if (row >= 0) a.permuted[static_cast<int64_t>(row) * a.row_vecs + i] = v;
    }
  }
}

// Multi-block step 1: one warp per chunk routes and ranks, then stores its counts.
template <int kPerLane>
__global__ void __launch_bounds__(kMultiWarps * 32) route_rank_kernel(Args a) {
  extern __shared__ int smem[];
  const int L = a.local_experts;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int chunk = blockIdx.x * kMultiWarps + warp;
  if (chunk >= a.n_chunks) return;  // whole warps leave; no block barrier follows
  int* hist = smem + warp * (L + a.routing_floats);
  float* scores = reinterpret_cast<float*>(hist + L);
  const int64_t t0 = static_cast<int64_t>(chunk) * a.chunk_tokens;
  const int64_t t1 = min(a.tokens, t0 + a.chunk_tokens);
  KeptSlots<1> unused;
  route_and_rank<kPerLane>(a, t0, t1, hist, scores, lane, unused);
  int32_t* out = a.b.chunk_counts + static_cast<int64_t>(chunk) * L;
  for (int e = lane; e < L; e += 32) out[e] = hist[e];
}

// Multi-block step 2: per expert, chunk counts become exclusive chunk bases within their segment
// of kChunksPerSegment chunks; each segment's totals per expert go to segment_totals. Block
// (x, y): 32 experts (lanes) x 32 warps over segment y, each warp kChunksPerWarp chunks loaded at
// once (one memory round trip; a warp walking 64 chunks in turn took 11 us at 16384 tokens).
constexpr int kChunksPerWarp = kChunksPerSegment / 32;
__global__ void __launch_bounds__(1024) chunk_scan_kernel(Args a) {
  __shared__ int seg[32][33];
  const int L = a.local_experts;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.x * 32 + lane;
  const int c0 = blockIdx.y * kChunksPerSegment + warp * kChunksPerWarp;
  int32_t* counts = a.b.chunk_counts + static_cast<int64_t>(c0) * L + e;
  int v[kChunksPerWarp];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kChunksPerWarp; ++i) {
    v[i] = e < L && c0 + i < a.n_chunks ? counts[static_cast<int64_t>(i) * L] : 0;
    sum += v[i];
  }
  seg[warp][lane] = sum;
  __syncthreads();
  int base = 0;
  for (int w = 0; w < warp; ++w) base += seg[w][lane];
  if (e >= L) return;
  if (warp == 31) a.b.segment_totals[blockIdx.y * L + e] = base + sum;
#pragma unroll
  for (int i = 0; i < kChunksPerWarp; ++i)
    if (c0 + i < a.n_chunks) {
      counts[static_cast<int64_t>(i) * L] = base;
      base += v[i];
    }
}

// Multi-block step 3: offsets, each slot's row (and each row's token), and the gather (one warp
// per token). Shared memory: [n_segments][L] segment bases per expert, then the offsets [L + 1].
__global__ void __launch_bounds__(kMultiWarps * 32) scatter_kernel(Args a) {
  extern __shared__ int seg_base[];
  const int L = a.local_experts;
  const int k = a.r.top_k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int* offs = seg_base + a.n_segments * L;
  for (int e = threadIdx.x; e < L; e += blockDim.x) {
    int total = 0;
    for (int s = 0; s < a.n_segments; ++s) {
      const int v = a.b.segment_totals[s * L + e];
      seg_base[s * L + e] = total;
      total += v;
    }
    offs[e] = total;
  }
  __syncthreads();
  if (warp == 0) {
    warp_exclusive_scan(offs, L, lane);
    __syncwarp();
    if (blockIdx.x == 0)
      for (int e = lane; e <= L; e += 32) a.b.offsets[e] = offs[e];
  }
  __syncthreads();
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kMultiWarps;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kMultiWarps + warp; t < a.tokens;
       t += warps) {
    int32_t row = -1;
    if (lane < k) {
      const int32_t le = a.b.slot_expert[t * k + lane];
      if (le >= 0) {
        const int64_t chunk = t / a.chunk_tokens;
        row = offs[le] + seg_base[(chunk / kChunksPerSegment) * L + le] +
              a.b.chunk_counts[chunk * L + le] + a.b.slot_rank[t * k + lane];
        a.b.row_expert[row] = le;
        if (a.b.row_token != nullptr) a.b.row_token[row] = static_cast<int32_t>(t);
      }
      a.b.slot_row[t * k + lane] = row;
    }
    if (a.gather) scatter_row(a, t, row, lane);
  }
}

using KernelFn = void (*)(Args);

template <int kPerLane, bool kPreScore = false>
KernelFn pick_single(bool gather) {
  return gather ? single_block_kernel<kPerLane, true, kPreScore>
                : single_block_kernel<kPerLane, false, kPreScore>;
}
// pre_score: only with 8+ experts per lane (pre_scoring()).
KernelFn pick_single(int per_lane, bool gather, bool pre_score) {
  switch (per_lane) {
    case 1:
      return pick_single<1>(gather);
    case 2:
      return pick_single<2>(gather);
    case 4:
      return pick_single<4>(gather);
    case 8:
      return pre_score ? pick_single<8, true>(gather) : pick_single<8>(gather);
    default:
      return pre_score ? pick_single<16, true>(gather) : pick_single<16>(gather);
  }
}

KernelFn pick_route_rank(int per_lane) {
  switch (per_lane) {
    case 1:
      return route_rank_kernel<1>;
    case 2:
      return route_rank_kernel<2>;
    case 4:
      return route_rank_kernel<4>;
    case 8:
      return route_rank_kernel<8>;
    default:
      return route_rank_kernel<16>;
  }
}

int routing_floats(const Config& c) {
  return static_cast<int>(routing::routing_smem_per_warp(c.routing) / sizeof(float));
}
// DeepSeek-V3 routing with 8+ experts per lane (256 experts: 8): a per-token chain long enough
// that scoring with the whole block first pays at a few tokens (kPreScoreMaxTokens).
bool pre_scoring(const Config& c) {
  return c.routing.method == static_cast<int>(RoutingMethod::kDeepSeekV3) &&
         c.routing.per_lane >= 8;
}
std::size_t single_smem(const Config& c, int warps) {
  const int64_t pre_tokens = pre_scoring(c) ? std::min(c.max_tokens, kPreScoreMaxTokens) : 0;
  const int64_t pre_floats = pre_tokens * (2 * c.routing.experts + c.routing.n_group);
  const int64_t per_warp = c.local_experts + routing_floats(c);
  return sizeof(int) * static_cast<std::size_t>(warps * per_warp + c.local_experts + 1 +
                                                kSingleRows + pre_floats);
}
// scatter_kernel's segment bases and offsets.
std::size_t scatter_smem(const Config& c, int segments) {
  return sizeof(int) * static_cast<std::size_t>((segments + 1) * c.local_experts + 1);
}
std::size_t multi_smem(const Config& c) {
  return sizeof(int) * static_cast<std::size_t>(kMultiWarps) *
         static_cast<std::size_t>(c.local_experts + routing_floats(c));
}

Status load(KernelFn f, std::size_t smem) {
  return raise_dynamic_smem_limit(reinterpret_cast<const void*>(f), smem, "a permute kernel");
}

int grid_for(int64_t work_items, int per_block, int max_blocks) {
  const int64_t b = (work_items + per_block - 1) / per_block;
  return static_cast<int>(std::clamp<int64_t>(b, 1, max_blocks));
}

}  // namespace

int64_t Config::max_rows() const {
  return max_tokens * std::min<int64_t>(routing.top_k, local_experts);
}

BufferCounts buffer_counts(const Config& c) {
  BufferCounts n;
  n.per_slot = c.max_tokens * c.routing.top_k;
  n.chunk_counts = static_cast<int64_t>(kMaxChunks) * c.local_experts;
  n.segment_totals = static_cast<int64_t>(kMaxSegments) * c.local_experts;
  n.offsets = c.local_experts + 1;
  n.rows = c.max_rows();
  n.permuted_bytes = c.max_rows() * c.row_bytes;
  return n;
}

Status prepare(const Config& c) {
  if (c.local_experts < 1 || c.local_experts > kMaxLocalExperts)
    return Status(ErrorCode::kUnsupported, "local experts " + std::to_string(c.local_experts) +
                                               " is outside [1, " +
                                               std::to_string(kMaxLocalExperts) + "]");
  if (c.row_bytes <= 0 || c.row_bytes % 16 != 0)
    return Status(ErrorCode::kUnsupported, "hidden row of " + std::to_string(c.row_bytes) +
                                               " bytes is not a multiple of 16");
  if (c.max_tokens * c.routing.top_k >= (int64_t{1} << 31))
    return Status(ErrorCode::kUnsupported, "max_tokens " + std::to_string(c.max_tokens) +
                                               " times top_k exceeds int32 row indices");
  for (bool gather : {false, true})
    for (bool pre_score : {false, pre_scoring(c)}) {
      Status s = load(pick_single(c.routing.per_lane, gather, pre_score),
                      single_smem(c, max_single_warps(c.routing.per_lane)));
      if (!s.ok()) return s;
    }
  for (auto [f, smem] :
       {std::pair<KernelFn, std::size_t>{pick_route_rank(c.routing.per_lane), multi_smem(c)},
        {gather_kernel, 0},
        {chunk_scan_kernel, 0},
        {scatter_kernel, scatter_smem(c, kMaxSegments)}}) {
    Status s = load(f, smem);
    if (!s.ok()) return s;
  }
  return {};
}

namespace {
bool single_block(int64_t tokens, Path path) {
  return path == Path::kSingleBlock || (path == Path::kAuto && tokens <= kSingleBlockMaxTokens);
}
// The single-block kernel gathers too (else a grid-wide gather kernel follows it).
bool fused_gather(const Config& c, int64_t tokens) {
  return tokens * std::min<int64_t>(c.routing.top_k, c.local_experts) * c.row_bytes <=
         kFusedGatherMaxBytes;
}
}  // namespace

bool single_block_path(int64_t tokens, Path path) { return single_block(tokens, path); }

bool clears_expert_done(int64_t tokens, Path path) {
  return tokens > 0 && single_block(tokens, path);
}

OffsetsFinal offsets_final_for_next_kernel(const Config& c, int64_t tokens, Path path,
                                           bool gather) {
  if (tokens <= 0) return OffsetsFinal::kAfterItsWait;
  return single_block(tokens, path) && (!gather || fused_gather(c, tokens))
             ? OffsetsFinal::kAtFlag
             : OffsetsFinal::kAtItsStart;
}

Status run(const Config& c, const Buffers& b, int64_t tokens, const Inputs& in, cudaStream_t stream,
           Path path) {
  if (tokens < 0 || tokens > c.max_tokens)
    return Status(ErrorCode::kInvalidArgument, "tokens " + std::to_string(tokens) +
                                                   " is outside [0, max_tokens " +
                                                   std::to_string(c.max_tokens) + "]");
  if (tokens == 0) return {};
  if (!in.gather && !single_block(tokens, path) && b.row_token == nullptr)
    return Status(ErrorCode::kInvalidArgument,
                  "a run of " + std::to_string(tokens) +
                      " tokens without the gather takes the multi-block path, which then needs "
                      "Buffers::row_token for the next GEMM to read the rows by");
  Args a{};
  a.r = c.routing;
  a.logits = in.logits;
  a.ext_ids = in.ids;
  a.ext_weights = in.weights;
  a.hidden = static_cast<const uint4*>(in.hidden);
  a.permuted = static_cast<uint4*>(b.permuted);
  a.row_vecs = c.row_bytes / 16;
  a.first_expert = c.first_expert;
  a.local_experts = c.local_experts;
  a.b = b;
  a.tokens = tokens;
  a.routing_floats = routing_floats(c);
  a.gather = in.gather;
  if (single_block(tokens, path)) {
    const int warps = single_warps(c.routing.per_lane, tokens);
    a.chunk_tokens = static_cast<int>((tokens + warps - 1) / warps);
    a.n_chunks = static_cast<int>((tokens + a.chunk_tokens - 1) / a.chunk_tokens);
    a.pre_scored = pre_scoring(c) && tokens <= kPreScoreMaxTokens;
    const bool fused = fused_gather(c, tokens);
    pick_single(c.routing.per_lane, in.gather && fused,
                a.pre_scored)<<<1, warps * 32, single_smem(c, warps), stream>>>(a);
    if (in.gather && !fused) {
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return cuda_status(e, "launching the permute kernels");
      const int blocks = grid_for(tokens * a.row_vecs, 256, 4096);
      return cuda_status(pipeline::launch_pdl(gather_kernel, blocks, 256, 0, stream, a),
                         "launching the gather kernel");
    }
  } else {
    const int64_t per_chunk =
        std::max<int64_t>(kMinChunkTokens, (tokens + kMaxChunks - 1) / kMaxChunks);
    a.chunk_tokens = static_cast<int>(per_chunk);
    a.n_chunks = static_cast<int>((tokens + per_chunk - 1) / per_chunk);
    a.n_segments = (a.n_chunks + kChunksPerSegment - 1) / kChunksPerSegment;
    pick_route_rank(c.routing.per_lane)<<<grid_for(a.n_chunks, kMultiWarps, 1 << 20),
                                          kMultiWarps * 32, multi_smem(c), stream>>>(a);
    chunk_scan_kernel<<<dim3((c.local_experts + 31) / 32, a.n_segments), 1024, 0, stream>>>(a);
    scatter_kernel<<<grid_for(tokens, kMultiWarps, 1056), kMultiWarps * 32,
                     scatter_smem(c, a.n_segments), stream>>>(a);
  }
  return cuda_status(cudaGetLastError(), "launching the permute kernels");
}

Status decode_error(unsigned long long word, int experts, int top_k) {
  if (word == kNoError) return {};
  const int64_t where = static_cast<int64_t>(word >> 32);
  const int32_t id = static_cast<int32_t>(static_cast<uint32_t>(word & 0xffffffffu));
  const int64_t token = where / top_k, slot = where % top_k;
  std::string m = "topk_ids[" + std::to_string(token) + ", " + std::to_string(slot) +
                  "] = " + std::to_string(id);
  if (id < 0 || id >= experts)
    m += " is outside [0, " + std::to_string(experts) + ")";
  else
    m += " repeats an expert of an earlier slot of that token";
  m += "; the slot was dropped";
  return Status(ErrorCode::kInvalidArgument, m);
}

}  // namespace moekit::permute
