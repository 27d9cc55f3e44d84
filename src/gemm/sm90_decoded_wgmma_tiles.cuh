// The tile table of the decoded-weight wgmma kernel (sm90_decoded_wgmma.cuh): tiles are (expert,
// token tile of N rows, tile of kTileRows weight rows), the row tile fastest; the kernel keeps
// each expert's inclusive tile end in shared memory and finds a tile's expert by binary search.
// Host and device (tests/gemm/decoded_wgmma_host_test.cu walks a table on the host).
#pragma once

namespace moekit::gemm::detail::decoded_wgmma {

constexpr int kTileRows = 256;  // weight rows per tile: 2 consumer warpgroups x 2 m64 tiles

struct Tile {
  int g, t0, n0;
};

// Tile i of the table: its group (the first whose inclusive end passes i), token and row tile.
template <int N>
__host__ __device__ __forceinline__ Tile tile_at(int i, const int* tile_end, int groups,
                                                 int row_tiles) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (tile_end[mid] > i)
      hi = mid;
    else
      lo = mid + 1;
  }
  const int local = i - (lo == 0 ? 0 : tile_end[lo - 1]);
  return Tile{lo, (local / row_tiles) * N, (local % row_tiles) * kTileRows};
}

}  // namespace moekit::gemm::detail::decoded_wgmma
