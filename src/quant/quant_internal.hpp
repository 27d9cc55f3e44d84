// Pieces shared by the quant stage's files: lookup tables, the portable random numbers and a
// small parallel loop. Not part of any interface outside src/quant.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "moekit/weights.hpp"

namespace moekit::quant::detail {

// Value of every e4m3 code (NaN for 0x7f / 0xff).
const float* e4m3_table();

// ---- Portable random numbers: splitmix64 and a Box-Muller written with basic arithmetic only,
// so the same seed gives the same values with any compiler and C library.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Key of one random stream (a tensor of one expert), from the seed and two labels.
inline uint64_t stream_key(uint64_t seed, uint64_t tag, uint64_t index) {
  return splitmix64(splitmix64(seed ^ (tag * 0xd6e8feb86659fd93ull)) + index);
}
// Element k of a stream: the k-th output of a splitmix64 generator seeded with key, so any
// element can be computed alone (the result never depends on how the work is split).
inline uint64_t stream_bits(uint64_t key, uint64_t k) {
  return splitmix64(key + k * 0x9e3779b97f4a7c15ull);
}
// Uniform in [0, 1) with 53 bits.
inline double to_unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// Fills out[0, n) with standard normal values: element i of the stream `key`.
void normal_fill(uint64_t key, float stddev, float* out, int64_t n);

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads; rethrows the first error.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// A tensor of format q with every buffer sized for [experts, rows, cols] (pre_quant_scale
// included when q asks for it). Throws Error(kInvalidArgument) for impossible shapes.
QuantizedTensor make_empty(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols);
// Draws t.pre_quant_scale in [0.5, 2] for experts whose global ids start at first_expert.
void fill_pre_quant_scale(QuantizedTensor& t, uint64_t seed, int64_t first_expert);
// Encodes expert e of t from w [rows, cols] (the logical weights: the AWQ factor is applied
// here). Buffers come from make_empty; pre_quant_scale must already be filled.
void quantize_expert(QuantizedTensor& t, int64_t e, const float* w, float act_absmax);

}  // namespace moekit::quant::detail
