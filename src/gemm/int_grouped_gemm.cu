// IntGroupedGemm (int_grouped_gemm.hpp): its tactic list (the GEMV of sm90_int_gemv.cu, the
// CUTLASS ones of the sm90_<act>_<int4|int8>_group.cu units), the pick, the checks, and the
// kernel that finishes a CUTLASS tactic's fp32 D where zero points or a bias need it.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_status.hpp"
#include "common/kernel_smem.hpp"
#include "gemm/grouped_checks.hpp"
#include "gemm/int_grouped_gemm.hpp"
#include "gemm/int_tactic.hpp"
#include "pipeline/elem8.cuh"

namespace moekit::gemm {
namespace int_detail {
namespace {

constexpr int kFinishThreads = 256;  // one output column each, in turn
constexpr int kFinishRows = 32;      // rows per tile: one fp32 accumulator each per thread

struct FinishArgs {
  const int32_t* row_offsets;
  const float* d32;    // [rows, n]
  const void* a;       // [rows, k] elem (zero points)
  const float* zeros;  // [groups, k / group, n] or null
  const float* bias;   // [groups, n] or null
  void* out;           // [rows, n] elem
  int groups, n, k, group_size;
  int col_chunk;  // columns per block (gridDim.x blocks split n)
};

// A block per tile of kFinishRows rows (grid-stride over the tiles) and col_chunk columns. With
// zero points the rows' group sums of `a` go to shared memory first ([k / group][kFinishRows]:
// one warp per row, each lane a fixed slice of the group, a fixed shuffle tree), once per tile
// and block: a block spans all n columns wherever the tiles alone fill the GPU, so that `a` is
// read once (16 column blocks per tile had each re-read it, and each thread had loaded every
// zero term once per row: the finish took 510 of mixtral's 1120 us at 64 tokens, H200,
// bench/results/2026-12-07-h200-8e8399d-gemv-ab-tune.md). Then each thread takes a column: its
// rows' fp32 D (and bias) in registers, per run of rows of one group each zero term loaded
// once and added times the rows' sums, in group order; one rounding.
template <class T>
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(FinishArgs f) {
  extern __shared__ __align__(16) float s_sums[];  // [k / group][kFinishRows] (zero points)
  __shared__ int s_group[kFinishRows];
  const int64_t rows_end = f.row_offsets[f.groups];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kg = f.k / f.group_size;
  const int col_begin = blockIdx.x * f.col_chunk;
  const int col_end = min(f.n, col_begin + f.col_chunk);
  const T* a = static_cast<const T*>(f.a);
  T* out = static_cast<T*>(f.out);
  const int64_t tiles = (rows_end + kFinishRows - 1) / kFinishRows;
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t r0 = tile * kFinishRows;
    if (tid < kFinishRows) {
      const int64_t row = r0 + tid;
      int g = -1;
      if (row < rows_end) {  // the last group whose first row is at or before `row`
        int lo = 0, hi = f.groups - 1;
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          if (f.row_offsets[mid] <= row)
            lo = mid;
          else
            hi = mid - 1;
        }
        g = lo;
      }
      s_group[tid] = g;
    }
    if (f.zeros != nullptr) {
      const int per_lane = f.group_size / 32;
      for (int r = warp; r < kFinishRows; r += kFinishThreads / 32) {
        const int64_t row = r0 + r;
        if (row >= rows_end) break;
        const T* x = a + row * f.k + lane * per_lane;
        for (int gi = 0; gi < kg; ++gi) {
          float sum = 0.0f;
          for (int j = 0; j < per_lane; ++j)
            sum += pipeline::elem_to_float(x[int64_t(gi) * f.group_size + j]);
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if (lane == 0) s_sums[gi * kFinishRows + r] = sum;
        }
      }
    }
    __syncthreads();
    const int rows = static_cast<int>(min(int64_t(kFinishRows), rows_end - r0));
    for (int col = col_begin + tid; col < col_end; col += kFinishThreads) {
      float acc[kFinishRows];
#pragma unroll
      for (int r = 0; r < kFinishRows; ++r) acc[r] = r < rows ? f.d32[(r0 + r) * f.n + col] : 0.0f;
      // Runs of rows of one group (the tile's rows are in group order; usually one run).
      for (int rb = 0; rb < rows;) {
        const int g = s_group[rb];
        int re = rb + 1;
        while (re < rows && s_group[re] == g) ++re;
        const float b = f.bias != nullptr ? __ldg(f.bias + int64_t(g) * f.n + col) : 0.0f;
#pragma unroll
        for (int r = 0; r < kFinishRows; ++r)
          if (r >= rb && r < re) acc[r] += b;
        if (f.zeros != nullptr) {
          const float* z = f.zeros + int64_t(g) * kg * f.n + col;
          for (int gi = 0; gi < kg; ++gi) {
            const float zg = __ldg(z + int64_t(gi) * f.n);
            const float4* sums = reinterpret_cast<const float4*>(s_sums + gi * kFinishRows);
#pragma unroll
            for (int q = 0; q < kFinishRows / 4; ++q) {
              const float4 v = sums[q];  // four rows' sums in one load
              const float sv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int r = 4 * q + e;
                if (r >= rb && r < re) acc[r] = fmaf(zg, sv[e], acc[r]);
              }
            }
          }
        }
        rb = re;
      }
#pragma unroll
      for (int r = 0; r < kFinishRows; ++r)
        if (r < rows) out[(r0 + r) * f.n + col] = pipeline::float_to_elem<T>(acc[r]);
    }
    __syncthreads();  // s_group and s_sums are rewritten by the next tile
  }
}

