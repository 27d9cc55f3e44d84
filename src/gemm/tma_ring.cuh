// The shared-memory ring of the TMA GEMVs (sm90_gemv_tma.cu: bf16; sm90_fp8_gemv_tma.cu: e4m3):
// per stage a box of kRows weight rows and the 8 token rows of activations it multiplies, each
// row 128 bytes (64 bf16 or 128 e4m3) written by TMA with the 128-byte swizzle; then the stages'
// barriers and the live groups. Consumer warps read it by ldmatrix, 16 weight rows each.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace moekit::gemm::detail::tma_ring {

constexpr int kRowBytes = 128;                  // a box row: one row of the 128-byte swizzle
constexpr int kTokens = 8;                      // token rows per stage: mma.sync's n
constexpr int kActBytes = kTokens * kRowBytes;  // 1 KB, one swizzle period
constexpr std::size_t kRingAlign = 1024;        // the 128-byte swizzle's period

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// A stage's fragments, through the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r &
// 7)). The 8 token rows (b_base: row b_row's start; lane l holds b_row = l & 7, b_chunk = l >> 3):
// b[s] is the B operand of 16-byte k step s of 4 (ldmatrix.x4 twice: matrix j is chunk 4h + j of
// the 8 rows).
__device__ __forceinline__ void load_token_fragments(uint32_t b_base, int b_row, int b_chunk,
                                                     uint32_t (&b)[4][2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    ldmatrix_x4(b_base + (((4 * h + b_chunk) ^ b_row) * 16), b[2 * h][0], b[2 * h][1],
                b[2 * h + 1][0], b[2 * h + 1][1]);
}
// A warp's 16 weight rows at 32-byte k step s (a_base: row a_row's start; a_row and a_chunk as the
// GEMVs set them): the A operand a0..a3 of one mma.sync.
__device__ __forceinline__ void load_weight_fragment(uint32_t a_base, int a_row, int a_chunk, int s,
                                                     uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                                     uint32_t& a3) {
  ldmatrix_x4(a_base + (((s * 2 + a_chunk) ^ (a_row & 7)) * 16), a0, a1, a2, a3);
}

// A consumer warp hands `stage` back to the producer (its `empty` barrier) and moves to the next
// stage of kStages, flipping `phase` on the wrap. The stage's next TMA write (async proxy) must
// follow the warp's ldmatrix reads (generic proxy): the barrier's release alone does not order the
// two proxies (H200, 2026-11-30).
template <int kStages>
__device__ __forceinline__ void release_stage(uint64_t* empty, int lane, int& stage,
                                              uint32_t& phase) {
  cutlass::arch::fence_view_async_shared();
  __syncwarp();
  if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
  if (++stage == kStages) {
    stage = 0;
    phase ^= 1;
  }
}

// Dynamic shared memory of kStages stages of kRows weight rows (one consumer warp per 16, plus
// a producer warp): the weight ring and the activation ring (1024-aligned), the barriers, the
// live groups.
template <int kRows, int kStages>
struct Ring {
  static constexpr int kBoxRows = kRows;
  static constexpr int kStageBytes = kRows * kRowBytes;  // 8 KB of weights at 64 rows
  static constexpr int kConsumers = kRows / 16;
  static constexpr int kWarps = kConsumers + 1;  // + the producer
  static constexpr int kThreads = kWarps * 32;

  uint8_t* weights;  // [kStages][kRows][kRowBytes]
  uint8_t* acts;     // [kStages][kTokens][kRowBytes]
  uint64_t* full;    // [kStages]: the box and its activations have landed
  uint64_t* empty;   // [kStages]: the consumers are done with it
  int* active;       // [groups]

  __device__ __forceinline__ explicit Ring(uint8_t* raw) {
    const uint32_t base = smem_addr(raw);  // the swizzle follows shared-memory addresses
    weights = raw + ((kRingAlign - base % kRingAlign) % kRingAlign);
    acts = weights + kStages * kStageBytes;
    full = reinterpret_cast<uint64_t*>(acts + kStages * kActBytes);
    empty = full + kStages;
    active = reinterpret_cast<int*>(empty + kStages);
  }
  static std::size_t smem_bytes(int groups) {
    return kRingAlign + std::size_t(kStages) * (kStageBytes + kActBytes) +
           2 * kStages * sizeof(uint64_t) + sizeof(int) * static_cast<std::size_t>(groups);
  }
};

}  // namespace moekit::gemm::detail::tma_ring
