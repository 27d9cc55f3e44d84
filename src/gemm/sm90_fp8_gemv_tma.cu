// The FP8 decode GEMV (`sm90.fp8.gemv.tma64`, a tactic of Fp8GroupedGemm): the BF16 TMA GEMV's
// ring (tma_ring.cuh, shared with sm90_gemv_tma.cu) in an e4m3 form. One producer thread copies
// 64-row x 128-k boxes of e4m3 weights (8 KB, 128-byte swizzle: one scale block's k per box) with
// the 8 token rows x 128 k of quantized activations they multiply (1 KB) into a ring of kStages
// shared-memory stages; four consumer warps each multiply 16 of a box's rows by the 8 token rows
// with mma.sync m16n8k32 e4m3 (both operands by ldmatrix: a 128-byte row holds 128 e4m3 as it holds
// 64 bf16, and the e4m3 fragments of a 32-k step are, byte for byte, the bf16 fragments of a 16-k
// step), sum the box's products in fp32 and add them times the weight block's scale and each
// token's scale of that k block: the blockwise math of DeepSeek-V3 and of the CUTLASS tactics, one
// k block at a time. Items are (non-empty expert, 64-row tile), a fixed share per block of a
// persistent grid; an expert with more than 8 rows runs in chunks of 8 that stream its tile again,
// so the pick keeps it to about one row per expert.
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include <algorithm>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_status.hpp"
#include "common/kernel_smem.hpp"
#include "gemm/fp8_tactic.hpp"
#include "gemm/live_groups.cuh"
#include "gemm/tensor_map.hpp"
#include "gemm/tma_ring.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::gemm::fp8_detail {
namespace {

constexpr int kBlock = 128;  // e4m3 per box row: one scale block's k
static_assert(kBlock == gemm::detail::tma_ring::kRowBytes);
constexpr int kRows = 64;  // weight rows per box, 16 per consumer warp
template <int kStages>
using Ring = gemm::detail::tma_ring::Ring<kRows, kStages>;
constexpr int kTokens = gemm::detail::tma_ring::kTokens;  // token rows per chunk: the MMA's n
constexpr int kConsumers = Ring<1>::kConsumers;
constexpr int kWarps = Ring<1>::kWarps;
constexpr int kThreads = Ring<1>::kThreads;
constexpr int kStageBytes = Ring<1>::kStageBytes;             // 8 KB of weights
constexpr int kActBytes = gemm::detail::tma_ring::kActBytes;  // 1 KB of activations

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;
using gemm::detail::tensor_map_encoder;
using gemm::detail::TensorMap2d;
using gemm::detail::tma_ring::smem_addr;

__device__ __forceinline__ void mma_e4m3_16832(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct Params {
  const int32_t* row_offsets;
  const float* a_scales;  // [rows, k / 128]
  const float* w_scales;  // [groups, n / 128, k / 128]
  void* d;                // bf16 or fp32 [rows, n]
  int groups, n, k, row_tiles;
};

// Everything it reads comes from kernels before it (the permute's offsets, the quantized rows
// and their scales), so every thread waits for them first; the prologue (barriers, descriptor
// prefetch) overlaps the kernel before.
template <bool kF32Out, int kStages, int kBlocksPerSm>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    fp8_gemv_tma_kernel(const __grid_constant__ CUtensorMap weights,
                        const __grid_constant__ CUtensorMap acts, Params p) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_warp_live[kWarps];
  const Ring<kStages> sm(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&sm.full[s], 1);
      EmptyBarrier::init(&sm.empty[s], kConsumers);
    }
    cutlass::arch::fence_barrier_init();
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&weights));
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&acts));
  }
  pipeline::pdl_wait();
  pipeline::pdl_launch_dependents();
  // Synchronizes the block: the barriers are initialized from here on.
  const int live =
      detail::compact_live_groups<kWarps>(p.row_offsets, p.groups, sm.active, s_warp_live);
  const int k_boxes = p.k / kBlock;
  const int64_t items = int64_t(live) * p.row_tiles;

  if (warp == kConsumers) {  // the producer warp; one thread issues the copies
    if (lane != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
      const int g = sm.active[item / p.row_tiles];
      const int row = g * p.n + int(item % p.row_tiles) * kRows;
      const int m0 = p.row_offsets[g];
      const int mg = p.row_offsets[g + 1] - m0;
      for (int c0 = 0; c0 < mg; c0 += kTokens)
        for (int kb = 0; kb < k_boxes; ++kb) {
          EmptyBarrier::wait(&sm.empty[stage], phase ^ 1);
          FullBarrier::arrive_and_expect_tx(&sm.full[stage], kStageBytes + kActBytes);
          cute::SM90_TMA_LOAD_2D::copy(&weights, &sm.full[stage],
                                       uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
                                       sm.weights + stage * kStageBytes, kb * kBlock, row);
          cute::SM90_TMA_LOAD_2D::copy(&acts, &sm.full[stage],
                                       uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                       sm.acts + stage * kActBytes, kb * kBlock, m0 + c0);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
    }
    return;
  }

  // A consumer warp. ldmatrix.x4 of a 16 x 32-byte A tile: lanes 8j..8j+7 address matrix j's
  // rows; matrices 0..3 are (rows 0-7, bytes 0-15), (rows 8-15, 0-15), (rows 0-7, 16-31),
  // (rows 8-15, 16-31): a0..a3 of m16n8k32 e4m3. B: matrix j is 16-byte chunk j of all 8 token
  // rows, so lane l gets token l / 4, bytes 4(l % 4).. of each: b0 and b1 of two 32-k steps.
  const int a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_chunk = lane >> 4;
  const int b_row = lane & 7, b_chunk = lane >> 3;
  const int quad = lane & 3,
            group_id = lane >> 2;  // C fragment: rows group_id (+8), tokens 2 quad (+1)
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int g = sm.active[item / p.row_tiles];
    const int row16 = int(item % p.row_tiles) * kRows + warp * 16;  // the expert's row
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    // The warp's 16 rows lie in one 128-row scale block (n is a multiple of 128).
    const float* ws = p.w_scales + (int64_t(g) * (p.n / kBlock) + row16 / kBlock) * k_boxes;
    for (int c0 = 0; c0 < mg; c0 += kTokens) {
      // This lane's two token columns; past mg they are computed, not stored (their scales
      // read at the chunk's last row, which exists).
      const int tok0 = c0 + 2 * quad;
      const float* as0 = p.a_scales + int64_t(m0 + min(tok0, mg - 1)) * k_boxes;
      const float* as1 = p.a_scales + int64_t(m0 + min(tok0 + 1, mg - 1)) * k_boxes;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int kb = 0; kb < k_boxes; ++kb) {
        const float sw = __ldg(ws + kb);
        const float s0 = sw * __ldg(as0 + kb), s1 = sw * __ldg(as1 + kb);
        FullBarrier::wait(&sm.full[stage], phase);
        const uint32_t a_base = smem_addr(sm.weights + stage * kStageBytes) + a_row * 128;
        const uint32_t b_base = smem_addr(sm.acts + stage * kActBytes) + b_row * 128;
        uint32_t b[4][2];
        gemm::detail::tma_ring::load_token_fragments(b_base, b_row, b_chunk, b);
        float box[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t a0, a1, a2, a3;
          gemm::detail::tma_ring::load_weight_fragment(a_base, a_row, a_chunk, s, a0, a1, a2, a3);
          mma_e4m3_16832(box, a0, a1, a2, a3, b[s][0], b[s][1]);
        }
        gemm::detail::tma_ring::release_stage<kStages>(sm.empty, lane, stage, phase);
        acc[0] = fmaf(box[0], s0, acc[0]);
        acc[1] = fmaf(box[1], s1, acc[1]);
        acc[2] = fmaf(box[2], s0, acc[2]);
        acc[3] = fmaf(box[3], s1, acc[3]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int out_row = row16 + group_id + (i >= 2 ? 8 : 0);
        const int tok = tok0 + (i & 1);
        if (out_row >= p.n || tok >= mg) continue;
        const int64_t at = int64_t(m0 + tok) * p.n + out_row;
        if constexpr (kF32Out)
          static_cast<float*>(p.d)[at] = acc[i];
        else
          static_cast<__nv_bfloat16*>(p.d)[at] = __float2bfloat16_rn(acc[i]);
      }
    }
  }
}

