// What the decode GEMV kernels share (sm90_gemv.cu: weights through registers, split k;
// sm90_gemv_tma.cu: weights through a TMA ring, whole k per warp; the packed-weight GEMVs of
// stream_gemv.cuh take the streaming load alone): their parameters, the
// m16n8k16 MMA, the stores of one C fragment entry (plain, or FC1's bias + gated activation),
// and the host half of a tactic, which sizes a persistent grid over (live expert, row tile)
// items.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "activation/activation_math.hpp"
#include "common/kernel_smem.hpp"
#include "gemm/tactic.hpp"
#include "pipeline/pdl.cuh"

namespace moekit::gemm::detail {

struct GemvParams {
  const uint16_t* a;  // [rows, k]
  const uint16_t* w;  // [groups, n, k]
  uint16_t* d;        // [rows, n], or [rows, n / 2] for "+act"
  const int32_t* row_offsets;
  int groups, n, k;
  int kw, rw, row_tiles;         // sm90_gemv.cu's split; the TMA kernel uses row_tiles only
  int offsets_ready;             // row_offsets final before the kernel starts, or at the flag
  const uint32_t* offsets_flag;  // or null (GemmCall)
  int one_row;                   // the TMA GEMV reads RunArgs::one_row for every row
  int* next_item;                // or null: RunArgs::item_counter (the TMA GEMV)
  activation::Params act;        // "+act" only
  const float* bias;             // "+act" only: [groups, n] or null
};

template <bool kBF16>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// 16 bytes of weights, read once: kept out of L1.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <bool kBF16>
__device__ __forceinline__ uint16_t to_elem(float v) {
  if constexpr (kBF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
}

// Before a GEMV block reads row_offsets: they come from the kernel before (its PDL wait), or
// are final already (offsets_ready), or once the flag reads non-zero (every thread acquires it
// for its own loads). Every thread calls this.
__device__ __forceinline__ void wait_for_offsets(const GemvParams& p) {
  if (p.offsets_flag != nullptr) {
    if (threadIdx.x == 0)
      while (pipeline::load_acquire(p.offsets_flag) == 0) __nanosleep(32);
    __syncthreads();
    (void)pipeline::load_acquire(p.offsets_flag);
  } else if (!p.offsets_ready) {
    pipeline::pdl_wait();
  }
}

// Entry i (0..3) of lane l's m16n8k16 C fragment for the 16 weight rows from row16 of group g
// and the 8 token rows from c0 of its m0..m0+mg: c0, c1 at (row l/4, token 2(l%4) + {0, 1}),
// c2, c3 at row l/4 + 8. entry_row / entry_token: where entry i lies.
__device__ __forceinline__ int entry_row(int row16, int l, int i) {
  return row16 + (l >> 2) + (i >= 2 ? 8 : 0);
}
__device__ __forceinline__ int entry_token(int c0, int l, int i) {
  return c0 + (l & 3) * 2 + (i & 1);
}
template <bool kBF16>
__device__ __forceinline__ void store_entry(const GemvParams& p, int row16, int c0, int m0, int mg,
                                            int l, int i, float s) {
  const int out_row = entry_row(row16, l, i), tok = entry_token(c0, l, i);
  if (out_row < p.n && tok < mg) p.d[int64_t(m0 + tok) * p.n + out_row] = to_elem<kBF16>(s);
}

// FC1 "+act": with the blocked gate/up row order (activation_math.hpp) the 16 rows are 8 gates
// and their ups, so entries i and i + 2 (i = 0, 1) are a gate and its up; one activation of
// [rows, n / 2] each. store_gated_at: one gated entry, at output row `row`;
// gated_value: the activation of gate row `gate_row` of group g (its bias added), unrounded.
__device__ __forceinline__ float gated_value(const GemvParams& p, int g, int gate_row, float gate,
                                             float up) {
  if (p.bias != nullptr) {
    gate += p.bias[int64_t(g) * p.n + gate_row];
    up += p.bias[int64_t(g) * p.n + gate_row + 8];
  }
  return activation::apply_gated(p.act, gate, up);
}
template <bool kBF16>
__device__ __forceinline__ void store_gated_at(const GemvParams& p, int g, int gate_row,
                                               int64_t row, float gate, float up) {
  p.d[row * (p.n / 2) + (gate_row >> 4) * 8 + (gate_row & 7)] =
      to_elem<kBF16>(gated_value(p, g, gate_row, gate, up));
}
template <bool kBF16>
__device__ __forceinline__ void store_gated(const GemvParams& p, int g, int row16, int c0, int m0,
                                            int mg, int l, int i, float gate, float up) {
  const int gate_row = row16 + (l >> 2);
  const int tok = c0 + (l & 3) * 2 + i;
  if (gate_row >= p.n || tok >= mg) return;
  store_gated_at<kBF16>(p, g, gate_row, m0 + tok, gate, up);
}
// The same on the tokens' own rows (TokenRows): column `tok` is token tok, stored at the row of
// each of its slots that routes to g. The slots come from the kernel before: the caller has
// waited for it.
template <bool kBF16>
__device__ __forceinline__ void store_gated_tokens(const GemvParams& p, const TokenRows& tr, int g,
                                                   int row16, int l, int i, float gate, float up) {
  const int gate_row = row16 + (l >> 2);
  const int tok = (l & 3) * 2 + i;
  if (gate_row >= p.n || tok >= tr.count) return;
  for (int s = tok * tr.top_k; s < (tok + 1) * tr.top_k; ++s)
    if (tr.slot_expert[s] == g) store_gated_at<kBF16>(p, g, gate_row, tr.slot_row[s], gate, up);
}

// The host half of a decode GEMV tactic.
class GemvTacticBase : public Tactic {
 public:
  std::size_t workspace_bytes() const override { return 0; }

 protected:
  // Names the tactic for messages and fills p_ from the shape (and FC1's activation).
  Status setup(const TacticContext& ctx, const std::string& name, bool act) {
    what_ = "tactic " + name + (act ? "+act" : "") + " (groups " +
            std::to_string(ctx.shape.groups) + ", n " + std::to_string(ctx.shape.n) + ", k " +
            std::to_string(ctx.shape.k) + ")";
    if (act) {
      if (ctx.act == nullptr)
        return Status(ErrorCode::kInternal, what_ + ": built without an activation to apply");
      p_.act = ctx.act->params;
      p_.bias = ctx.act->bias;
    }
    p_.groups = ctx.shape.groups;
    p_.n = static_cast<int>(ctx.shape.n);
    p_.k = static_cast<int>(ctx.shape.k);
    return {};
  }

  // Loads `kernel` with `smem` bytes of dynamic shared memory (refused when the device has
  // fewer) and sizes the grid: one block per (live expert, row tile) item, at most as many as
  // fit on the device at once (the kernels are persistent over items).
  Status size_grid(const void* kernel, const TacticContext& ctx, std::size_t smem, int threads) {
    smem_ = smem;
    cudaFuncAttributes attr{};
    cudaError_t err = cudaFuncGetAttributes(&attr, kernel);  // also loads the kernel now
    if (err != cudaSuccess) return cuda_status(err, "cudaFuncGetAttributes", what_);
    int optin = 0;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device);
    if (err != cudaSuccess) return cuda_status(err, "cudaDeviceGetAttribute", what_);
    if (smem_ + attr.sharedSizeBytes > static_cast<std::size_t>(optin))
      return Status(ErrorCode::kUnsupported,
                    what_ + ": " + std::to_string(ctx.shape.groups) +
                        " groups need more shared memory than the device's " +
                        std::to_string(optin) + " bytes");
    const Status raised = moekit::raise_dynamic_smem_limit(kernel, smem_, what_);
    if (!raised.ok()) return raised;
    int per_sm = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_);
    if (err != cudaSuccess)
      return cuda_status(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", what_);
    // At most min(groups, max_rows) groups are non-empty.
    live_max_ = std::min<int64_t>(ctx.shape.groups, ctx.shape.max_rows);
    const int64_t items = live_max_ * p_.row_tiles;
    grid_ = static_cast<int>(std::min<int64_t>(items, int64_t(std::max(per_sm, 1)) * ctx.sm_count));
    return {};
  }

  // The groups this run can have non-empty: fewer than the shape's where RunArgs::rows_bound
  // caps them.
  int64_t live_groups(const RunArgs& a) const {
    return a.rows_bound > 0 ? std::min<int64_t>(live_max_, a.rows_bound) : live_max_;
  }
  // This run's grid: grid_, or fewer blocks for live_groups(a). Blocks without an item cost the
  // T=1 forward (gpt-oss 68.4 us with the grid of a workspace for 16384 tokens, 64.7-65.0 with
  // one for a single token; H200, 2026-12-01).
  int grid_for(const RunArgs& a) const {
    return static_cast<int>(std::min<int64_t>(grid_, live_groups(a) * p_.row_tiles));
  }

  // p_ with this run's pointers.
  GemvParams params(const RunArgs& a) const {
    GemvParams p = p_;
    p.a = static_cast<const uint16_t*>(a.a);
    p.w = static_cast<const uint16_t*>(a.b);
    p.d = static_cast<uint16_t*>(a.d);
    p.row_offsets = a.row_offsets;
    p.offsets_ready = a.offsets_ready || a.offsets_flag != nullptr ? 1 : 0;
    p.offsets_flag = a.offsets_flag;
    p.one_row = a.one_row != nullptr ? 1 : 0;
    p.next_item = a.item_counter;
    return p;
  }

  GemvParams p_{};
  std::size_t smem_ = 0;
  int64_t live_max_ = 0;  // min(groups, max_rows)
  int grid_ = 0;
  std::string what_;
};

}  // namespace moekit::gemm::detail
