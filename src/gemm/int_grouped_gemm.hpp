// W4A16 / W8A16 grouped GEMM over experts on the device: int4 or int8 weights with fp32 group
// scales along k (and optional zero points), bf16 or fp16 activations, fp32 accumulation:
//   D_g[m, n] = round(sum over k of A_g[m, k] * w_g[n, k] + bias_g[n])
//   w_g[n, k] = q'[n, k] * s[k / group, n] + z[k / group, n]   (z = 0 without zero points)
// A bf16/fp16 [rows, k] row-major (each group's rows from row_offsets); the weights in the
// engine's device layout (pipeline/sm90_int_layout.hpp: signed codes [groups, n, k * bits / 8],
// scales and zero terms fp32 [groups, k / group, n]); D bf16/fp16 [rows, n].
// Tactics:
//  - CUTLASS 4.2's Hopper mixed-input ptr-array grouped GEMM (the lineage of its example 69,
//    sm90_mma_array_tma_gmma_rs_warpspecialized_mixed_input.hpp), weights as the converted
//    register operand (swap-AB: D^T column-major is D row-major): each k tile's codes are
//    converted to fp32 in registers, times their scale, rounded to the activation type for the
//    tensor cores, fp32 accumulators. Group sizes that are multiples of its 64-deep k tile.
//    Zero points: CUTLASS 4.2's grouped kernel does not update its scale descriptors per group
//    in its zero-point mode, so the scale-only kernel runs and a second kernel adds
//    sum over groups of z[gi, n] * (sum of A's row over group gi) in fp32, from an fp32 D
//    (Call::staging), before the one rounding; FC1's bias is added there too.
//  - A GEMV for decode (a few rows per group): the group's rows staged in shared memory once,
//    the codes streamed once per 8 or 16 rows and turned into exact bf16/fp16 integers in
//    registers, multiplied with the rows on the tensor cores (mma.sync) in 64-wide k spans
//    summed in fp32, each span's sum times its fp32 scale plus the zero term times the rows'
//    fp32 span sums; bias included; group sizes that are multiples of 64.
//  - Groups of 32 (neither kernel above can apply a scale per 32 columns): the CUDA-core
//    streaming GEMV (sm90_int_stream_gemv.cu), each code decoded to q' * s + zero_term in fp32,
//    bias included; it re-reads an expert's codes once per 8 rows, so past 8 rows per group
//    (bf16 activations, k a multiple of 64) our wgmma kernel (sm90_int_wgmma.cu on
//    sm90_decoded_wgmma.cuh) takes over: each code decoded to the same fp32 weight in
//    registers, rounded once to bf16 for the tensor cores, zero points and bias included. It is
//    built for groups of 64 and 128 too, for the tuner (the pick keeps CUTLASS there).
// Row counts live only in device memory (no host sync), so a forward can be graph-captured.
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::gemm {

struct IntGroupedShape {
  int groups = 0;
  int64_t n = 0, k = 0;           // n a multiple of 8, k of the group size
  int64_t max_rows = 0;           // upper bound of row_offsets[groups]
  DType elem = DType::kBFloat16;  // A and D: kBFloat16 or kFloat16
  int bits = 4;                   // 4 (int4) or 8 (int8)
  int group_size = 128;           // columns per scale: 32, 64 or 128
  bool zero_points = false;       // Call::zeros is read
  bool bias = false;              // Call::bias is read
};

class IntGroupedGemm {
 public:
  // Allocates, once, every device array it needs (per-group pointers, shapes, strides, CUTLASS
  // workspaces of every tactic). Throws Error: kInvalidArgument or kUnsupported (shape, checked
  // before any CUDA call), kCuda. Ends with a device synchronize: build it outside any graph
  // capture.
  IntGroupedGemm(const IntGroupedShape& shape, int device);
  ~IntGroupedGemm();
  IntGroupedGemm(const IntGroupedGemm&) = delete;
  IntGroupedGemm& operator=(const IntGroupedGemm&) = delete;

  // Named tactics ("sm90.int4.gemv.n8", "sm90.int4.gemv.n16", "sm90.int4.coop.128x64x64.c1x1",
  // ...; int8 for 8-bit weights), never numbered.
  std::vector<std::string> tactics() const;
  // The tactic for `rows_per_group_hint` rows per group on average (host-known).
  std::string pick_tactic(double rows_per_group_hint) const;

  struct Call {
    const void* a = nullptr;        // [max_rows, k] elem
    const void* w = nullptr;        // codes [groups, n, k * bits / 8]
    const float* scales = nullptr;  // [groups, k / group, n]
    const float* zeros = nullptr;   // [groups, k / group, n] zero terms (shape.zero_points)
    const float* bias = nullptr;    // [groups, n] (shape.bias)
    void* d = nullptr;              // [max_rows, n] elem
    // fp32, staging_bytes() of it, where that is not 0: the CUTLASS tactics' D [max_rows, n]
    // before the zero-point and bias kernel, and the rows' group sums [max_rows, k / group]
    // with zero points. May be shared with other GEMMs run on the stream.
    float* staging = nullptr;
    std::string tactic;  // empty: pick_tactic(rows_per_group_hint)
    double rows_per_group_hint = 1.0;
    int64_t rows_bound = 0;  // > 0: row_offsets[groups] <= rows_bound (sizes the grids)
  };
  // Enqueues on `stream` the tactic's kernels (no allocation, no host sync). Any row
  // distribution (all rows in one group, empty groups). Contract: row_offsets (int32
  // [groups + 1], device) non-decreasing, row_offsets[groups] <= max_rows; a, w, d 16-byte
  // aligned, the fp32 arrays 16-byte aligned; `device` current. One run in flight per object.
  // Errors: kNotFound (tactic), kInvalidArgument (null or misaligned pointer), kCuda.
  Status run(const Call& call, const int32_t* row_offsets, cudaStream_t stream);

  // Bytes of Call::staging the CUTLASS tactics need (0 where they store D themselves: no zero
  // points and no bias; and for groups of 32, which have no CUTLASS tactic).
  std::size_t staging_bytes() const;
  std::size_t workspace_bytes() const;
  const IntGroupedShape& shape() const;

  // Host-only shape checks (also on machines without a GPU): ok, or kInvalidArgument /
  // kUnsupported naming the value. Group sizes 32, 64 or 128 (32 on the streaming GEMV only).
  static Status validate(const IntGroupedShape& shape);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace moekit::gemm
