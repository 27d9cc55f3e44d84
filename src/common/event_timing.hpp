// Times GPU work between two CUDA events, for the benchmarks and the CLI's floors: one loop for
// every binary that measures, so that they all count the same way.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "moekit/status.hpp"

namespace moekit {

// Runs `before` untimed (e.g. an L2 flush), then `body` between two events on `stream`,
// `warmup + reps` times; returns the last `reps` times in microseconds, sorted.
template <class Body, class Before>
std::vector<double> event_times_us(cudaStream_t stream, int warmup, int reps, Body&& body,
                                   Before&& before) {
  const auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw Error(ErrorCode::kCuda, std::string(what) + ": " + cudaGetErrorString(e));
  };
  struct Events {  // destroyed on every way out
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start != nullptr) cudaEventDestroy(start);
      if (stop != nullptr) cudaEventDestroy(stop);
    }
  } ev;
  check(cudaEventCreate(&ev.start), "cudaEventCreate");
  check(cudaEventCreate(&ev.stop), "cudaEventCreate");
  std::vector<double> us;
  for (int i = 0; i < warmup + reps; ++i) {
    before();
    check(cudaEventRecord(ev.start, stream), "cudaEventRecord");
    body();
    check(cudaEventRecord(ev.stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(ev.stop), "the timed work");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime");
    if (i >= warmup) us.push_back(ms * 1e3);
  }
  std::sort(us.begin(), us.end());
  return us;
}

template <class Body>
std::vector<double> event_times_us(cudaStream_t stream, int warmup, int reps, Body&& body) {
  return event_times_us(stream, warmup, reps, body, [] {});
}

// The median of event_times_us (reps > 0).
template <class... Args>
double event_median_us(Args&&... args) {
  const std::vector<double> us = event_times_us(std::forward<Args>(args)...);
  return us[us.size() / 2];
}

}  // namespace moekit
