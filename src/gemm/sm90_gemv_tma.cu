// Over 800 lines: the TMA ring and its three kernels (standalone, chained, sliced) change together.
// Grouped GEMV for decode with the weights streamed by TMA (`sm90.gemv.tma64`; `.s12`, two
// blocks per SM, where its grid fills better; other variants with more stages or 128-row boxes
// are listed for measurement in full builds, see gemv_tma_list):
// one producer thread copies 64-row x 64-k boxes of weights (8 KB, 128-byte swizzle), each
// with the 8 token rows x 64 k of activations it multiplies (1 KB), into a ring of kStages
// shared-memory stages, without a break from one item to the next; four consumer warps each
// multiply 16 of a box's 64 rows by the 8 token rows (mma.sync m16n8k16, both operands by
// ldmatrix) and keep the whole k sum in registers. So there is no split-k reduction and no
// block barrier per item, the two costs sm90_gemv.cu pays per 16-row item, and no global load
// on the consumers' path: loading the activations one box ahead from global memory held each
// block to ~10 GB/s (H200, H200, 2026-11-30), slower than gemv.n8 at T=1.
//
// Items are (non-empty expert, 64-row tile), persistent as in sm90_gemv.cu: a fixed share per
// block, or, where blocks take more than one and the caller gives a counter
// (GemmCall::item_counter), one at a time from it, so that blocks that start late (beside the
// permute's block) or stream slowly take fewer. An expert with more than 8 rows runs in chunks
// of 8 that stream its tile again. Weights are constant, so with
// settled offsets (FC2) the producer copies the first kStages weight boxes before the PDL wait,
// while the kernel before finishes, and their activations after it.
//
// The box rows past an expert's n belong to the next expert (or lie past the tensor and read as
// zeros), and so do the token rows past its mg: their products are computed and not stored.
// k past the end reads as zeros.
#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include <memory>
#include <string>
#include <vector>

#include "gemm/gemv_common.cuh"
#include "gemm/live_groups.cuh"
#include "gemm/tensor_map.hpp"
#include "gemm/tma_ring.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::gemm::detail {
namespace {

constexpr int kBoxK = 64;  // 64 x 2 bytes: one 128-byte row
static_assert(kBoxK == KSlices::kBoxK && kBoxK * 2 == tma_ring::kRowBytes);
using tma_ring::kActBytes;  // 1 KB of activations, one swizzle period
using tma_ring::kTokens;    // token rows per chunk: the MMA's n
// A variant's shape: weight boxes of kRows rows (one consumer warp per 16), kStages ring stages.
using tma_ring::ldmatrix_x4;
using tma_ring::load_token_fragments;
using tma_ring::load_weight_fragment;
using tma_ring::Ring;
using tma_ring::smem_addr;

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

// The (item, chunk, k box) sequence of one GEMM, walked the same way by the producer and the
// consumers.
struct Walk {
  int live, row_tiles, k_boxes;
  __device__ int64_t items() const { return int64_t(live) * row_tiles; }
};
__device__ __forceinline__ Walk walk_of(const GemvParams& p, int live) {
  return Walk{live, p.row_tiles, (p.k + kBoxK - 1) / kBoxK};
}

// Item ids handed from the producer thread to the consumer warps through kSlots slots: a
// block's first item is its own (blockIdx.x), taken without waiting for an L2 atomic; the rest
// come one at a time from a counter, from gridDim.x on (H200, 2026-12-03, in the standalone counted
// GEMV and the one-token sliced kernel too: T=1 -0.1 to -0.3 us, deepseek T=8 -0.8, the rest
// within 0.4 either way; 32 fewer instructions in the sliced kernel). A block takes its next
// item only once a slot is free. -1: no more items.
template <int kSlots>
struct ItemRing {
  uint64_t* full;   // [kSlots]: the id is written
  uint64_t* empty;  // [kSlots]: every consumer warp has read it
  int* ids;         // [kSlots]
  int slot = 0;
  uint32_t phase = 0;
  bool took_first = false;

  __device__ static void init(uint64_t* full, uint64_t* empty, int consumers) {  // one thread
    for (int s = 0; s < kSlots; ++s) {
      EmptyBarrier::init(&full[s], 1);
      EmptyBarrier::init(&empty[s], consumers);
    }
  }
  __device__ void advance() {
    if (++slot == kSlots) {
      slot = 0;
      phase ^= 1;
    }
  }
  // The producer thread: the next id, published; -1 once it passes `items`. `counter` is zero
  // before the kernel.
  __device__ int take_and_publish(int* counter, int items) {
    EmptyBarrier::wait(&empty[slot], phase ^ 1);
    int id = took_first ? atomicAdd(counter, 1) + int(gridDim.x) : int(blockIdx.x);
    took_first = true;
    if (id >= items) id = -1;
    ids[slot] = id;
    EmptyBarrier::arrive(&full[slot]);
    advance();
    return id;
  }
  // A consumer warp: lane 0 reads the slot and frees it, so that the read comes before the
  // arrive in one thread (the producer writes the slot again after it); the warp gets the id
  // by shuffle. Every lane reading it before lane 0's arrive, ordered by __syncwarp only,
  // showed as a read/write race under racecheck once blocks took over kSlots items (H200,
  // 2026-12-01).
  __device__ int read(int lane) {
    int id = 0;
    if (lane == 0) {
      EmptyBarrier::wait(&full[slot], phase);
      id = ids[slot];
      EmptyBarrier::arrive(&empty[slot]);
    }
    advance();
    return __shfl_sync(0xffffffffu, id, 0);
  }
};

// Global memory written by generic stores in other blocks, read next by TMA (the async proxy).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// The producer thread's side of the ring: a box's weights are issued at once; its activations
// may have to wait (for the previous kernel: the PDL wait; in the chained kernel, for FC1's items
// of the expert: `done[gate] >= need`). Those are noted, oldest first, and issued when they can
// be, at the latest before the ring would wait for a stage whose activations are still noted.
template <class R, int kStages>
struct RingProducer {
  struct Noted {
    const CUtensorMap* map;
    // gate -1: the PDL wait; kAlwaysOpen: none (the caller's row); else done[gate] >= need
    int stage, kb, row, gate, need;
  };
  static constexpr int kAlwaysOpen = -2;
  static constexpr int kCachedGates = 512;  // experts whose open gate is remembered
  // Only scalars and pointers here, so that the state stays in registers: an array member
  // (indexed at run time) puts the whole object in local memory, and the hot loop with it.
  const R sm;
  const int* done;
  Noted* noted;  // [kStages], a ring: head, count
  // [kCachedGates / 32] bits, zero at the start (shared memory), or null where no gate is used.
  // A gate, once open, stays open (an expert's FC1 items are all done): one load per expert.
  uint32_t* opened;
  bool waited;  // the PDL wait is behind us
  // The done counters may be read before the PDL wait: the permute clears them before the
  // offsets flag the kernel acquired (chained on the caller's rows: one row, only at the flag;
  // token rows, at the flag or, without it, after the PDL wait, where this is moot).
  bool counters_at_flag = false;
  int stage = 0, head = 0, count = 0;
  uint32_t phase = 0;

