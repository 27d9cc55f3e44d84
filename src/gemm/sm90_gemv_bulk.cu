// Decode GEMV that streams the hit experts' weights as long contiguous runs ("sm90.gemv.bulk").
//
// Why: with a handful of tokens per expert the layer is bound by reading each hit expert's
// weights once. The register-streaming GEMV (sm90_gemv.cu) keeps too few bytes in flight and
// its loads come and go in bursts (2.4-3 TB/s); the CUTLASS swap-AB pipeline reads 128-row
// tiles of 256 bytes per row and, on FC2 of the big presets, has fewer tiles than SMs. Here one
// producer thread per SM copies whole weight rows (RB rows x k, 16-32 KB, contiguous in memory)
// into a ring of kStages shared-memory stages with single bulk copies (cp.async.bulk completing
// on an mbarrier), so ~160 KB per SM is in flight whatever the consumers do, and DRAM sees long
// sequential runs. An earlier version with one bulk copy per 1 KB row piece was limited by the
// number of copies (bench/NOTES.md): here a stage is one copy.
//
// Work: items are (non-empty expert, block of 16 weight rows); block b takes the contiguous run
// [b * items / grid, (b + 1) * items / grid), so the weights stream in address order. An item is
// streamed once per pass over 8 of its expert's tokens (the rare expert with more rows than that
// re-reads its rows, mostly from L2). Rows longer than a stage are cut along k (then RB = 1).
//
// Consumers: 8 warps. In a stage of RB rows, a warp takes whole rows (RB >= 8) or a k segment
// of one row (RB < 8, 8 / RB warps per row); lanes read consecutive 16-byte vectors of the
// stage (no bank conflicts) and the tokens' matching activations through L1, summing in fp32.
// Partial sums go to shared memory per (k segment, row, token) and are added in a fixed order at
// the end of the item, so results are deterministic. Epilogues: store the 16 rows, or (FC1's
// "+act") add the bias and apply the gated activation to the 8 gate rows and their 8 up rows
// (activation_math.hpp's blocked order) and store 8 activations.
//
// Programmatic dependent launch (pipeline/pdl.cuh): with offsets_ready (FC2 right after FC1)
// the producer reads row_offsets and streams weights before waiting for the previous kernel;
// the consumers wait before they read activations or write outputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "activation/activation_math.hpp"
#include "gemm/live_groups.cuh"
#include "gemm/tactic.hpp"
#include "pipeline/elem8.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::gemm::detail {
namespace {

constexpr int kConsumers = 8;               // consumer warps; the producer warp comes after them
constexpr int kThreads = (kConsumers + 1) * 32;
constexpr int kStages = 6;
constexpr int kStageElems = 16384;          // 32 KB of bf16 / fp16 per stage
constexpr int kItemRows = 16;               // weight rows per item (8 gates + 8 ups for "+act")
constexpr int kTok = 8;                     // tokens per pass
constexpr int kMaxRowsPerWarp = 2;          // RB = 16: two rows per warp

struct BulkParams {
  const uint16_t* a;  // [rows, k]
  const uint16_t* w;  // [groups, n, k]
  uint16_t* d;        // [rows, n], or [rows, n / 2] for "+act"
  const int32_t* row_offsets;
  int groups, n, k;
  int row_blocks;     // ceil(n / 16)
  int stage_rows;     // RB: weight rows per stage (1 when rows are cut along k)
  int stage_k;        // k elements per stage: k, or kStageElems when rows are cut
  int k_stages;       // ceil(k / stage_k)
  int warps_per_row;  // 8 / RB for RB < 8, else 1
  int offsets_ready;
  activation::Params act;  // "+act" only
  const float* bias;       // "+act" only: [groups, n] or null
};

// ---- PTX: mbarrier, bulk copy, named barrier ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
        "selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// Weights are read once: evict them first, so they do not push the activations out of L2.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
}

