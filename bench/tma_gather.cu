// Whether FC1's producer could gather its A rows (the token rows routed to an expert) by TMA,
// one row per box, instead of the scatter kernel writing them out first (qwen3 171 us, deepseek
// 595, gpt-oss 146 at T=16384): stages of 128 rows x 64 k (16 KB, the 128x256 tile's A stage)
// in the 128-byte swizzle, each row a 1 x 64 box at its token's row of hidden [T, H], issued by
// the producer warp's 32 lanes (4 rows each). Four consumer warps wait for each stage, check one
// 16-byte piece of every row against the values its token should have there (a box that the
// swizzle placed elsewhere than a 128-row box would shows as a mismatch), and free it. Items are
// 128-row tiles over all of H, in expert order (random top-k routing).
// Beside it, as FC1 reads today: the same rows already gathered ([T x k, H]), one 128-row box
// per stage.
// Usage: moekit_tma_gather [H ...] (default 2048 2880 7168: qwen3, gpt-oss, deepseek); T = 16384.
#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "tma_probe.hpp"

namespace {

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;
using tma_probe::check;
using tma_probe::kBoxK;
constexpr int kRows = 128;
constexpr int kStageBytes = kRows * kBoxK * 2;  // 16 KB
constexpr int kConsumers = 4;

// The bf16 bits hidden[t][h] holds (a finite value).
__host__ __device__ inline uint16_t value_bits(int t, int h) {
  uint32_t x = uint32_t(t) * 2654435761u ^ uint32_t(h) * 40503u;
  x ^= x >> 13;
  return uint16_t(0x3c00u | (x & 0x03ffu));  // positive, finite
}

__global__ void fill_hidden(uint16_t* hidden, int tokens, int h) {
  const int64_t n = int64_t(tokens) * h;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    hidden[i] = value_bits(int(i / h), int(i % h));
}

__global__ void gather_rows(const uint16_t* hidden, const int* idx, uint16_t* out, int rows,
                            int h) {
  const int64_t n = int64_t(rows) * h;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = hidden[int64_t(idx[i / h]) * h + i % h];
}

// kGather: 128 one-row boxes per stage at idx's rows of `map` (hidden); else one 128-row box
// per stage of `map` (the gathered copy). idx: [tiles * 128] token rows.
template <bool kGather, int kStages>
__global__ void __launch_bounds__((kConsumers + 1) * 32, 1)
    gather_kernel(const __grid_constant__ CUtensorMap map, const int* idx, int tiles, int h,
                  unsigned* mismatches) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + (1024 - reinterpret_cast<uintptr_t>(raw) % 1024) % 1024;
  __shared__ uint64_t full[kStages], empty[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  tma_probe::init_ring(full, empty, kConsumers);
  const int steps = h / kBoxK;
  int stage = 0;
  uint32_t phase = 0;
  if (warp == kConsumers) {  // the producer warp
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int src[4];  // this lane's rows of the tile: lane, lane + 32, ...
      for (int r = 0; r < 4; ++r) src[r] = idx[t * kRows + lane + 32 * r];
      for (int j = 0; j < steps; ++j) {
        if (lane == 0) {
          EmptyBarrier::wait(&empty[stage], phase ^ 1);
          FullBarrier::arrive_and_expect_tx(&full[stage], kStageBytes);
        }
        __syncwarp();  // the stage is free before any lane copies into it
        uint8_t* dst = smem + stage * kStageBytes;
        const uint64_t hint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
        if constexpr (kGather) {
          for (int r = 0; r < 4; ++r) {
            const int row = lane + 32 * r;
            cute::SM90_TMA_LOAD_2D::copy(&map, &full[stage], hint, dst + row * 128, j * kBoxK,
                                         src[r]);
          }
        } else if (lane == 0) {
          cute::SM90_TMA_LOAD_2D::copy(&map, &full[stage], hint, dst, j * kBoxK, t * kRows);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }
  unsigned bad = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int row = warp * 32 + lane;  // each consumer thread checks one row per stage
    const int token = idx[t * kRows + row];
    for (int j = 0; j < steps; ++j) {
      FullBarrier::wait(&full[stage], phase);
      const int chunk = j % 8;  // a different 16-byte piece each step
      const uint4 v = *reinterpret_cast<const uint4*>(smem + stage * kStageBytes + row * 128 +
                                                      ((chunk ^ (row % 8)) * 16));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      for (int e = 0; e < 8; ++e) {
        const uint16_t got = uint16_t(w[e / 2] >> (16 * (e % 2)));
        bad += got != value_bits(token, j * kBoxK + chunk * 8 + e);
      }
      cutlass::arch::fence_view_async_shared();
      __syncwarp();
      if (lane == 0) EmptyBarrier::arrive(&empty[stage]);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

template <bool kGather, int kStages>
void run(const char* name, const CUtensorMap& map, const int* idx, int tiles, int h, int sms,
         unsigned* mismatches) {
  const auto kernel = gather_kernel<kGather, kStages>;
  const int smem = kStages * kStageBytes + 1024;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attr");
  check(cudaMemset(mismatches, 0, 4), "memset");
  const int grid = std::min(tiles, sms);
  const double us = tma_probe::median_us(
      [&] { kernel<<<grid, (kConsumers + 1) * 32, smem>>>(map, idx, tiles, h, mismatches); });
  check(cudaGetLastError(), name);
  unsigned bad = 0;
  check(cudaMemcpy(&bad, mismatches, 4, cudaMemcpyDeviceToHost), "copy");
  const double bytes = double(tiles) * kRows * h * 2;
  std::printf("  %-40s %8.1f us  %5.2f TB/s  %5.1f GB/s per SM  mismatches %u\n", name, us,
              bytes / us * 1e-6, bytes / us * 1e-3 / grid, bad);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> hs;
  for (int i = 1; i < argc; ++i) hs.push_back(std::atoi(argv[i]));
  if (hs.empty()) hs = {2048, 2880, 7168};
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int sms = prop.multiProcessorCount;
  const int tokens = 16384;
  std::printf(
      "# A rows for FC1 by TMA on %s (%d SMs, one block each): gathered one row per box "
      "vs already gathered; medians of 22 runs, T = %d\n",
      prop.name, sms, tokens);
  unsigned* mismatches = nullptr;
  check(cudaMalloc(&mismatches, 4), "malloc");
  std::mt19937 rng(1);
  for (int h : hs) {
    if (h % kBoxK != 0) {
      std::fprintf(stderr, "moekit_tma_gather: H %d is not a multiple of %d\n", h, kBoxK);
      return 2;
    }
    const int experts = h == 7168 ? 256 : 128, top_k = h == 2880 ? 4 : 8;
    // Random top-k routing, rows in expert order (stable), padded to whole tiles with token 0.
    std::vector<std::vector<int>> by_expert(experts);
    std::vector<int> perm(experts);
    for (int t = 0; t < tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int j = 0; j < top_k; ++j) {
        std::swap(perm[j], perm[j + rng() % (experts - j)]);
        by_expert[perm[j]].push_back(t);
      }
    }
    std::vector<int> idx;
    for (const auto& rows : by_expert) idx.insert(idx.end(), rows.begin(), rows.end());
    idx.resize((idx.size() + kRows - 1) / kRows * kRows, 0);
    const int rows = int(idx.size()), tiles = rows / kRows;
    uint16_t *hidden = nullptr, *gathered = nullptr;
    int* d_idx = nullptr;
    check(cudaMalloc(&hidden, size_t(tokens) * h * 2), "malloc hidden");
    check(cudaMalloc(&gathered, size_t(rows) * h * 2), "malloc gathered");
    check(cudaMalloc(&d_idx, idx.size() * 4), "malloc idx");
    check(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), "copy idx");
    fill_hidden<<<sms * 8, 256>>>(hidden, tokens, h);
    gather_rows<<<sms * 8, 256>>>(hidden, d_idx, gathered, rows, h);
    check(cudaDeviceSynchronize(), "fill");
    std::printf("H %d (%d experts, top-%d: %d rows, %.2f GB gathered)\n", h, experts, top_k, rows,
                double(rows) * h * 2 * 1e-9);
    const CUtensorMap by_row = tma_probe::make_map(hidden, tokens, h, 1, {});
    const CUtensorMap by_tile = tma_probe::make_map(gathered, rows, h, kRows, {});
    run<false, 4>("gathered copy, 128-row boxes, 4 stages", by_tile, d_idx, tiles, h, sms,
                  mismatches);
    run<true, 4>("one-row boxes from hidden, 4 stages", by_row, d_idx, tiles, h, sms, mismatches);
    run<false, 8>("gathered copy, 128-row boxes, 8 stages", by_tile, d_idx, tiles, h, sms,
                  mismatches);
    run<true, 8>("one-row boxes from hidden, 8 stages", by_row, d_idx, tiles, h, sms, mismatches);
    check(cudaFree(hidden), "free");
    check(cudaFree(gathered), "free");
    check(cudaFree(d_idx), "free");
  }
  return 0;
}
