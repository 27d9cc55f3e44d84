#include "kernel_trace.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "moekit/status.hpp"

namespace moekit::cli {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * double(v.size() - 1) + 0.5))];
}

ForwardTrace summarize_replays(const std::vector<KernelRecord>& records, int replays) {
  if (replays < 1)
    throw Error(ErrorCode::kInvalidArgument, "trace replays " + std::to_string(replays) + " < 1");
  std::map<std::pair<uint32_t, uint64_t>, std::vector<const KernelRecord*>> by_node;
  for (const KernelRecord& r : records)
    if (r.graph != 0) by_node[{r.graph, r.node}].push_back(&r);
  if (by_node.empty())
    throw Error(ErrorCode::kInvalidArgument, "the trace holds no kernel launched by a graph");
  const auto by_start = [](const KernelRecord* a, const KernelRecord* b) {
    return a->start_ns < b->start_ns;
  };
  // runs[i][j]: replay i's record of node j; a node's i-th record (by start) is replay i's.
  std::vector<std::vector<const KernelRecord*>> runs(replays);
  for (auto& [key, recs] : by_node) {
    if (static_cast<int>(recs.size()) != replays)
      throw Error(ErrorCode::kInvalidArgument,
                  "trace: kernel '" + recs.front()->name + "' (graph node " +
                      std::to_string(key.second) + ") ran " + std::to_string(recs.size()) +
                      " times in " + std::to_string(replays) + " replays");
    std::sort(recs.begin(), recs.end(), by_start);
    for (int i = 0; i < replays; ++i) runs[i].push_back(recs[i]);
  }
  // Node order by start in the first replay; every replay is read in that order.
  std::vector<size_t> order(by_node.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return by_start(runs[0][a], runs[0][b]); });
  ForwardTrace t;
  t.replays = replays;
  std::vector<double> spans;
  std::vector<std::vector<double>> dur(order.size()), gap(order.size());
  for (const auto& run : runs) {
    int64_t first = run[order[0]]->start_ns, last = run[order[0]]->end_ns;
    for (size_t j = 0; j < order.size(); ++j) {
      const KernelRecord* r = run[order[j]];
      dur[j].push_back((r->end_ns - r->start_ns) * 1e-3);
      if (j > 0) gap[j].push_back((r->start_ns - run[order[j - 1]]->end_ns) * 1e-3);
      first = std::min(first, r->start_ns);
      last = std::max(last, r->end_ns);
    }
    spans.push_back((last - first) * 1e-3);
  }
  t.median_span_us = quantile(spans, 0.5);
  for (size_t j = 0; j < order.size(); ++j)
    t.kernels.push_back({runs[0][order[j]]->name, quantile(dur[j], 0.5), quantile(gap[j], 0.5)});
  return t;
}

void print_trace(const ForwardTrace& t) {
  double busy = 0;
  for (const TracedKernel& k : t.kernels) busy += k.median_us;
  std::printf("# trace of %d replays (CUPTI): first start to last end %.1f us, kernels %.1f us\n",
              t.replays, t.median_span_us, busy);
  std::printf("#   %9s %9s  %s\n", "kernel_us", "gap_us", "kernel");
  for (const TracedKernel& k : t.kernels)
    std::printf("#   %9.1f %9.1f  %.90s\n", k.median_us, k.median_gap_us, k.name.c_str());
}

#if !defined(MOEKIT_WITH_CUPTI)
KernelTracer::KernelTracer() {
  throw Error(
      ErrorCode::kUnsupported,
      "--trace needs CUPTI, and this moekit was built without it (CUDA toolkit's libcupti)");
}
KernelTracer::~KernelTracer() = default;
std::vector<KernelRecord> KernelTracer::collect() { return {}; }
#endif

}  // namespace moekit::cli