template <bool kBF16>
__device__ __forceinline__ uint16_t to_elem(float v) {
  if constexpr (kBF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
}

// One item of the block's run, decoded the same way by the producer and the consumers.
struct Item {
  int g, rb, m0, rows_tok, rows_valid, stages;
};
__device__ __forceinline__ Item decode_item(const BulkParams& p, const int* s_active,
                                            int64_t item) {
  Item it;
  it.g = s_active[item / p.row_blocks];
  it.rb = static_cast<int>(item % p.row_blocks);
  it.m0 = p.row_offsets[it.g];
  it.rows_tok = p.row_offsets[it.g + 1] - it.m0;
  it.rows_valid = min(kItemRows, p.n - it.rb * kItemRows);
  it.stages = (it.rows_valid + p.stage_rows - 1) / p.stage_rows * p.k_stages;
  return it;
}

template <bool kBF16, bool kAct>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemv_bulk_kernel(BulkParams p) {
  using T = std::conditional_t<kBF16, __nv_bfloat16, __half>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* stages = reinterpret_cast<uint16_t*>(smem);
  float* s_part = reinterpret_cast<float*>(smem + size_t(kStages) * kStageElems * 2);
  uint64_t* full = reinterpret_cast<uint64_t*>(s_part + kConsumers * kItemRows * kTok);
  uint64_t* empty = full + kStages;
  int* s_active = reinterpret_cast<int*>(empty + kStages);  // [groups]
  __shared__ int s_warp_live[kConsumers + 1];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (!p.offsets_ready) pipeline::pdl_wait();  // row_offsets come from the kernel before
  const int live = compact_live_groups<kConsumers + 1>(p.row_offsets, p.groups, s_active,
                                                       s_warp_live);  // also syncs the inits
  const int64_t items = int64_t(live) * p.row_blocks;
  const int64_t first = items * blockIdx.x / gridDim.x;
  const int64_t last = items * (blockIdx.x + 1) / gridDim.x;
  const int64_t k = p.k;

  if (warp == kConsumers) {  // producer
    if (lane == 0) {
      uint64_t policy;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t item = first; item < last; ++item) {
        const Item it = decode_item(p, s_active, item);
        const uint16_t* rows = p.w + (int64_t(it.g) * p.n + int64_t(it.rb) * kItemRows) * k;
        for (int t0 = 0; t0 < it.rows_tok; t0 += kTok)
          for (int s = 0; s < it.stages; ++s) {
            const int r0 = s / p.k_stages * p.stage_rows;
            const int64_t k0 = int64_t(s % p.k_stages) * p.stage_k;
            const int nr = min(p.stage_rows, it.rows_valid - r0);
            const int64_t len = k - k0 < p.stage_k ? k - k0 : p.stage_k;
            mbar_wait(&empty[stage], phase ^ 1);
            const uint32_t bytes = static_cast<uint32_t>(nr * len * 2);
            mbar_expect_tx(&full[stage], bytes);
            bulk_copy(stages + size_t(stage) * kStageElems, rows + int64_t(r0) * k + k0, bytes,
                      &full[stage], policy);
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1;
            }
          }
      }
    }
    pipeline::pdl_wait();  // only then may the next kernel start (pipeline/pdl.cuh)
    pipeline::pdl_launch_dependents();
    return;
  }

  pipeline::pdl_wait();  // activations come from the kernel before; outputs may be its inputs
  pipeline::pdl_launch_dependents();
  const int rb_rows = p.stage_rows;
  const int wpr = p.warps_per_row;
  const int seg = rb_rows >= 8 ? 0 : warp % wpr;
  const int64_t out_n = kAct ? p.n / 2 : p.n;
  int stage = 0;
  uint32_t phase = 0;
  float acc[kMaxRowsPerWarp][kTok];
  for (int64_t item = first; item < last; ++item) {
    const Item it = decode_item(p, s_active, item);
    for (int t0 = 0; t0 < it.rows_tok; t0 += kTok) {
      const int nt = min(kTok, it.rows_tok - t0);
      const uint16_t* x0 = p.a + int64_t(it.m0 + t0) * k;
      for (int s = 0; s < it.stages; ++s) {
        const int kc = s % p.k_stages;
        const int r0 = s / p.k_stages * rb_rows;
        const int64_t k0 = int64_t(kc) * p.stage_k;
        const int nr = min(rb_rows, it.rows_valid - r0);
        const int len = static_cast<int>(k - k0 < p.stage_k ? k - k0 : p.stage_k);
        const int vecs = len / 8;
        const int per_seg = (vecs + wpr - 1) / wpr;
        const int v_begin = seg * per_seg, v_end = min(vecs, v_begin + per_seg);
        if (kc == 0) {
#pragma unroll
          for (int i = 0; i < kMaxRowsPerWarp; ++i)
#pragma unroll
            for (int t = 0; t < kTok; ++t) acc[i][t] = 0.f;
        }
        mbar_wait(&full[stage], phase);
        const uint16_t* st = stages + size_t(stage) * kStageElems;
#pragma unroll
        for (int i = 0; i < kMaxRowsPerWarp; ++i) {
          const int row = rb_rows >= 8 ? warp + 8 * i : warp / wpr;
          if ((rb_rows < 8 && i > 0) || row >= nr) continue;
          const uint4* wrow = reinterpret_cast<const uint4*>(st + size_t(row) * len);
#pragma unroll 2
          for (int v = v_begin + lane; v < v_end; v += 32) {
            float wf[8];
            pipeline::unpack8<T>(wrow[v], wf);
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
              if (t >= nt) break;
              float xf[8];
              pipeline::unpack8<T>(
                  __ldg(reinterpret_cast<const uint4*>(x0 + int64_t(t) * k + k0) + v), xf);
              float sum = acc[i][t];
#pragma unroll
              for (int e = 0; e < 8; ++e) sum = fmaf(wf[e], xf[e], sum);
              acc[i][t] = sum;
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
        if (kc == p.k_stages - 1) {  // these rows are complete: reduce over the warp
#pragma unroll
          for (int i = 0; i < kMaxRowsPerWarp; ++i) {
            const int row = rb_rows >= 8 ? warp + 8 * i : warp / wpr;
            if ((rb_rows < 8 && i > 0) || row >= nr) continue;
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
              float v = acc[i][t];
#pragma unroll
              for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
              if (lane == 0) s_part[(seg * kItemRows + r0 + row) * kTok + t] = v;
            }
          }
        }
      }
      consumers_sync();
      // Sum the k segments in a fixed order and store.
      if constexpr (kAct) {
        for (int idx = tid; idx < 8 * kTok; idx += kConsumers * 32) {
          const int j = idx % 8, t = idx / 8;
          if (t >= nt || j >= it.rows_valid) continue;
          float gate = 0.f, up = 0.f;
          for (int sg = 0; sg < wpr; ++sg) {
            gate += s_part[(sg * kItemRows + j) * kTok + t];
            up += s_part[(sg * kItemRows + j + 8) * kTok + t];
          }
          const int64_t gate_row = int64_t(it.rb) * kItemRows + j;
          if (p.bias != nullptr) {
            gate += p.bias[int64_t(it.g) * p.n + gate_row];
            up += p.bias[int64_t(it.g) * p.n + gate_row + 8];
          }
          p.d[int64_t(it.m0 + t0 + t) * out_n + int64_t(it.rb) * 8 + j] =
              to_elem<kBF16>(activation::apply_gated(p.act, gate, up));
        }
      } else {
        for (int idx = tid; idx < kItemRows * kTok; idx += kConsumers * 32) {
          const int r = idx % kItemRows, t = idx / kItemRows;
          if (t >= nt || r >= it.rows_valid) continue;
          float sum = 0.f;
          for (int sg = 0; sg < wpr; ++sg) sum += s_part[(sg * kItemRows + r) * kTok + t];
          p.d[int64_t(it.m0 + t0 + t) * out_n + int64_t(it.rb) * kItemRows + r] =
              to_elem<kBF16>(sum);
        }
      }
      consumers_sync();  // s_part is rewritten by the next pass
    }
  }
}