  __device__ RingProducer(const R& ring, Noted* noted_ring, const int* done_counts,
                          uint32_t* opened_bits, bool pdl_waited)
      : sm(ring), done(done_counts), noted(noted_ring), opened(opened_bits), waited(pdl_waited) {}

  __device__ void pdl() {
    if (waited) return;
    pipeline::pdl_wait();
    pipeline::pdl_launch_dependents();
    waited = true;
  }
  __device__ bool remembered(int gate) const {
    return gate < kCachedGates && (opened[gate / 32] >> (gate % 32) & 1u);
  }
  // done[gate] >= need: then the FC1 outputs it counts may be read by TMA from here on.
  __device__ bool counted(int gate, int need) {
    if (pipeline::load_acquire(reinterpret_cast<const uint32_t*>(done + gate)) < uint32_t(need))
      return false;
    fence_proxy_async_global();
    if (gate < kCachedGates) opened[gate / 32] |= 1u << (gate % 32);
    return true;
  }
  // Counters are read only after the PDL wait (the permute clears them, the kernel before) or
  // counters_at_flag.
  __device__ bool open(const Noted& e) {
    if (e.gate == kAlwaysOpen) return true;
    if (e.gate < 0) return waited;
    return (waited || counters_at_flag) && (remembered(e.gate) || counted(e.gate, e.need));
  }
  __device__ void wait_open(const Noted& e) {
    if (e.gate == kAlwaysOpen) return;
    if (e.gate < 0 || !counters_at_flag) pdl();
    if (e.gate >= 0 && !remembered(e.gate))
      while (!counted(e.gate, e.need)) __nanosleep(64);
  }
  __device__ void issue_acts(const Noted& e) {
    cute::SM90_TMA_LOAD_2D::copy(e.map, &sm.full[e.stage],
                                 uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                 sm.acts + e.stage * kActBytes, e.kb * kBoxK, e.row);
  }
  // After the last box: every noted activation issued, the PDL wait behind.
  __device__ void finish() {
    flush(true);
    pdl();
  }
  // Issues the noted activations that can go, oldest first; with `block`, all of them.
  __device__ void flush(bool block) {
    while (count > 0) {
      const Noted& e = noted[head];
      if (!open(e)) {
        if (!block) return;
        wait_open(e);
      }
      issue_acts(e);
      head = (head + 1) % kStages;
      --count;
    }
  }
  __device__ void box(const CUtensorMap* weights, int weight_row, int kb, const CUtensorMap* acts,
                      int act_row, int gate, int need) {
    if (count == kStages) {  // this stage's activations are still noted: they must go first
      wait_open(noted[head]);
      flush(false);
    }
    EmptyBarrier::wait(&sm.empty[stage], phase ^ 1);
    FullBarrier::arrive_and_expect_tx(&sm.full[stage], R::kStageBytes + kActBytes);
    cute::SM90_TMA_LOAD_2D::copy(weights, &sm.full[stage],
                                 uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
                                 sm.weights + stage * R::kStageBytes, kb * kBoxK, weight_row);
    const Noted e{acts, stage, kb, act_row, gate, need};
    if (count == 0 && open(e)) {
      issue_acts(e);
    } else {
      noted[(head + count) % kStages] = e;
      ++count;
    }
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // The boxes of one item's chunks, in the consumers' order. `caller_rows`: the activations are
  // the caller's (GemvParams::one_row, or TokenRows), from row 0, ready; `one_pass`: all of them
  // in one chunk (TokenRows); k boxes [kb_begin, kb_end) of each (a k slice: KSlices).
  __device__ void item(const GemvParams& p, const Walk& w, const int* active, int64_t item,
                       const CUtensorMap* weights, const CUtensorMap* acts, int gate_of_g,
                       int need_per_chunk, bool caller_rows = false, bool one_pass = false,
                       int kb_begin = 0, int kb_end = -1) {
    if (kb_end < 0) kb_end = w.k_boxes;
    const int g = active[item / w.row_tiles];
    const int row = g * p.n + int(item % w.row_tiles) * R::kBoxRows;
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    const int chunks = (mg + kTokens - 1) / kTokens;
    for (int c0 = 0; c0 < (one_pass ? 1 : mg); c0 += kTokens)
      for (int kb = kb_begin; kb < kb_end; ++kb)
        box(weights, row, kb, acts, caller_rows ? 0 : m0 + c0,
            caller_rows     ? kAlwaysOpen
            : gate_of_g < 0 ? -1
                            : g,
            need_per_chunk * chunks);
  }
};

// The chained kernel's token rows as a consumer warp stores them (kept out of RingConsumer, which
// the other kernels share). `slots_ready`: the PDL wait before the first
// store is behind (once per warp: whether a wait per chunk costs is not measured; blocks take ~10
// FC1 items at 8 tokens on deepseek and gpt-oss, where token rows lost 7 us in 2026-12-01), or
// the kernel read the offsets after it.
struct TokenRowsStore {
  TokenRows rows;
  bool slots_ready;
};

// A consumer warp's side: the 16 rows of one item's chunk x 8 token rows, all k boxes from the
// ring, then its stores (kAct: FC1's gated activation).
template <bool kBF16, class R, int kStages>
struct RingConsumer {
  using Ring = R;
  const R sm;
  int stage = 0;
  uint32_t phase = 0;
  int warp, lane, a_row, a_chunk, b_row, b_chunk;

  // one_row: the stage holds one token row (GemvParams::one_row), read as all 8.
  __device__ RingConsumer(const R& ring, int w, int l, bool one_row = false)
      : sm(ring), warp(w), lane(l) {
    // ldmatrix.x4 of a 16 x 16 A tile: lanes 8j..8j+7 address matrix j's rows; matrices 0..3
    // are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
    a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    a_chunk = lane >> 4;  // 16-byte chunk within the 16-k step
    // ldmatrix.x4 of the 8 tokens x 32 k: matrix j is k chunk j (8 k) of all 8 token rows, so
    // lane l gets token l / 4, k 2(l % 4) + {0, 1} of each: the B fragments of two 16-k steps.
    // With one row, every token column reads row 0: an expert given the token twice (repeated
    // caller ids) gets it in both of its rows.
    rows(one_row);
    b_chunk = lane >> 3;
  }
  __device__ void rows(bool one_row) { b_row = one_row ? 0 : lane & 7; }

