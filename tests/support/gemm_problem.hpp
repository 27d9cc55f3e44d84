// Inputs of one grouped GEMM problem on the host, shared by the grouped GEMM and GEMV tests;
// each test computes its own reference from them. C++17: the *_test.cu files include it.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "gemm/grouped_gemm.hpp"
#include "moekit/types.hpp"
#include "support/gpu.hpp"

namespace moekit::devtest {

inline DType dtype_of(gemm::Elem e) {
  return e == gemm::Elem::kFP16 ? DType::kFloat16 : DType::kBFloat16;
}

// A [max_rows, k], W [groups, n, k] as element bits, rows of group g in [offsets[g],
// offsets[g+1]); `ref` [rows, n] is left to the test.
struct GemmProblem {
  gemm::Elem elem = gemm::Elem::kBF16;
  int groups = 0;
  int64_t n = 0, k = 0, rows = 0, max_rows = 0;
  std::vector<int32_t> offsets;
  std::vector<uint16_t> a_bits, w_bits;
  std::vector<float> ref;
};

// Fresh random inputs in [-1, 1]; `extra_rows` rows past the last group stay allocated, so the
// test sees stray writes.
template <class Rng>
GemmProblem make_gemm_inputs(gemm::Elem elem, int64_t n, int64_t k, const std::vector<int>& counts,
                             Rng& rng, int64_t extra_rows = 3) {
  GemmProblem p;
  p.elem = elem;
  p.groups = static_cast<int>(counts.size());
  p.n = n;
  p.k = k;
  p.offsets.assign(1, 0);
  for (int c : counts) p.offsets.push_back(p.offsets.back() + c);
  p.rows = p.offsets.back();
  p.max_rows = p.rows + extra_rows;
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  p.a_bits.resize(static_cast<std::size_t>(p.max_rows * k));
  p.w_bits.resize(static_cast<std::size_t>(int64_t(p.groups) * n * k));
  fill_bits(p.a_bits, dtype_of(elem), dist, rng);
  fill_bits(p.w_bits, dtype_of(elem), dist, rng);
  return p;
}

}  // namespace moekit::devtest
