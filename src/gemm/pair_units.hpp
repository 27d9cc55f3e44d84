// One expert's units of the 2x1 pair tiles (sm90_cluster_pairs.cuh): which row and column tile
// each block of a cluster computes. Plain C++ so the CPU tests check the order.
#pragma once
#include <cstdint>

#include "common/hd.hpp"

namespace moekit::gemm {

template <int TileM, int TileN>
struct PairUnits {
  int mt, p, s, nt;  // row tiles, pairs of them, the single (0 or 1), column tiles
  MOEKIT_HD PairUnits(int m, int n)
      : mt((m + TileM - 1) / TileM), p(mt / 2), s(mt % 2), nt((n + TileN - 1) / TileN) {}
  MOEKIT_HD int64_t units() const { return int64_t(p) * nt + int64_t(s) * ((nt + 1) / 2); }
  // Block `rank`'s tile (m, n) of unit v (< units()): per column pair, the pairs of its first
  // column, those of its second, then the single. (mt, nt) is the empty tile past the problem
  // that fills a single unit without a second column.
  MOEKIT_HD void tile(int64_t v, int rank, int& m, int& n) const {
    const int per_pair = 2 * p + s;  // units of a column pair with both columns
    const int n2 = static_cast<int>(v / per_pair);
    const int w = static_cast<int>(v - int64_t(n2) * per_pair);
    const int cols = nt - 2 * n2 < 2 ? nt - 2 * n2 : 2;
    if (w < cols * p) {
      n = 2 * n2 + w / p;
      m = 2 * (w % p) + rank;
    } else {
      m = mt - 1;
      n = 2 * n2 + rank;
      if (n >= nt) {
        m = mt;
        n = nt;
      }
    }
  }
  // Whether row tile m loads its weights alone (the single, or the empty tile).
  MOEKIT_HD bool single(int m) const { return m >= 2 * p; }
};

// Whether column tiles `w` wide pad a width of n columns with fewer columns than tiles `wide`
// wide (ties keep the wide tile, whose MMAs do more per instruction).
MOEKIT_HD bool pair_tile_pads_less(int64_t n, int w, int wide) {
  const auto pad = [n](int t) { return (n + t - 1) / t * t - n; };
  return pad(w) < pad(wide);
}

}  // namespace moekit::gemm