  // The k sum of this warp's 16 rows of k_boxes boxes from the ring (x 8 token rows).
  __device__ __forceinline__ void accumulate(int k_boxes, float (&acc)[4]) {
    for (int kb = 0; kb < k_boxes; ++kb) {
      FullBarrier::wait(&sm.full[stage], phase);
      const uint32_t a_base = smem_addr(sm.weights + stage * R::kStageBytes) + a_row * 128;
      const uint32_t b_base = smem_addr(sm.acts + stage * kActBytes) + b_row * 128;
      uint32_t b[4][2];
      load_token_fragments(b_base, b_row, b_chunk, b);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a0, a1, a2, a3;
        load_weight_fragment(a_base, a_row, a_chunk, s, a0, a1, a2, a3);
        mma16816<kBF16>(acc, a0, a1, a2, a3, b[s][0], b[s][1]);
      }
      release();
    }
  }
  // Hands the current stage back to the producer and moves to the next.
  __device__ __forceinline__ void release() {
    tma_ring::release_stage<kStages>(sm.empty, lane, stage, phase);
  }

  // Token rows past the chunk's mg (the next expert's, or zeros past the tensor) give columns
  // of the product that are not stored. kTokenRows: FC1 on `tokens` (the chained kernel only).
  template <bool kAct, bool kTokenRows = false>
  __device__ void chunk(const GemvParams& p, int k_boxes, int g, int row16, int c0, int m0, int mg,
                        TokenRowsStore* tokens = nullptr) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    accumulate(k_boxes, acc);
    if constexpr (kAct && kTokenRows) {
      if (!tokens->slots_ready) {  // the slots: from the permute, the kernel before
        pipeline::pdl_wait();
        tokens->slots_ready = true;
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
        store_gated_tokens<kBF16>(p, tokens->rows, g, row16, lane, i, acc[i], acc[i + 2]);
    } else if constexpr (kAct) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        store_gated<kBF16>(p, g, row16, c0, m0, mg, lane, i, acc[i], acc[i + 2]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) store_entry<kBF16>(p, row16, c0, m0, mg, lane, i, acc[i]);
    }
  }
  // FC2's k slice `slice` of `ks.count` of one item (KSlices): k_boxes of its boxes per chunk,
  // each chunk's sums stored as fp32 at ks.partials [row][ks.count][n].
  __device__ void item_slice(const GemvParams& p, const Walk& w, const int* active, int64_t item,
                             int k_boxes, const KSlices& ks, int slice) {
    const int g = active[item / w.row_tiles];
    const int row16 = int(item % w.row_tiles) * R::kBoxRows + warp * 16;
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    for (int c0 = 0; c0 < mg; c0 += kTokens) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      accumulate(k_boxes, acc);
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // store_entry's layout, into the slice's partial row
        const int out_row = entry_row(row16, lane, i), tok = entry_token(c0, lane, i);
        if (out_row < p.n && tok < mg)
          ks.partials[(int64_t(m0 + tok) * ks.count + slice) * p.n + out_row] = acc[i];
      }
    }
  }
  // Every chunk of one item (with token rows, FC1's: one pass over all tokens); returns the
  // count of its chunks of 8 rows either way (what FC2's gates count).
  template <bool kAct, bool kTokenRows = false>
  __device__ int item(const GemvParams& p, const Walk& w, const int* active, int64_t item,
                      TokenRowsStore* tokens = nullptr) {
    const int g = active[item / w.row_tiles];
    const int row16 = int(item % w.row_tiles) * R::kBoxRows + warp * 16;
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    if constexpr (kTokenRows)
      chunk<kAct, true>(p, w.k_boxes, g, row16, 0, m0, mg, tokens);
    else
      for (int c0 = 0; c0 < mg; c0 += kTokens) chunk<kAct>(p, w.k_boxes, g, row16, c0, m0, mg);
    return (mg + kTokens - 1) / kTokens;
  }
};

// Sets up the ring's barriers and the live groups; every thread calls it.
template <class R, int kStages>
__device__ int ring_prologue(const R& sm, const GemvParams& p, int* s_warp_live) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&sm.full[s], 1);
      EmptyBarrier::init(&sm.empty[s], R::kConsumers);
    }
    cutlass::arch::fence_barrier_init();
  }
  wait_for_offsets(p);
  // Synchronizes the block: the barriers are initialized from here on.
  return compact_live_groups<R::kWarps>(p.row_offsets, p.groups, sm.active, s_warp_live);
}

// The producer warp: lane 0 issues every box (`issue`, which ends with RingProducer::finish),
// then every lane has waited for the kernel before and lets the next one start.
template <class Issue>
__device__ void producer_warp(int lane, Issue&& issue) {
  if (lane == 0)
    issue();
  else
    pipeline::pdl_wait();
  pipeline::pdl_launch_dependents();
}