template <bool kBF16, bool kAct>
class GemvBulkTactic final : public Tactic {
 public:
  Status init(const TacticContext& ctx) override {
    what_ = std::string("tactic sm90.gemv.bulk") + (kAct ? "+act" : "") + " (groups " +
            std::to_string(ctx.shape.groups) + ", n " + std::to_string(ctx.shape.n) + ", k " +
            std::to_string(ctx.shape.k) + ")";
    if (kAct) {
      if (ctx.act == nullptr)
        return Status(ErrorCode::kInternal, what_ + ": built without an activation to apply");
      p_.act = ctx.act->params;
      p_.bias = ctx.act->bias;
    }
    p_.groups = ctx.shape.groups;
    p_.n = static_cast<int>(ctx.shape.n);
    p_.k = static_cast<int>(ctx.shape.k);
    p_.row_blocks = static_cast<int>((ctx.shape.n + kItemRows - 1) / kItemRows);
    // Whole rows per stage where they fit (a power of two up to 16), else one row cut along k.
    if (ctx.shape.k <= kStageElems) {
      p_.stage_rows = 1;
      while (p_.stage_rows * 2 <= kItemRows && p_.stage_rows * 2 * ctx.shape.k <= kStageElems)
        p_.stage_rows *= 2;
      p_.stage_k = p_.k;
      p_.k_stages = 1;
    } else {
      p_.stage_rows = 1;
      p_.stage_k = kStageElems;
      p_.k_stages = static_cast<int>((ctx.shape.k + kStageElems - 1) / kStageElems);
    }
    p_.warps_per_row = p_.stage_rows >= 8 ? 1 : 8 / p_.stage_rows;

    auto kernel = grouped_gemv_bulk_kernel<kBF16, kAct>;
    smem_ = size_t(kStages) * kStageElems * 2 + sizeof(float) * kConsumers * kItemRows * kTok +
            sizeof(uint64_t) * 2 * kStages + sizeof(int) * size_t(ctx.shape.groups);
    int optin = 0;
    cudaError_t err =
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device);
    if (err != cudaSuccess) return cuda_status(err, "cudaDeviceGetAttribute", what_);
    cudaFuncAttributes attr{};
    err = cudaFuncGetAttributes(&attr, kernel);  // also loads the kernel now
    if (err != cudaSuccess) return cuda_status(err, "cudaFuncGetAttributes", what_);
    if (smem_ + attr.sharedSizeBytes > static_cast<size_t>(optin))
      return Status(ErrorCode::kUnsupported,
                    what_ + ": " + std::to_string(smem_ + attr.sharedSizeBytes) +
                        " bytes of shared memory exceed the device's " + std::to_string(optin));
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem_));
    if (err != cudaSuccess) return cuda_status(err, "cudaFuncSetAttribute", what_);
    const int64_t live_max = std::min<int64_t>(ctx.shape.groups, ctx.shape.max_rows);
    grid_ = static_cast<int>(std::min<int64_t>(live_max * p_.row_blocks, ctx.sm_count));
    return {};
  }

  Status run(const RunArgs& a) override {
    if (grid_ == 0) return {};
    BulkParams p = p_;
    p.a = static_cast<const uint16_t*>(a.a);
    p.w = static_cast<const uint16_t*>(a.b);
    p.d = static_cast<uint16_t*>(a.d);
    p.row_offsets = a.row_offsets;
    p.offsets_ready = a.offsets_ready ? 1 : 0;
    const cudaError_t err = pipeline::launch_pdl(grouped_gemv_bulk_kernel<kBF16, kAct>, grid_,
                                                 kThreads, smem_, a.stream, p);
    if (err != cudaSuccess) return cuda_status(err, "kernel launch", what_);
    return {};
  }

  std::size_t workspace_bytes() const override { return 0; }

 private:
  BulkParams p_{};
  size_t smem_ = 0;
  int grid_ = 0;
  std::string what_;
};

template <bool kBF16>
std::vector<TacticEntry> bulk_list() {
  std::vector<TacticEntry> v;
  add_store_and_act(
      v, "sm90.gemv.bulk", TacticKind::kGemv,
      []() -> std::unique_ptr<Tactic> { return std::make_unique<GemvBulkTactic<kBF16, false>>(); },
      []() -> std::unique_ptr<Tactic> { return std::make_unique<GemvBulkTactic<kBF16, true>>(); });
  return v;
}

}  // namespace

std::vector<TacticEntry> sm90_gemv_bulk_tactics(Elem elem) {
  return elem == Elem::kBF16 ? bulk_list<true>() : bulk_list<false>();
}

}  // namespace moekit::gemm::detail
