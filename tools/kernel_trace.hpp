// Per-kernel timing of a forward inside its CUDA graph replays (`moekit bench --trace N`). ncu
// runs kernels one at a time with caches flushed, so its durations leave out what happens
// between and across kernels in a real replay (PDL overlap, launch gaps, clocks under load);
// this records the replays themselves through CUPTI's activity API.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moekit::cli {

// The q-quantile of samples (q = 0.5: the median), nearest rank; used by the bench and the trace.
double quantile(std::vector<double> v, double q);

struct KernelRecord {
  std::string name;    // demangled
  uint32_t graph = 0;  // CUDA graph id, 0 for a kernel launched outside a graph
  uint64_t node = 0;   // graph node id
  int64_t start_ns = 0, end_ns = 0;
};

// One kernel of the forward, medians over the replays: its duration, and its start minus the
// end of the kernel before it in the same replay (negative: they overlapped).
struct TracedKernel {
  std::string name;
  double median_us = 0, median_gap_us = 0;
};
struct ForwardTrace {
  int replays = 0;
  double median_span_us = 0;          // first kernel's start to last kernel's end
  std::vector<TracedKernel> kernels;  // in order of start
};

// The kernels launched by graphs in `records` (others, such as the L2 flush, are left out),
// taken as `replays` replays of one graph: each node must appear exactly `replays` times.
// Error(kInvalidArgument) says which node does not.
ForwardTrace summarize_replays(const std::vector<KernelRecord>& records, int replays);

// Prints the trace as a table under one "# trace" header line.
void print_trace(const ForwardTrace& t);

// Records every kernel from construction until collect(). Error(kUnsupported) where moekit was
// built without CUPTI, Error(kCuda) with CUPTI's reason where it cannot start.
class KernelTracer {
 public:
  KernelTracer();
  ~KernelTracer();
  KernelTracer(const KernelTracer&) = delete;
  KernelTracer& operator=(const KernelTracer&) = delete;
  // Waits for the device, then returns the records so far.
  std::vector<KernelRecord> collect();
};

}  // namespace moekit::cli