// kBlocksPerSm blocks per SM: the variants trade blocks for bytes in flight per block.
// Its producer loop is written out here rather than through RingProducer (the chained kernel's):
// built through it (c32eb28), this kernel measured 5-13 us slower at one token on the H200
// (qwen3, gpt-oss, deepseek; FC2 after its PDL wait), for a reason not found yet; its consumers'
// SASS was the same either way. Same logic, so any fix to one is a fix to the other.
template <bool kBF16, bool kAct, int kRows, int kStages, int kBlocksPerSm>
__global__ void __launch_bounds__(Ring<kRows, kStages>::kThreads, kBlocksPerSm)
    grouped_gemv_tma_kernel(const __grid_constant__ CUtensorMap weights,
                            const __grid_constant__ CUtensorMap acts, GemvParams p) {
  using R = Ring<kRows, kStages>;
  constexpr int kConsumers = R::kConsumers, kWarps = R::kWarps, kStageBytes = R::kStageBytes;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_warp_live[kWarps];
  __shared__ uint64_t s_item_full[kStages], s_item_empty[kStages];
  __shared__ int s_items[kStages];
  const R sm(smem_raw);
  ItemRing<kStages> counted_items{s_item_full, s_item_empty, s_items};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&sm.full[s], 1);
      EmptyBarrier::init(&sm.empty[s], kConsumers);
    }
    if (p.next_item != nullptr) ItemRing<kStages>::init(s_item_full, s_item_empty, kConsumers);
    cutlass::arch::fence_barrier_init();
  }
  // The counter is clear once the offsets can be read (GemmCall::item_counter).
  wait_for_offsets(p);
  // Synchronizes the block: the barriers are initialized from here on.
  const Walk walk{compact_live_groups<kWarps>(p.row_offsets, p.groups, sm.active, s_warp_live),
                  p.row_tiles, (p.k + kBoxK - 1) / kBoxK};
  // Items from the counter only where blocks take more than one: else the fixed share is the
  // same and costs no atomic (forward A/B, H200, 2026-12-01: qwen3 T=1 +0.3 us with the counter).
  const bool counted = p.next_item != nullptr && walk.items() > gridDim.x;

  if (warp == kConsumers) {  // the producer warp; one thread issues the copies
    if (lane == 0) {
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&weights));
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&acts));
      const auto load_acts = [&](int stage, int kb, int token_row) {
        cute::SM90_TMA_LOAD_2D::copy(&acts, &sm.full[stage],
                                     uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                     sm.acts + stage * kActBytes, kb * kBoxK, token_row);
      };
      // The activations come from the kernel before: before its wait, the producer copies
      // weights only and notes where each stage's activations are, (k box, token row). One
      // row (p.one_row) comes from before that kernel: copied from the start, row 0 always.
      bool waited = !p.offsets_ready || p.one_row;
      int pending_kb[kStages], pending_row[kStages];
      const auto wait_and_flush = [&](int pending) {
        pipeline::pdl_wait();
        pipeline::pdl_launch_dependents();
        for (int s = 0; s < pending; ++s) load_acts(s, pending_kb[s], pending_row[s]);
        waited = true;
      };
      int stage = 0, issued = 0;
      uint32_t phase = 0;
      const int n_items = int(walk.items());  // < 2^31: Walk::items of int32 rows
      const auto next = [&](int64_t item) -> int64_t {
        if (!counted) return item + gridDim.x;
        const int id = counted_items.take_and_publish(p.next_item, n_items);
        return id < 0 ? n_items : id;
      };
      for (int64_t item = counted ? next(0) : blockIdx.x; item < n_items; item = next(item)) {
        const int g = sm.active[item / walk.row_tiles];
        const int row = g * p.n + int(item % walk.row_tiles) * kRows;
        const int m0 = p.row_offsets[g];
        const int mg = p.row_offsets[g + 1] - m0;
        for (int c0 = 0; c0 < mg; c0 += kTokens)
          for (int kb = 0; kb < walk.k_boxes; ++kb) {
            if (!waited && issued == kStages) wait_and_flush(kStages);  // the ring is full
            EmptyBarrier::wait(&sm.empty[stage], phase ^ 1);
            FullBarrier::arrive_and_expect_tx(&sm.full[stage], kStageBytes + kActBytes);
            cute::SM90_TMA_LOAD_2D::copy(&weights, &sm.full[stage],
                                         uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
                                         sm.weights + stage * kStageBytes, kb * kBoxK, row);
            if (waited) {
              load_acts(stage, kb, p.one_row ? 0 : m0 + c0);
            } else {
              pending_kb[issued] = kb;
              pending_row[issued] = m0 + c0;
            }
            ++issued;
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1;
            }
          }
      }
      if (!waited) wait_and_flush(issued);
      if (p.one_row) pipeline::pdl_wait();  // the next kernel starts after the one before
    } else {
      pipeline::pdl_wait();
    }
    pipeline::pdl_launch_dependents();
    return;
  }

  // The outputs may still be read by the kernel before. Not with one row (its contract): then
  // the consumers neither wait nor let the next kernel start; the producer warp does both.
  if (!p.one_row) {
    if (p.offsets_ready) pipeline::pdl_wait();
    pipeline::pdl_launch_dependents();
  }
  RingConsumer<kBF16, R, kStages> consumer(sm, warp, lane, p.one_row != 0);
  if (counted) {
    for (int item = counted_items.read(lane); item >= 0; item = counted_items.read(lane))
      consumer.template item<kAct>(p, walk, sm.active, item);
  } else {
    for (int64_t item = blockIdx.x; item < walk.items(); item += gridDim.x)
      consumer.template item<kAct>(p, walk, sm.active, item);
  }
}