template <bool kF32Out, int kStages, int kBlocksPerSm>
class Fp8GemvTmaTactic final : public Fp8Tactic {
  using R = Ring<kStages>;

 public:
  static std::string name() { return std::string("sm90.fp8.gemv.tma64") + (kF32Out ? ".f32" : ""); }

  Status init(const Fp8GroupedShape& s, int /*device*/, int sm_count) override {
    what_ = "fp8 tactic " + name() + " (groups " + std::to_string(s.groups) + ", n " +
            std::to_string(s.n) + ", k " + std::to_string(s.k) + ")";
    // Box rows are int32 coordinates; the activations' map spans max_rows rows.
    if (int64_t(s.groups) * s.n + kRows > INT32_MAX || s.max_rows + kTokens > INT32_MAX)
      return Status(ErrorCode::kUnsupported, what_ + ": groups x n or max_rows exceed int32 rows");
    Status st;
    encode_ = tensor_map_encoder(st);
    if (!st.ok()) return Status(st.code(), what_ + ": " + st.message());
    p_.groups = s.groups;
    p_.n = static_cast<int>(s.n);
    p_.k = static_cast<int>(s.k);
    p_.row_tiles = static_cast<int>(s.n / kRows);  // n is a multiple of 128
    max_rows_ = s.max_rows;
    smem_ = R::smem_bytes(s.groups);
    st = raise_dynamic_smem_limit(reinterpret_cast<const void*>(kernel), smem_, what_);
    if (!st.ok()) return st;
    int per_sm = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_);
    if (err != cudaSuccess)
      return cuda_status(err, what_ + ": cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    grid_ = s.max_rows > 0 ? std::max(per_sm, 1) * sm_count : 0;
    return {};
  }

