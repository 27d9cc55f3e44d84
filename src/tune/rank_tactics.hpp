// How `moekit tune` orders the tactics it timed for one GEMM at one token bucket.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace moekit::tune {

struct TacticTime {
  std::string tactic;
  double median_us = 0.0;
};

// A tuning file changes an engine's pick only for a gain above the noise of a forward's median
// (1%): on an H200 one forward measured twice in one tune differed by up to 4.5% when its
// tactics were timed one after another (mixtral T=4096, 4286 against 4482 us), and the file
// that chose by those times made two rows of the bench 1-3% slower
// (bench/results/2026-12-07-h200-8e8399d-gemv-ab-tune.md).
inline constexpr double kKeepBuiltinMargin = 0.01;

// Fastest first, except that `builtin` (the engine's own pick; empty or not among `times`: none)
// stays first unless another tactic is faster by more than `margin` of its time. Ties keep the
// order of `times`.
inline std::vector<TacticTime> rank_tactics(std::vector<TacticTime> times,
                                            const std::string& builtin,
                                            double margin = kKeepBuiltinMargin) {
  std::stable_sort(times.begin(), times.end(), [](const TacticTime& a, const TacticTime& b) {
    return a.median_us < b.median_us;
  });
  const auto it = std::find_if(times.begin(), times.end(),
                               [&](const TacticTime& t) { return t.tactic == builtin; });
  if (it != times.end() && times.front().median_us >= it->median_us * (1.0 - margin))
    std::rotate(times.begin(), it, it + 1);  // the built-in first, the others in their order
  return times;
}

}  // namespace moekit::tune