// FC1 (+ its gated activation) then FC2 in one persistent kernel, for decode. Items are FC1's,
// then FC2's, handed out in that order by one counter (done[groups]), so an FC2 item, whose
// activations wait for all of its expert's FC1 items (done[g], counted per consumer warp and
// chunk), only ever waits for items that running blocks hold (a static split could make it wait
// for a block that is not resident). The producer hands each item to the consumers through a
// small ring of item ids, and streams FC2's weights while FC1's last items finish; only their
// activations wait. done[groups + 1] is cleared by the permute before (Buffers::expert_done).
// At one token (GemvParams::one_row, only at the permute's flag) FC1 reads the caller's row as
// the standalone kernel does, so neither its weights nor its activations wait for the gather;
// FC2's stores, into the gathered rows' memory, do (the consumers' PDL wait before their first
// FC2 item). At 2 to 8 tokens (`tokens`) FC1 reads the tokens' own rows, which the permute then
// does not gather: one pass per item over all of them, each token's product stored at its slots'
// rows once the permute has ended (its PDL wait). `tokens` (kTokenRows) is an argument and a
// kernel of its own, so that the other kernels' code stays as it was: as GemvParams fields, it
// changed nvcc's code for every standalone GEMV (3704 -> 3256 SASS instructions) and made qwen3
// T=1, which runs those, 0.7 us slower (H200, 2026-12-01). With k slices (KSlices), an FC2 item is
// one slice of a 64-row tile's k, its fp32 sums stored for finalize::run_slices: the kernel's
// last items are shorter, so its blocks end closer together.
template <bool kBF16, int kRows, int kStages, int kBlocksPerSm, bool kTokenRows>
__global__ void __launch_bounds__(Ring<kRows, kStages>::kThreads, kBlocksPerSm)
    chained_gemv_tma_kernel(const __grid_constant__ CUtensorMap w1,
                            const __grid_constant__ CUtensorMap a1,
                            const __grid_constant__ CUtensorMap w2,
                            const __grid_constant__ CUtensorMap a2, GemvParams p1, GemvParams p2,
                            int* done, TokenRows tokens, KSlices ks) {
  using R = Ring<kRows, kStages>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_warp_live[R::kWarps];
  __shared__ uint64_t s_item_full[kStages], s_item_empty[kStages];
  __shared__ int s_items[kStages];
  const R sm(smem_raw);
  ItemRing<kStages> ring{s_item_full, s_item_empty, s_items};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) ItemRing<kStages>::init(s_item_full, s_item_empty, R::kConsumers);
  // Fences the item barriers' initialization with the ring's and synchronizes the block.
  const int live = ring_prologue<R, kStages>(sm, p1, s_warp_live);
  const Walk fc1 = walk_of(p1, live), fc2 = walk_of(p2, live);
  // FC2's items are (item, k slice), slice minor: ks.count of them per 64-row tile.
  const int items1 = int(fc1.items()), items = items1 + int(fc2.items()) * ks.count;
  const auto slice_begin = [&](int s) { return s * fc2.k_boxes / ks.count; };
  int* const next_item = done + p1.groups;
  // FC1 reads the caller's rows (one row, at the permute's flag, or the tokens' own: kTokenRows ||
  // p1.one_row). Written out where used: held in a variable, it changed nvcc's
  // code for the kernel without token rows (3376 -> 3384 SASS instructions, reordered).
  if (warp == R::kConsumers) {
    // At the permute's flag, where FC1's items outnumber the blocks, lanes 1-31 leave at once:
    // in producer_warp they fall through to griddepcontrol.wait (SASS ACQBULK) while lane 0
    // branches to the ring, and can hold its first boxes until the permute ends; lane 0 waits
    // for it in finish() and lets the next kernel start, as the warp did. H200, 2026-12-03, 4
    // rounds: gpt-oss T=2 -1.4 us, mixtral T=4 -1.4, qwen3 T=8 -0.4. Where every block has at most
    // one FC1 item (qwen3 T=2, the whole grid) it lost 0.8, in the FC1 blocks (not found why);
    // behind a gather kernel, 1.4 on gpt-oss T=8 (H200, 2026-12-03): both keep the warp.
    if (lane != 0 && p1.offsets_flag != nullptr && items1 > int(gridDim.x)) return;
    producer_warp(lane, [&] {
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&w1));
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&a1));
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&w2));
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&a2));
      using Producer = RingProducer<R, kStages>;
      __shared__ uint32_t s_opened[Producer::kCachedGates / 32];
      for (int i = 0; i < Producer::kCachedGates / 32; ++i) s_opened[i] = 0;
      typename Producer::Noted noted[kStages];
      Producer prod(sm, noted, done, s_opened, !p1.offsets_ready);
      prod.counters_at_flag = kTokenRows || p1.one_row != 0;
      // ItemRing's first item per block is the block's own. H200, 2026-12-02, 3 rounds x 2 calls
      // against the counter alone: qwen3 T=2-8 -0.3 to -0.8 us, deepseek -0.6 to -1.1, mixtral
      // T=4 +1.0 (even on a third machine), the rest within 1 us either way.
      for (;;) {
        const int item = ring.take_and_publish(next_item, items);
        if (item < 0) break;
        if (item < items1)
          prod.item(p1, fc1, sm.active, item, &w1, &a1, -1, 0, kTokenRows || p1.one_row != 0,
                    kTokenRows);
        else  // FC1's chunks of the expert, each counted once per consumer warp
          prod.item(p2, fc2, sm.active, (item - items1) / ks.count, &w2, &a2, 0,
                    fc1.row_tiles * R::kConsumers, false, false,
                    slice_begin((item - items1) % ks.count),
                    slice_begin((item - items1) % ks.count + 1));
      }
      prod.finish();
    });
    return;
  }
  // With the caller's rows (at the flag), FC1's items read them and write only what the permute
  // does not touch (with token rows, at the permute's slots: the stores wait for it); FC2's
  // stores (into the gathered rows' memory) wait for the permute.
  // The consumers do not let the next kernel start: the producer warp does, after its PDL wait
  // (pdl.cuh's protocol). The finalize that follows reads the permute's slots before its own
  // wait, so it must not start before the permute has ended. With the caller's rows these warps
  // used to trigger at their start, before any wait (until 2026-12-02; no stale read was ever
  // seen: GemvPdl.FinalizeAfterChainedTokenRowsReadsTheWrittenSlots passed on that kernel too).
  bool waited = !kTokenRows && !p1.one_row;
  // With offsets read before the PDL wait, the consumers wait now, before any store (the kernel
  // before may still read what they overwrite); ring_prologue's wait_for_offsets waited where
  // neither the flag nor offsets_ready is set.
  if (waited && p1.offsets_ready) pipeline::pdl_wait();
  RingConsumer<kBF16, R, kStages> cons(sm, warp, lane);
  TokenRowsStore store{tokens, p1.offsets_flag == nullptr && !p1.offsets_ready};
  for (;;) {
    const int item = ring.read(lane);
    if (item < 0) break;
    cons.rows(item < items1 && p1.one_row);
    if (item >= items1 && !waited) {
      pipeline::pdl_wait();
      waited = true;
    }
    if (item < items1) {
      const int chunks = cons.template item<true, kTokenRows>(p1, fc1, sm.active, item, &store);
      // This warp's stores of the item, then its count (one per chunk), so that the TMA loads
      // of FC2's activations in any block see them.
      // Each lane fences its own stores; lane 0's count is then a release of all of them
      // (a relaxed atomic after the __syncwarp would order them only in practice).
      __threadfence();
      fence_proxy_async_global();
      __syncwarp();
      if (lane == 0)
        pipeline::add_release(reinterpret_cast<uint32_t*>(done + sm.active[item / fc1.row_tiles]),
                              uint32_t(chunks));
    } else if (ks.count == 1) {
      cons.template item<false>(p2, fc2, sm.active, item - items1);
    } else {
      const int slice = (item - items1) % ks.count;
      cons.item_slice(p2, fc2, sm.active, (item - items1) / ks.count,
                      slice_begin(slice + 1) - slice_begin(slice), ks, slice);
    }
  }
}

// One token's FC1 (+ its gated activation) and FC2 in one pass, sliced along the intermediate
// dimension: an item is two of one expert's 64-row FC1 boxes (64 activations, in the blocked
// gate/up order) and then the 64 columns of FC2 that those activations multiply, [H, 64]. No
// block waits for another's FC1, so the two GEMMs stream as one wave with no hand-off between
// them; each item stores its product [H] as fp32 partial sums, partials[row][slice][H] (row: the
// expert's row of the run), which the finalize adds in slice order (finalize::run_slices).
// Slices of 64 read whole 128-byte lines of FC2's rows; slices of 32 (64-byte rows) were 12 us
// slower at one token on gpt-oss, 128 10 us slower on qwen3 (the H200 results of 2026-12-01).
// FC1 reads the caller's row (GemvParams::one_row) from the permute's flag on. The partials are
// this kernel's alone, so its stores wait for nothing; the producer warp waits for the permute
// before the kernel lets the finalize start (which reads the permute's slots before its wait).
constexpr int kSlice = GroupedGemm::kSliceActivations;  // activations per slice
constexpr int kSliceTiles = kSlice / 32;  // FC1's 64-row boxes (32 activations each) per slice
constexpr int kSliceRows = 64;            // FC2 rows per box: 64 x 64 k x 2 B = 8 KB, one stage
constexpr int kSliceSteps = kSlice / 16;  // k16 steps per FC2 box
// Slices per expert from FC1's 64-row boxes per expert: ceil(I / kSlice).
__host__ __device__ constexpr int slices_of(int row_tiles) {
  return (row_tiles + kSliceTiles - 1) / kSliceTiles;
}