  Status run(const Fp8Problem& pr, cudaStream_t stream) override {
    if (grid_ == 0) return {};
    Status s = weights_.encode(encode_, pr.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p_.k,
                               int64_t(p_.groups) * p_.n, kBlock, kRows, CU_TENSOR_MAP_SWIZZLE_128B,
                               what_ + ": the weights");
    if (s.ok())
      s = acts_.encode(encode_, pr.a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p_.k, max_rows_, kBlock,
                       kTokens, CU_TENSOR_MAP_SWIZZLE_128B, what_ + ": the activations");
    if (!s.ok()) return s;
    Params p = p_;
    p.row_offsets = pr.row_offsets;
    p.a_scales = pr.a_scales;
    p.w_scales = pr.w_scales;
    p.d = pr.d;
    const cudaError_t err =
        pipeline::launch_pdl(kernel, grid_, kThreads, smem_, stream, weights_.desc, acts_.desc, p);
    if (err != cudaSuccess) return cuda_status(err, what_ + ": kernel launch");
    return {};
  }

  std::size_t workspace_bytes() const override { return 0; }

 private:
  static constexpr auto kernel = fp8_gemv_tma_kernel<kF32Out, kStages, kBlocksPerSm>;

  std::string what_;
  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  Params p_{};
  int64_t max_rows_ = 0;
  std::size_t smem_ = 0;
  int grid_ = 0;
  // e4m3 tensors read in boxes of rows x 128, 128-byte swizzled.
  TensorMap2d weights_, acts_;
};

template <bool kF32Out>
Fp8TacticEntry gemv_entry() {
  using T = Fp8GemvTmaTactic<kF32Out, 8, 3>;  // 72 KB a block, 3 per SM (the BF16 tma64's)
  return Fp8TacticEntry{T::name(), kF32Out,
                        []() -> std::unique_ptr<Fp8Tactic> { return std::make_unique<T>(); }};
}

}  // namespace

std::vector<Fp8TacticEntry> sm90_fp8_gemv_tactics() {
  return {gemv_entry<false>(), gemv_entry<true>()};
}

}  // namespace moekit::gemm::fp8_detail