using FinishFn = void (*)(FinishArgs);

FinishFn finish_for(DType elem) {
  return elem == DType::kFloat16 ? finish_kernel<__half> : finish_kernel<__nv_bfloat16>;
}

std::size_t finish_smem(const IntGroupedShape& s) {
  return s.zero_points ? sizeof(float) * kFinishRows * static_cast<std::size_t>(s.k / s.group_size)
                       : 0;
}

}  // namespace

Status prepare_finish_int_gemm(const IntGroupedShape& s) {
  return raise_dynamic_smem_limit(reinterpret_cast<const void*>(finish_for(s.elem)), finish_smem(s),
                                  "the int GEMM finish kernel");
}

Status finish_int_gemm(const IntGroupedShape& s, const int32_t* row_offsets, const float* d32,
                       const void* a, const float* zeros, const float* bias, void* out,
                       int64_t rows_bound, int sm_count, cudaStream_t stream) {
  const int64_t rows = rows_bound > 0 ? std::min(rows_bound, s.max_rows) : s.max_rows;
  if (rows <= 0) return {};
  FinishArgs f{};
  f.row_offsets = row_offsets;
  f.d32 = d32;
  f.a = a;
  f.zeros = zeros;
  f.bias = bias;
  f.out = out;
  f.groups = s.groups;
  f.n = static_cast<int>(s.n);
  f.k = static_cast<int>(s.k);
  f.group_size = s.group_size;
  // Column blocks only where the tiles leave SMs idle (two blocks per SM wanted): each one
  // sums its tile's rows of `a` again.
  const int64_t tiles = (rows + kFinishRows - 1) / kFinishRows;
  const int64_t col_blocks_max = (s.n + kFinishThreads - 1) / kFinishThreads;
  const int64_t col_blocks =
      std::clamp<int64_t>((2 * int64_t(sm_count) + tiles - 1) / tiles, 1, col_blocks_max);
  f.col_chunk = static_cast<int>((col_blocks_max + col_blocks - 1) / col_blocks) * kFinishThreads;
  const dim3 grid(static_cast<unsigned>((s.n + f.col_chunk - 1) / f.col_chunk),
                  static_cast<unsigned>(std::min<int64_t>(tiles, 65535)));
  finish_for(s.elem)<<<grid, kFinishThreads, finish_smem(s), stream>>>(f);
  return cuda_status(cudaGetLastError(), "launching the int GEMM finish kernel");
}

}  // namespace int_detail

namespace {

std::vector<int_detail::IntTacticEntry> cutlass_tactics(const IntGroupedShape& s) {
  const bool fp16 = s.elem == DType::kFloat16;
  if (s.bits == 4)
    return fp16 ? int_detail::sm90_fp16_int4_group_tactics()
                : int_detail::sm90_bf16_int4_group_tactics();
  return fp16 ? int_detail::sm90_fp16_int8_group_tactics()
              : int_detail::sm90_bf16_int8_group_tactics();
}

}  // namespace

struct IntGroupedGemm::State {
  IntGroupedShape shape;
  bool staged = false;  // the CUTLASS tactics store fp32 D for the finish kernel
  int sm_count = 0;     // the finish kernel's grid
  std::vector<std::string> names;
  std::vector<bool> gemv;
  std::vector<std::unique_ptr<int_detail::IntTactic>> tactics;
};

Status IntGroupedGemm::validate(const IntGroupedShape& s) {
  const std::string what = "int grouped GEMM";
  if (Status st = detail::check_grouped_extents(what, s.groups, s.n, s.k, s.max_rows, s.elem);
      !st.ok())
    return st;
  if (s.bits != 4 && s.bits != 8)
    return Status(ErrorCode::kUnsupported,
                  what + " runs 4- or 8-bit codes, not " + std::to_string(s.bits) + "-bit ones");
  if (s.group_size != 64 && s.group_size != 128)
    return Status(ErrorCode::kUnsupported,
                  what + " group size " + std::to_string(s.group_size) +
                      ": CUTLASS's mixed-input mainloop reloads scales per 64-deep k tile, so "
                      "groups of 64 or 128 columns");
  if (s.k % s.group_size != 0)
    return Status(ErrorCode::kUnsupported, what + " k " + std::to_string(s.k) +
                                               " is not a multiple of the group size " +
                                               std::to_string(s.group_size));
  return {};
}