// A consumer warp's part of one FC2 box of a slice: rows 16w..16w+15 (one m16 tile) x the 64
// activations (four k16 steps, B fragments `b` from the block's activations), stored for token
// column 0 at out[h0 + row]. The box is 128-byte swizzled: 16-byte chunk c of row r lies at
// c ^ (r & 7).
template <bool kBF16, class Consumer>
__device__ __forceinline__ void slice_box(Consumer& cons, const uint32_t (&b)[kSliceSteps][2],
                                          float* out, int h0, int hidden) {
  FullBarrier::wait(&cons.sm.full[cons.stage], cons.phase);
  const uint32_t base = smem_addr(cons.sm.weights + cons.stage * Consumer::Ring::kStageBytes);
  const int lane = cons.lane;
  const int r = cons.warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  float acc[4] = {};
#pragma unroll
  for (int ks = 0; ks < kSliceSteps; ++ks) {
    const int ch = (ks * 2 + (lane >> 4)) ^ (r & 7);
    uint32_t a0, a1, a2, a3;
    ldmatrix_x4(base + r * 2 * kSlice + ch * 16, a0, a1, a2, a3);
    mma16816<kBF16>(acc, a0, a1, a2, a3, b[ks][0], b[ks][1]);
  }
  cons.release();
  if ((lane & 3) == 0) {  // token column 0: entries 0 (row l/4) and 2 (row l/4 + 8)
    const int h = h0 + cons.warp * 16 + (lane >> 2);
    if (h < hidden) out[h] = acc[0];
    if (h + 8 < hidden) out[h + 8] = acc[2];
  }
}

template <bool kBF16, int kStages, int kBlocksPerSm>
__global__ void __launch_bounds__(Ring<64, kStages>::kThreads, kBlocksPerSm)
    sliced_gemv_tma_kernel(const __grid_constant__ CUtensorMap w1,
                           const __grid_constant__ CUtensorMap a1,
                           const __grid_constant__ CUtensorMap w2, GemvParams p1, float* partials,
                           int* next_item) {
  using R = Ring<64, kStages>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_warp_live[R::kWarps];
  __shared__ uint64_t s_item_full[kStages], s_item_empty[kStages];
  __shared__ int s_items[kStages];
  // Two items' activations, [token column][slice]: a warp writes item n's while the others may
  // still read item n - 1's B fragments (never n - 2's: each passed item n - 1's barrier).
  __shared__ __align__(16) uint16_t s_act[2][kTokens][kSlice];
  const R sm(smem_raw);
  ItemRing<kStages> ring{s_item_full, s_item_empty, s_items};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) ItemRing<kStages>::init(s_item_full, s_item_empty, R::kConsumers);
  const int live = ring_prologue<R, kStages>(sm, p1, s_warp_live);
  const int slices = slices_of(p1.row_tiles);
  const int items = live * slices, hidden = p1.k;
  const int k_boxes = (hidden + kBoxK - 1) / kBoxK;
  const int fc2_boxes = (hidden + kSliceRows - 1) / kSliceRows;
  // FC1's boxes in a slice: the last one's of an intermediate not a multiple of 64 may be one,
  // the box past the expert's not loaded (its activations are zeros).
  const auto slice_tiles = [&](int slice) {
    return min(kSliceTiles, p1.row_tiles - slice * kSliceTiles);
  };
  if (warp == R::kConsumers) {
    if (lane == 0) {
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&w1));
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&a1));
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&w2));
      int stage = 0;
      uint32_t phase = 0;
      const auto next_stage = [&](int bytes) {
        EmptyBarrier::wait(&sm.empty[stage], phase ^ 1);
        FullBarrier::arrive_and_expect_tx(&sm.full[stage], bytes);
        const int s = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
        return s;
      };
      for (;;) {
        const int item = ring.take_and_publish(next_item, items);
        if (item < 0) break;
        const int g = sm.active[item / slices], slice = item % slices;
        for (int t = 0; t < slice_tiles(slice); ++t)
          for (int kb = 0; kb < k_boxes; ++kb) {
            const int s = next_stage(R::kStageBytes + kActBytes);
            cute::SM90_TMA_LOAD_2D::copy(&w1, &sm.full[s],
                                         uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
                                         sm.weights + s * R::kStageBytes, kb * kBoxK,
                                         g * p1.n + (slice * kSliceTiles + t) * 64);
            cute::SM90_TMA_LOAD_2D::copy(&a1, &sm.full[s],
                                         uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                         sm.acts + s * kActBytes, kb * kBoxK, 0);
          }
        for (int b = 0; b < fc2_boxes; ++b) {
          const int s = next_stage(R::kStageBytes);
          cute::SM90_TMA_LOAD_2D::copy(
              &w2, &sm.full[s], uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
              sm.weights + s * R::kStageBytes, slice * kSlice, g * hidden + b * kSliceRows);
        }
      }
    }
    pipeline::pdl_wait();  // the finalize starts after the permute (its slots)
    pipeline::pdl_launch_dependents();
    return;
  }
  RingConsumer<kBF16, R, kStages> cons(sm, warp, lane, true);
  for (int n = 0;; n ^= 1) {
    const int item = ring.read(lane);
    if (item < 0) break;
    const int g = sm.active[item / slices], slice = item % slices;
    const int tiles = slice_tiles(slice);
#pragma unroll
    for (int t = 0; t < kSliceTiles; ++t) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      if (t < tiles) cons.accumulate(k_boxes, acc);
      // Entries i and i + 2 are gate and up of gate row l / 4 for token column 2(l % 4) + i
      // (store_gated); gate rows past the expert's (a local intermediate not a multiple of the
      // slice) give zeros, as FC2's columns past it read.
      const int gate_row = (slice * kSliceTiles + t) * 64 + warp * 16 + (lane >> 2);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        s_act[n][(lane & 3) * 2 + i][t * 32 + warp * 8 + (lane >> 2)] = to_elem<kBF16>(
            gate_row < p1.n ? gated_value(p1, g, gate_row, acc[i], acc[i + 2]) : 0.0f);
    }
    asm volatile("bar.sync 1, %0;" ::"n"(R::kConsumers * 32) : "memory");
    // B fragments of the k16 steps: token column l / 4, k 2(l % 4) + {0, 1} and + 8.
    uint32_t b[kSliceSteps][2];
#pragma unroll
    for (int ks = 0; ks < kSliceSteps; ++ks)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        b[ks][j] = *reinterpret_cast<const uint32_t*>(
            &s_act[n][lane >> 2][ks * 16 + j * 8 + (lane & 3) * 2]);
    float* out = partials + (int64_t(p1.row_offsets[g]) * slices + slice) * hidden;
    for (int bx = 0; bx < fc2_boxes; ++bx) slice_box<kBF16>(cons, b, out, bx * kSliceRows, hidden);
  }
}

// One run's kernel parameters and tensor maps.
struct Bound {
  GemvParams p;
  const CUtensorMap* weights;
  const CUtensorMap* acts;
};

