// FP8 grouped GEMM over experts on the device, with fp32 block scales on both operands:
//   D_g[M_g, n] = sum over 128-deep k blocks kb of
//                 (A_g[:, kb] * W_g[:, kb]^T) * sa_g[:, kb] * sw_g[n / 128, kb]
// A e4m3 [rows, k] row-major, its scales fp32 [rows, k / 128] (one per row and 128 columns);
// W e4m3 [groups, n, k] (nn.Linear layout), its scales fp32 [groups, n / 128, k / 128] (one per
// 128x128 block: DeepSeek-V3's weight_scale_inv as the checkpoint stores it); D bf16 [rows, n],
// or fp32 (Fp8GroupedShape::fp32_out).
// Each k block's products are summed in fp32 by the tensor cores and then added, scaled, into
// fp32 accumulators (CUTLASS's sm90 blockwise-scaled ptr-array kernels), so no error grows with
// k beyond fp32 sums. Row counts live only in device memory (no host sync), so a forward can be
// graph-captured. C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"

namespace moekit::gemm {

struct Fp8GroupedShape {
  int groups = 0;
  int64_t n = 0, k = 0;  // multiples of 128 (the scale blocks)
  int64_t max_rows = 0;  // upper bound of row_offsets[groups]
  // D as fp32 instead of bf16: FC1 with a bias, which the activation adds to the accumulators
  // before their one rounding to bf16, as the reference rounds (a bf16 D rounded twice, and the
  // e4m3 quantization after it turned those 1-ulp differences into 1-2% errors).
  bool fp32_out = false;
};

class Fp8GroupedGemm {
 public:
  // The scale block along n and k.
  static constexpr int64_t kBlock = 128;

  // Allocates, once, every device array it needs (per-group pointers, shapes, scale layouts,
  // CUTLASS workspaces of every tactic). Throws Error: kInvalidArgument or kUnsupported (shape,
  // checked before any CUDA call), kCuda. Ends with a device synchronize: build it outside any
  // graph capture.
  Fp8GroupedGemm(const Fp8GroupedShape& shape, int device);
  ~Fp8GroupedGemm();
  Fp8GroupedGemm(const Fp8GroupedGemm&) = delete;
  Fp8GroupedGemm& operator=(const Fp8GroupedGemm&) = delete;

  // Named tactics ("sm90.fp8.coop.128x128x128.c1x1", "sm90.fp8.swapab.128x32x128.c1x1"; with
  // ".f32" where D is fp32), never numbered.
  std::vector<std::string> tactics() const;
  // The tactic for `rows_per_group_hint` rows per group on average (host-known).
  std::string pick_tactic(double rows_per_group_hint) const;

  struct Call {
    const void* a = nullptr;          // e4m3 [max_rows, k]
    const float* a_scales = nullptr;  // [max_rows, k / 128]
    const void* w = nullptr;          // e4m3 [groups, n, k]
    const float* w_scales = nullptr;  // [groups, n / 128, k / 128]
    void* d = nullptr;                // bf16 (or fp32) [max_rows, n]
    std::string tactic;               // empty: pick_tactic(rows_per_group_hint)
    double rows_per_group_hint = 1.0;
  };
  // Enqueues on `stream` a small kernel that writes each group's shape, pointers and scale
  // layouts from row_offsets (int32 [groups + 1], device; it waits for the kernel before it), then
  // the GEMM. Any row distribution (all rows in one group, empty groups). No allocation, no
  // host sync. Contract: row_offsets non-decreasing, row_offsets[groups] <= max_rows; pointers
  // 16-byte aligned (scales 4-byte); `device` current. One run in flight per object.
  // Errors: kNotFound (tactic), kInvalidArgument (null or misaligned pointer), kCuda.
  Status run(const Call& call, const int32_t* row_offsets, cudaStream_t stream);

  std::size_t workspace_bytes() const;
  const Fp8GroupedShape& shape() const;

  // Host-only shape checks (also on machines without a GPU): ok, or kInvalidArgument /
  // kUnsupported naming the value.
  static Status validate(const Fp8GroupedShape& shape);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace moekit::gemm
