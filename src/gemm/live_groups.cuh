// The non-empty groups of a grouped GEMM, compacted into shared memory by every block of a
// persistent decode kernel (a few hundred cached ints), so empty experts cost nothing.
#pragma once
#include <cstdint>

namespace moekit::gemm::detail {

// Writes the indices of the groups with rows, in order, to s_active[0, count) and returns count.
// Every thread of the block must call it (it synchronizes the block); s_warp_live holds kWarps.
template <int kWarps>
__device__ __forceinline__ int compact_live_groups(const int32_t* row_offsets, int groups,
                                                   int* s_active, int* s_warp_live) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int live_count = 0;
  for (int g0 = 0; g0 < groups; g0 += kWarps * 32) {
    const int g = g0 + tid;
    const bool live = g < groups && row_offsets[g + 1] > row_offsets[g];
    const unsigned ballot = __ballot_sync(0xffffffffu, live);
    if (lane == 0) s_warp_live[warp] = __popc(ballot);
    __syncthreads();
    int before = live_count;
    for (int w = 0; w < warp; ++w) before += s_warp_live[w];
    if (live) s_active[before + __popc(ballot & ((1u << lane) - 1u))] = g;
    for (int w = 0; w < kWarps; ++w) live_count += s_warp_live[w];
    __syncthreads();
  }
  return live_count;
}

}  // namespace moekit::gemm::detail