template <bool kBF16, bool kAct, int kRows, int kStages, int kBlocksPerSm, int kDefaultStages>
class GemvTmaTactic final : public GemvTacticBase {
  using R = Ring<kRows, kStages>;

 public:
  // sm90.gemv.tma64 (its default stage count), sm90.gemv.tma64.s12 (another), ...
  static std::string name() {
    const std::string base = "sm90.gemv.tma" + std::to_string(kRows);
    return kStages == kDefaultStages ? base : base + ".s" + std::to_string(kStages);
  }

  Status init(const TacticContext& ctx) override {
    Status s = setup(ctx, name(), kAct);
    if (!s.ok()) return s;
    // The row pitch (k * 2 bytes) is a multiple of 16, as TMA needs: validate() keeps k % 8 == 0.
    // Box rows are int32 coordinates. The activations' map spans max_rows rows (run()'s
    // contract: `a` holds max_rows rows).
    if (int64_t(ctx.shape.groups) * ctx.shape.n + kRows > INT32_MAX ||
        ctx.shape.max_rows + kTokens > INT32_MAX)
      return Status(ErrorCode::kUnsupported, what_ + ": groups x n or max_rows exceed int32 rows");
    max_rows_ = ctx.shape.max_rows;
    encode_ = tensor_map_encoder(s);
    if (!s.ok()) return Status(s.code(), what_ + ": " + s.message());
    p_.row_tiles = static_cast<int>((ctx.shape.n + kRows - 1) / kRows);
    s = size_grid(reinterpret_cast<const void*>(kernel), ctx, R::smem_bytes(ctx.shape.groups),
                  R::kThreads);
    if (!s.ok() || !kAct) return s;
    if constexpr (kRows == 64) {  // and the one-token sliced kernel
      s = slots_on_device(reinterpret_cast<const void*>(kSliced<>), ctx, sliced_slots_);
      if (!s.ok()) return s;
    }
    // FC1's tactic also launches the chained kernels.
    for (int t = 0; t < 2; ++t) {
      s = slots_on_device(reinterpret_cast<const void*>(kChained[t]), ctx, chained_slots_[t]);
      if (!s.ok()) return s;
    }
    return {};
  }

  // How many blocks of a kernel fit on the device at once, and per SM.
  struct Slots {
    int64_t all = 0;
    int per_sm = 0;
  };

  // Another kernel of this variant (chained, sliced), with its shared memory: how many of its
  // blocks fit on the device at once.
  Status slots_on_device(const void* kernel, const TacticContext& ctx, Slots& slots) const {
    const Status raised = moekit::raise_dynamic_smem_limit(kernel, smem_, what_);
    if (!raised.ok()) return raised;
    int per_sm = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, R::kThreads, smem_);
    if (err != cudaSuccess)
      return cuda_status(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", what_);
    slots.per_sm = std::max(per_sm, 1);
    slots.all = int64_t(slots.per_sm) * ctx.sm_count;
    return {};
  }

  // The chained kernel's grid. From the permute's flag on, it starts beside the permute's single
  // block, and none of its blocks is placed on that block's SM until the permute ends: the
  // driver sizes that SM's shared memory for the permute alone (the H200 stamps of 2026-12-03,
  // qwen3 T=8: of 395 blocks the last started at the permute's end, 3 us after block 0; of 393,
  // with it). A block that late has its first item (blockIdx.x, an FC1 item) on the forward's
  // critical path, so the SM's slots are left out (H200, 2026-12-03, two H200s: qwen3 T=8 -0.3 /
  // -0.2 us, mixtral T=4 -0.9, the rest of T=1-8 within 0.3). Unless every left-out block's first
  // item is an FC2 item (the at most `fc1_items` FC1 items come first), which waits for its
  // expert's FC1 items anyway: then the late start costs nothing and the block adds a worker (qwen3
  // T=2, at most 16 experts x 24 FC1 items = 384: -0.4 / -0.3 us). The sliced kernel (one token, no
  // waits between items) takes every slot: leaving its late blocks out lost 1 us on mixtral T=1.
  static int64_t chained_grid_bound(const Slots& slots, const RunArgs& a, int64_t fc1_items) {
    const int64_t early = slots.all - slots.per_sm;
    return a.offsets_flag == nullptr || fc1_items <= early ? slots.all : early;
  }

  // This run's parameters and tensor maps (made again only when their tensors move, so graph
  // replays reuse them).
  Status bind(const RunArgs& a, Bound& out) {
    Status s = weights_.map(a.b, int64_t(p_.groups) * p_.n, kRows, "weights", *this);
    const bool tokens = a.token_rows.rows != nullptr;
    TensorMap& acts = a.one_row != nullptr ? one_row_ : tokens ? token_rows_ : acts_;
    if (!s.ok()) return s;
    if (a.one_row != nullptr)
      s = one_row_.map(a.one_row, 1, kTokens, "activation row", *this);
    else if (tokens)  // rows past the count read as zeros
      s = token_rows_.map(a.token_rows.rows, a.token_rows.count, kTokens, "token rows", *this);
    else
      s = acts_.map(a.a, max_rows_, kTokens, "activations", *this);
    if (!s.ok()) return s;
    out = Bound{params(a), &weights_.desc, &acts.desc};
    return {};
  }

  bool reads_token_rows() const override { return kAct; }
  bool runs_sliced() const override { return kAct && kRows == 64; }

  // FC1 (this, "+act", reading the caller's row from the permute's flag on) and FC2 (`w2`,
  // [groups, k, n / 2]) of one token in slices of the intermediate (sliced_gemv_tma_kernel).
  Status run_sliced(const RunArgs& a, const void* w2, float* partials, int* next_item) override {
    if constexpr (kAct && kRows == 64) {
      if (a.one_row == nullptr || a.offsets_flag == nullptr || partials == nullptr ||
          next_item == nullptr)
        return Status(ErrorCode::kInvalidArgument,
                      what_ +
                          ": the sliced kernel reads one row from the permute's flag and "
                          "needs partials and an item counter");
      if (grid_ == 0) return {};
      Bound b1;
      Status s = bind(a, b1);
      // FC2 as [groups x k rows, n / 2]: boxes of 64 rows x 64 columns (128 bytes).
      if (s.ok())
        s = fc2_slices_.map(w2, p_.n / 2, int64_t(p_.groups) * p_.k, kSlice, kSliceRows,
                            CU_TENSOR_MAP_SWIZZLE_128B, "FC2 weights", *this);
      if (!s.ok()) return s;
      const int grid = static_cast<int>(
          std::min<int64_t>(sliced_slots_.all, live_groups(a) * slices_of(p_.row_tiles)));
      const cudaError_t err =
          pipeline::launch_pdl(kSliced<>, grid, R::kThreads, smem_, a.stream, *b1.weights, *b1.acts,
                               fc2_slices_.desc, b1.p, partials, next_item);
      if (err != cudaSuccess) return cuda_status(err, "sliced kernel launch", what_);
      return {};
    } else {
      (void)a, (void)w2, (void)partials, (void)next_item;
      return Status(ErrorCode::kUnsupported, what_ + ": runs sliced only as FC1 (+act) of tma64");
    }
  }

