// How fast the decode GEMV's way of reading weights can stream a row-major [rows, k] bf16
// matrix from DRAM, without its math: one producer thread copies boxes by TMA into a ring of
// 8 KB stages, four consumer warps wait for each stage, read one word of it and free it
// (sm90_gemv_tma.cu's ring). Each block takes whole row tiles (all of k), as the GEMV's items.
// Variants differ in the stage's shape: 64 rows x 64 k (one 128-byte piece per row: the GEMV's
// box), 16 x 256 or 8 x 512 (4 or 8 boxes side by side: longer runs per row), and the same
// bytes read as contiguous 8 KB boxes; 8 stages at 3 blocks per SM or 12 at 2; the GEMV's box
// without its L2 promotion (or with 256-byte lines: 4.14-4.32 TB/s against
// 4.50-4.55 on an H200, 2026-12-01) or without its swizzle; half the tiles through
// the ring and half by the consumer warps' own plain loads; grids of fewer blocks than slots, as
// the decode GEMVs launch at one token. A plain vectorized read of the same bytes gives the
// machine's read-only stream rate beside them.
// Usage: moekit_tma_stream [k ...] (default 2880 3072 2048 768); about 1 GB per matrix.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tma_probe.hpp"

namespace {

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;
using tma_probe::check;
using tma_probe::kBoxK;
using tma_probe::make_map;
using tma_probe::MapStyle;
using tma_probe::median_us;
constexpr int kStageBytes = 8192;
constexpr int kConsumers = 4;

// Stages of kRows rows x (kBoxes x 64) k; items are kRows-row tiles over all of k. With
// kLdgAhead > 0 (64-row stages only) the ring streams the first half of the tiles and the
// consumer warps the second half themselves, by plain 16-byte loads kLdgAhead steps ahead into
// registers, a step of theirs per ring stage: whether bytes in flight in registers add to the
// ring's.
//
// kGroup > 1: the producer waits until kGroup stages are free and then issues them back to back,
// so that kGroup consecutive 128-byte pieces of each row are asked for together (a DRAM page
// opened once for them) while the stage's layout stays the GEMV's. kActs: every stage also
// copies the 8 token rows of activations for its k (1 KB per 64 k, from a small matrix the L2
// keeps), as the GEMV does; with 16 x 256 stages that is 4 KB per 8 KB of weights, what a layout
// with one consumer warp per stage would load.
template <int kRows, int kBoxes, int kStages, int kPerSm, int kLdgAhead = 0, int kGroup = 1,
          bool kActs = false>
__global__ void __launch_bounds__((kConsumers + 1) * 32, kPerSm)
    tma_stream_kernel(const __grid_constant__ CUtensorMap map,
                      const __grid_constant__ CUtensorMap acts, const uint4* raw, int rows, int k,
                      unsigned* sink) {
  static_assert(kRows * kBoxes * kBoxK * 2 == kStageBytes);
  static_assert(kStages % kGroup == 0);
  constexpr int kActStage = kActs ? 1024 * kBoxes : 0;
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kStages], empty[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  tma_probe::init_ring(full, empty, kConsumers);
  const int tiles = rows / kRows, steps = k / (kBoxes * kBoxK);
  const int ring_tiles = kLdgAhead > 0 ? tiles / 2 : tiles;
  int stage = 0;
  uint32_t phase = 0;
  if (warp == kConsumers) {
    if (lane == 0)
      for (int t = blockIdx.x; t < ring_tiles; t += gridDim.x)
        for (int j = 0; j < steps; ++j) {
          // The group's last stage is freed last (the consumers go in order).
          if (kGroup > 1 && stage % kGroup == 0)
            EmptyBarrier::wait(&empty[stage + kGroup - 1], phase ^ 1);
          EmptyBarrier::wait(&empty[stage], phase ^ 1);
          FullBarrier::arrive_and_expect_tx(&full[stage], kStageBytes + kActStage);
          for (int b = 0; b < kBoxes; ++b)
            cute::SM90_TMA_LOAD_2D::copy(
                &map, &full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST),
                smem + stage * kStageBytes + b * kRows * 128, (j * kBoxes + b) * kBoxK, t * kRows);
          if constexpr (kActs)
            for (int b = 0; b < kBoxes; ++b)
              cute::SM90_TMA_LOAD_2D::copy(
                  &acts, &full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                  smem + kStages * kStageBytes + stage * kActStage + b * 1024,
                  (j * kBoxes + b) * kBoxK, 0);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
    return;
  }
  unsigned acc = 0;
  const auto take_stage = [&] {
    FullBarrier::wait(&full[stage], phase);
    if (lane == 0) acc += reinterpret_cast<const unsigned*>(smem + stage * kStageBytes)[warp];
    cutlass::arch::fence_view_async_shared();
    __syncwarp();
    if (lane == 0) EmptyBarrier::arrive(&empty[stage]);
    if (++stage == kStages) stage = 0, phase ^= 1;
  };
  if constexpr (kLdgAhead == 0) {
    for (int t = blockIdx.x; t < tiles; t += gridDim.x)
      for (int j = 0; j < steps; ++j) take_stage();
  } else {
    static_assert(kRows == 64 && kBoxes == 1, "the plain loads mirror 64 x 64 stages");
    // Thread c loads 64 bytes of row c / 2 per step: 4 x 16 bytes.
    const int row = threadIdx.x / 2, half = threadIdx.x % 2;
    const int64_t pitch = int64_t(k) * 2 / 16;  // uint4 per row
    // This block's ring tiles (blockIdx.x, + gridDim.x, ...), each paired with a tile of ours.
    const int mine = max(0, (ring_tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x));
    const int total = mine * steps;
    const auto load = [&](int i, uint4(&v)[4]) {
      if (i >= total) return;
      const int t2 = ring_tiles + blockIdx.x + (i / steps) * gridDim.x;
      if (t2 >= tiles) return;
      const uint4* q = raw + (int64_t(t2) * 64 + row) * pitch + (i % steps) * 8 + half * 4;
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = __ldcs(q + e);
    };
    uint4 v[kLdgAhead][4];
#pragma unroll
    for (int u = 0; u < kLdgAhead; ++u) load(u, v[u]);
    for (int i0 = 0; i0 < total; i0 += kLdgAhead) {
#pragma unroll
      for (int u = 0; u < kLdgAhead; ++u) {
        if (i0 + u >= total) break;
        take_stage();
        acc ^= v[u][0].x ^ v[u][1].y ^ v[u][2].z ^ v[u][3].w;
        load(i0 + u + kLdgAhead, v[u]);
      }
    }
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the reads
}

__global__ void plain_read_kernel(const uint4* p, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Plain loads in the GEMV's order: a block takes 64-row tiles over all of k; per 64-k step each
// of its 8 warps loads 8 rows x 128 bytes (a lane two 16-byte pieces), kUnroll steps in flight.
template <int kUnroll>
__global__ void __launch_bounds__(256)
    plain_tiles_kernel(const uint4* p, int rows, int k, unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8;                 // 8 lanes x 16 bytes per 128-byte row piece
  const int r = warp * 8 + lane / 8 * 2;      // rows r, r + 1 of the tile
  const int64_t pitch = int64_t(k) * 2 / 16;  // uint4 per row
  const int steps = k / 64;
  unsigned acc = 0;
  for (int t = blockIdx.x; t < rows / 64; t += gridDim.x) {
    const uint4* base = p + (int64_t(t) * 64 + r) * pitch + chunk;
    for (int j = 0; j < steps; j += kUnroll) {
      uint4 v[kUnroll][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (j + u < steps) {
          v[u][0] = __ldcs(base + (j + u) * 8);
          v[u][1] = __ldcs(base + pitch + (j + u) * 8);
        }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (j + u < steps) acc ^= v[u][0].x ^ v[u][1].y;
    }
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Activations for the kActs variants: 8 rows x k, read by every block.
void* g_acts = nullptr;

template <int kRows, int kBoxes, int kStages, int kPerSm, int kLdgAhead = 0, int kGroup = 1,
          bool kActs = false>
void run_variant(const char* name, void* base, int64_t rows, int64_t k, int sms, unsigned* sink,
                 MapStyle style = {}, int blocks = 0) {
  const auto kernel = tma_stream_kernel<kRows, kBoxes, kStages, kPerSm, kLdgAhead, kGroup, kActs>;
  const int smem = kStages * (kStageBytes + (kActs ? 1024 * kBoxes : 0)) + 1024;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attr");
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (kConsumers + 1) * 32, smem),
        "occupancy");
  const CUtensorMap map = make_map(base, rows, k, kRows, style);
  const CUtensorMap acts = make_map(g_acts, 8, k, 8, {});
  const int tiles = int(rows / kRows);
  const int grid = std::min(tiles, blocks > 0 ? blocks : per_sm * sms);
  const double us = median_us([&] {
    kernel<<<grid, (kConsumers + 1) * 32, smem>>>(map, acts, static_cast<const uint4*>(base),
                                                  int(rows), int(k), sink);
  });
  check(cudaGetLastError(), name);
  const double bytes = double(rows) * double(k) * 2;
  std::printf("  %-34s %d/SM  %8.1f us  %5.2f TB/s  (%d blocks, %.1f MB in flight)\n", name, per_sm,
              us, bytes / us * 1e-6, grid, grid * kStages * kStageBytes * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ks;
  for (int i = 1; i < argc; ++i) ks.push_back(std::atoll(argv[i]));
  if (ks.empty()) ks = {2880, 3072, 2048, 768};
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int sms = prop.multiProcessorCount;
  std::printf("# TMA weight stream on %s (%d SMs): medians of 22 runs, ~1 GB each\n", prop.name,
              sms);
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, 4), "malloc");
  check(cudaMalloc(&g_acts, 8 * 32768 * 2), "malloc");
  check(cudaMemset(g_acts, 1, 8 * 32768 * 2), "memset");
  for (int64_t k : ks) {
    if (k % 64 != 0) continue;
    const int64_t rows = (int64_t(1) << 30) / (k * 2) / 64 * 64;
    void* base = nullptr;
    check(cudaMalloc(&base, rows * k * 2), "malloc");
    check(cudaMemset(base, 1, rows * k * 2), "memset");
    std::printf("k %lld (%lld rows, %.2f GB)\n", (long long)k, (long long)rows,
                rows * k * 2 * 1e-9);
    const int64_t vecs = rows * k * 2 / 16;
    const double us = median_us(
        [&] { plain_read_kernel<<<sms * 8, 512>>>(static_cast<const uint4*>(base), vecs, sink); });
    std::printf("  %-34s        %8.1f us  %5.2f TB/s\n", "plain 16-byte loads", us,
                vecs * 16.0 / us * 1e-6);
    const double tiles_us = median_us([&] {
      plain_tiles_kernel<4>
          <<<sms * 8, 256>>>(static_cast<const uint4*>(base), int(rows), int(k), sink);
    });
    std::printf("  %-34s        %8.1f us  %5.2f TB/s\n", "plain loads, 64-row tiles, 4 ahead",
                tiles_us, rows * k * 2.0 / tiles_us * 1e-6);
    run_variant<64, 1, 8, 3>("64 rows x 64 k (the GEMV's box)", base, rows, k, sms, sink);
    run_variant<64, 1, 8, 3, 0, 1, true>("64 x 64 + 1 KB acts (the GEMV's stage)", base, rows, k,
                                         sms, sink);
    run_variant<64, 1, 8, 3, 0, 2, true>("  + issued 2 stages at a time", base, rows, k, sms, sink);
    run_variant<64, 1, 8, 3, 0, 4, true>("  + issued 4 stages at a time", base, rows, k, sms, sink);
    run_variant<64, 1, 8, 3, 0, 4>("64 x 64 issued 4 at a time", base, rows, k, sms, sink);
    run_variant<64, 1, 12, 2>("64 rows x 64 k, 12 stages", base, rows, k, sms, sink);
    // Fewer blocks than slots, as the decode GEMVs at one token (gpt-oss FC1 360 and FC2 180,
    // qwen3 FC1 192, mixtral FC2 128): the stream rate against the bytes in flight.
    for (int blocks : {360, 192, 128})
      run_variant<64, 1, 8, 3>("64 x 64, fewer blocks", base, rows, k, sms, sink, {}, blocks);
    run_variant<64, 1, 12, 2>("12 stages, fewer blocks", base, rows, k, sms, sink, {}, 180);
    run_variant<64, 1, 8, 3, 2>("half ring, half plain 2 ahead", base, rows, k, sms, sink);
    run_variant<64, 1, 8, 3, 4>("half ring, half plain 4 ahead", base, rows, k, sms, sink);
    run_variant<64, 1, 8, 3>("64 x 64, no L2 promotion", base, rows, k, sms, sink,
                             {CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE});
    run_variant<64, 1, 8, 3>("64 x 64, L2 promotion 256 B", base, rows, k, sms, sink,
                             {CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B});
    run_variant<64, 1, 8, 3>("64 x 64, no swizzle", base, rows, k, sms, sink,
                             {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B});
    if (k % 256 == 0) {
      run_variant<16, 4, 8, 3>("16 rows x 256 k", base, rows, k, sms, sink);
      // With their activations (4 KB a stage), at the GEMV's shared memory (72 KB a block) or
      // at 2 blocks per SM.
      run_variant<16, 4, 6, 3, 0, 1, true>("16 x 256 + 4 KB acts, 6 stages", base, rows, k, sms,
                                           sink);
      run_variant<16, 4, 9, 2, 0, 1, true>("16 x 256 + 4 KB acts, 9 st., 2/SM", base, rows, k, sms,
                                           sink);
    }
    if (k % 512 == 0) run_variant<8, 8, 8, 3>("8 rows x 512 k", base, rows, k, sms, sink);
    // The same bytes as [rows * k / 64, 64]: every box 8 KB contiguous.
    run_variant<64, 1, 8, 3>("contiguous 8 KB boxes", base, rows * k / 64, 64, sms, sink);
    check(cudaFree(base), "free");
  }
  return 0;
}
