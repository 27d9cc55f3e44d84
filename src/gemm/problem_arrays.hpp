// The per-group arrays a CUTLASS grouped GEMM reads (problem shape, operand and output
// pointers), written on the device from the expert row offsets once those exist: by
// GroupedGemm's write_problems kernel, or by the kernel that computes the offsets (the
// single-block permute: one kernel less before FC1 at decode sizes). C++17; the writer is a
// device function for CUDA translation units.
#pragma once
#include <cstdint>

namespace moekit::gemm {

// Device arrays owned by GroupedGemm, sized for its groups; read by the CUTLASS kernels. Their
// addresses never change, so CUTLASS arguments are built once.
struct DeviceArrays {
  int32_t* shapes = nullptr;      // [groups][3]: (M, N, K) of CUTLASS's GroupProblemShape
  const void** ptr_a = nullptr;   // [groups]
  const void** ptr_b = nullptr;   // [groups]
  void** ptr_d = nullptr;         // [groups]
};

// One GEMM's arrays to write: group g's rows are [row_offsets[g], row_offsets[g + 1]).
struct ProblemJob {
  int groups = 0;
  int n = 0, k = 0;
  bool swap_ab = false;  // problem (n, M_g, k) with the weights as A
  int64_t d_ld = 0;      // elements per output row: n, or n / 2 behind the fused activation
  const char* a = nullptr;  // activations [rows, k]
  const char* b = nullptr;  // weights [groups, n, k]
  char* d = nullptr;        // output [rows, d_ld]
  DeviceArrays arrays;
};

// The GEMMs whose arrays one kernel writes (a layer's FC1 and FC2 share the offsets).
struct ProblemBatch {
  static constexpr int kMaxJobs = 2;
  ProblemJob jobs[kMaxJobs];
  int count = 0;
};

#ifdef __CUDACC__
// Group g of job p, whose rows start at row0 and number m.
__device__ __forceinline__ void write_problem(const ProblemJob& p, int g, int64_t row0, int m) {
  constexpr int kElemBytes = 2;  // bf16 and fp16
  const char* act = p.a + row0 * p.k * kElemBytes;
  const char* w = p.b + int64_t(g) * p.n * p.k * kElemBytes;
  int32_t* s = p.arrays.shapes + 3 * g;
  s[0] = p.swap_ab ? p.n : m;
  s[1] = p.swap_ab ? m : p.n;
  s[2] = p.k;
  p.arrays.ptr_a[g] = p.swap_ab ? w : act;
  p.arrays.ptr_b[g] = p.swap_ab ? act : w;
  p.arrays.ptr_d[g] = p.d + row0 * p.d_ld * kElemBytes;
}
#endif

}  // namespace moekit::gemm