  Status run(const RunArgs& a) override {
    if (grid_ == 0) return {};  // max_rows == 0: nothing can ever be computed
    Bound b;
    const Status s = bind(a, b);
    if (!s.ok()) return s;
    const cudaError_t err = pipeline::launch_pdl(kernel, grid_for(a), R::kThreads, smem_, a.stream,
                                                 *b.weights, *b.acts, b.p);
    if (err != cudaSuccess) return cuda_status(err, "kernel launch", what_);
    return {};
  }

  int64_t chained_slots(bool token_rows) const override {
    return kAct ? chained_slots_[token_rows ? 1 : 0].all : 0;
  }
  // FC1 (this, "+act") then FC2 (`next`: the same variant without the activation).
  Status run_chained(const RunArgs& a, Tactic& next, const RunArgs& next_args, int* done) override {
    using Second = GemvTmaTactic<kBF16, false, kRows, kStages, kBlocksPerSm, kDefaultStages>;
    auto* second = dynamic_cast<Second*>(&next);
    if (!kAct || second == nullptr)
      return Status(ErrorCode::kUnsupported,
                    what_ + ": chains only as FC1 (+act) before " + Second::name() + " as FC2");
    if (grid_ == 0) return {};
    Bound b1, b2;
    RunArgs first = a;
    // One row only at the flag: the done counters are cleared before it.
    if (a.offsets_flag == nullptr) first.one_row = nullptr;
    Status s = bind(first, b1);
    if (s.ok()) s = second->bind(next_args, b2);
    if (!s.ok()) return s;
    const int tokens = first.token_rows.rows != nullptr ? 1 : 0;
    const int grid = static_cast<int>(std::min<int64_t>(
        chained_grid_bound(chained_slots_[tokens], first, live_groups(a) * b1.p.row_tiles),
        live_groups(a) * (b1.p.row_tiles + b2.p.row_tiles * next_args.k_slices.count)));
    const cudaError_t err = pipeline::launch_pdl(
        kChained[tokens], grid, R::kThreads, smem_, a.stream, *b1.weights, *b1.acts, *b2.weights,
        *b2.acts, b1.p, b2.p, done, first.token_rows, next_args.k_slices);
    if (err != cudaSuccess) return cuda_status(err, "chained kernel launch", what_);
    return {};
  }

 private:
  static constexpr auto kernel = grouped_gemv_tma_kernel<kBF16, kAct, kRows, kStages, kBlocksPerSm>;
  // A variable template, so that only the tma64 variants, which use it, instantiate the kernel.
  template <int kS = kStages>
  static constexpr auto kSliced = sliced_gemv_tma_kernel<kBF16, kS, kBlocksPerSm>;
  // [kTokenRows]
  static constexpr decltype(&chained_gemv_tma_kernel<kBF16, kRows, kStages, kBlocksPerSm, false>)
      kChained[2] = {chained_gemv_tma_kernel<kBF16, kRows, kStages, kBlocksPerSm, false>,
                     chained_gemv_tma_kernel<kBF16, kRows, kStages, kBlocksPerSm, true>};

  // A [rows, k] tensor read in boxes of box_rows x kBoxK, 128-byte swizzled. L2 promotion 128 B,
  // as CUTLASS's TMA copies: with 256 B the ring streamed 4.14-4.32 TB/s (moekit_tma_stream,
  // 2026-12-01), with 128 B or none 4.50-4.55; qwen3 T=8 140.1 -> 135.2 us, gpt-oss 372.0 -> 361.1.
  struct TensorMap : TensorMap2d {
    Status map(const void* base, int64_t rows, int box_rows, const char* name,
               const GemvTmaTactic& t) {
      return map(base, t.p_.k, rows, kBoxK, box_rows, CU_TENSOR_MAP_SWIZZLE_128B, name, t);
    }
    // A [rows, cols] tensor in boxes of box_rows x box_cols.
    Status map(const void* base, int64_t cols, int64_t rows, int box_cols, int box_rows,
               CUtensorMapSwizzle swizzle, const char* name, const GemvTmaTactic& t) {
      return encode(t.encode_, base,
                    kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                    cols, rows, box_cols, box_rows, swizzle, t.what_ + ": the " + name);
    }
  };

  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  int64_t max_rows_ = 0;
  Slots chained_slots_[2];  // [kTokenRows]
  Slots sliced_slots_;
  // one_row_: RunArgs::one_row, [1, k]; token_rows_: RunArgs::token_rows, [count, k];
  // fc2_slices_: run_sliced's FC2 weights
  TensorMap weights_, acts_, one_row_, token_rows_, fc2_slices_;
};

template <bool kBF16, int kRows, int kStages, int kBlocksPerSm, int kDefaultStages = kStages>
void add_gemv_tma(std::vector<TacticEntry>& v) {
  using Store = GemvTmaTactic<kBF16, false, kRows, kStages, kBlocksPerSm, kDefaultStages>;
  using Act = GemvTmaTactic<kBF16, true, kRows, kStages, kBlocksPerSm, kDefaultStages>;
  add_store_and_act(
      v, Store::name(), TacticKind::kGemv,
      []() -> std::unique_ptr<Tactic> { return std::make_unique<Store>(); },
      []() -> std::unique_ptr<Tactic> { return std::make_unique<Act>(); });
}

// Bytes in flight per block = stages x (weight box + 1 KB of activations).
template <bool kBF16>
std::vector<TacticEntry> gemv_tma_list() {
  std::vector<TacticEntry> v;
  add_gemv_tma<kBF16, 64, 8, 3>(v);      // sm90.gemv.tma64: 72 KB, 3 blocks per SM
  add_gemv_tma<kBF16, 64, 12, 2, 8>(v);  // .s12: 108 KB, 2 per SM (pick_tactic: fuller waves)
#if !defined(MOEKIT_ONE_TACTIC)
  add_gemv_tma<kBF16, 64, 24, 1, 8>(v);   // .s24: 216 KB, 1 per SM
  add_gemv_tma<kBF16, 128, 6, 2>(v);      // sm90.gemv.tma128: 16 KB boxes as CUTLASS's tiles
  add_gemv_tma<kBF16, 128, 12, 1, 6>(v);  // .s12: 204 KB, 1 per SM
#endif
  return v;
}

}  // namespace

std::vector<TacticEntry> sm90_gemv_tma_tactics(Elem elem) {
  return elem == Elem::kBF16 ? gemv_tma_list<true>() : gemv_tma_list<false>();
}

}  // namespace moekit::gemm::detail