IntGroupedGemm::IntGroupedGemm(const IntGroupedShape& shape, int device)
    : state_(std::make_unique<State>()) {
  throw_if_error(validate(shape));
  state_->shape = shape;
  state_->staged = shape.zero_points || shape.bias;
  DeviceGuard guard(device);
  const int sm_count = detail::require_sm90(device, "the int grouped GEMM");
  state_->sm_count = sm_count;
  std::vector<int_detail::IntTacticEntry> entries = int_detail::sm90_int_gemv_tactics(shape);
  for (auto& e : cutlass_tactics(shape))
    if (e.fp32_out == state_->staged) entries.push_back(std::move(e));
  for (auto& e : entries) {
    std::unique_ptr<int_detail::IntTactic> t = e.make();
    throw_if_error(t->init(shape, device, sm_count));
    state_->names.push_back(e.name);
    state_->gemv.push_back(e.gemv);
    state_->tactics.push_back(std::move(t));
  }
  if (state_->staged) throw_if_error(int_detail::prepare_finish_int_gemm(shape));
  check_cuda(cudaDeviceSynchronize(), "finishing the int grouped GEMM's set-up");
}

IntGroupedGemm::~IntGroupedGemm() = default;

std::vector<std::string> IntGroupedGemm::tactics() const { return state_->names; }

std::string IntGroupedGemm::pick_tactic(double rows_per_group_hint) const {
  // The GEMV (sm90_int_gemv.cu) streams each code once per pass of up to 8 or 16 group rows
  // (one or two MMA column tiles), at a cost per code that does not grow with the rows inside
  // a pass; a group with more rows re-streams its weights per pass. Random routing at 4 rows
  // per group on average puts up to ~12 in one group: the 8-row pass up to 4 on average, the
  // 16-row one up to 8. At 16 rows per group (mixtral, 64 tokens) the 16-row pass took 1.70 ms
  // against 1.11 for the tensor-core GEMM (H200,
  // bench/results/2026-12-07-h200-8e8399d-gemv-ab-tune.md): past 8 rows the 128 x 64 tile, or where
  // built the 128 x 128 one from 128 rows on, moving each code once for 64 or 128 rows. The first
  // name holding `part` of the kind wanted, else the first of that kind.
  const auto& names = state_->names;
  auto first = [&](bool gemv, const std::string& part) -> std::string {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (state_->gemv[i] == gemv && names[i].find(part) != std::string::npos) return names[i];
    for (std::size_t i = 0; i < names.size(); ++i)
      if (state_->gemv[i] == gemv) return names[i];
    return names.front();
  };
  if (rows_per_group_hint <= 8.0)
    return first(true, rows_per_group_hint <= 4.0 ? ".gemv.n8" : ".gemv.n16");
  return first(false, rows_per_group_hint >= 128.0 ? "x128x" : "x64x");
}

Status IntGroupedGemm::run(const Call& c, const int32_t* row_offsets, cudaStream_t stream) {
  const IntGroupedShape& s = state_->shape;
  const std::string tactic = c.tactic.empty() ? pick_tactic(c.rows_per_group_hint) : c.tactic;
  const auto it = std::find(state_->names.begin(), state_->names.end(), tactic);
  if (it == state_->names.end())
    return Status(ErrorCode::kNotFound, "int grouped GEMM tactic \"" + tactic + "\" is not built");
  const std::size_t i = static_cast<std::size_t>(it - state_->names.begin());
  const bool gemv = state_->gemv[i];
  const bool staged = !gemv && state_->staged;
  const Status st_operands = detail::check_operands(
      "int grouped GEMM",
      {{c.a, "A"},
       {c.w, "the weights"},
       {c.scales, "the scales"},
       {c.d, "D"},
       {row_offsets, "row_offsets"},
       {s.zero_points ? static_cast<const void*>(c.zeros) : row_offsets, "the zero terms"},
       {s.bias ? static_cast<const void*>(c.bias) : row_offsets, "the bias"},
       {staged ? static_cast<const void*>(c.staging) : row_offsets, "the fp32 staging"}},
      {c.a, c.w, c.d, c.scales, c.zeros, c.staging});
  if (!st_operands.ok()) return st_operands;
  if (s.max_rows == 0) return {};
  int_detail::IntProblem p;
  p.row_offsets = row_offsets;
  p.a = c.a;
  p.w = static_cast<const uint8_t*>(c.w);
  p.scales = c.scales;
  p.zeros = s.zero_points ? c.zeros : nullptr;
  p.bias = s.bias ? c.bias : nullptr;
  p.d = staged ? static_cast<void*>(c.staging) : c.d;
  p.rows_bound = c.rows_bound;
  Status st = state_->tactics[i]->run(p, stream);
  if (!st.ok() || !staged) return st;
  return int_detail::finish_int_gemm(s, row_offsets, c.staging, c.a, p.zeros, p.bias, c.d,
                                     c.rows_bound, state_->sm_count, stream);
}

std::size_t IntGroupedGemm::staging_bytes() const {
  return state_->staged
             ? sizeof(float) * static_cast<std::size_t>(state_->shape.max_rows * state_->shape.n)
             : 0;
}

std::size_t IntGroupedGemm::workspace_bytes() const {
  std::size_t b = 0;
  for (const auto& t : state_->tactics) b += t->workspace_bytes();
  return b;
}

const IntGroupedShape& IntGroupedGemm::shape() const { return state_->shape; }

}  // namespace moekit::gemm
