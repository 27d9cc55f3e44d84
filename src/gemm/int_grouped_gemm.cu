// IntGroupedGemm (int_grouped_gemm.hpp): its tactic list (the GEMV of sm90_int_gemv.cu, the
// CUTLASS ones of the sm90_<act>_<int4|int8>_group.cu units; for groups of 32 the streaming GEMV
// of sm90_int_stream_gemv.cu), the pick, the checks, and the kernels that finish a CUTLASS
// tactic's fp32 D where zero points or a bias need it.
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

constexpr int kFinishThreads = 256;  // one output column each
constexpr int kFinishRows = 32;      // rows per tile: one fp32 accumulator each per thread
constexpr int kSumWarps = 8;         // rows per block of the group-sum kernel (a warp each)
constexpr int kZeroBatch = 8;        // zero terms loaded at once per thread
constexpr int kSumSteps = 4;         // 16-byte loads in flight per lane (group-sum kernel)

// Rows [0, row_offsets[groups]) of `a` summed per group of columns into sums [rows, k / group]:
// a warp per row, each lane a 16-byte vector of 8 elements per step, the lanes of one group
// (group / 8 of them: 8 or 16) summed by a fixed shuffle tree, kSumSteps loads in flight.
template <class T>
__global__ void __launch_bounds__(kSumWarps * 32)
    group_sums_kernel(const int32_t* row_offsets, int groups, const T* a, int k, int group_size,
                      float* sums) {
  const int64_t rows_end = row_offsets[groups];
  const int lane = threadIdx.x & 31;
  const int lanes_per_group = group_size / 8, kg = k / group_size, vectors = k / 8;
  for (int64_t row = int64_t(blockIdx.x) * kSumWarps + (threadIdx.x >> 5); row < rows_end;
       row += int64_t(gridDim.x) * kSumWarps) {
    const uint4* x = reinterpret_cast<const uint4*>(a + row * k);
    float* out = sums + row * kg;
    for (int base = 0; base < vectors; base += 32 * kSumSteps) {
      uint4 v[kSumSteps];
#pragma unroll
      for (int j = 0; j < kSumSteps; ++j) {
        const int i = base + 32 * j + lane;
        v[j] = i < vectors ? __ldg(x + i) : uint4{0, 0, 0, 0};
      }
#pragma unroll
      for (int j = 0; j < kSumSteps; ++j) {
        float f[8];
        pipeline::unpack8<T>(v[j], f);
        float sum = ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
        for (int o = lanes_per_group / 2; o > 0; o >>= 1)
          sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const int i = base + 32 * j + lane;
        if (i < vectors && lane % lanes_per_group == 0) out[i / lanes_per_group] = sum;
      }
    }
  }
}

struct FinishArgs {
  const int32_t* row_offsets;
  const float* d32;    // [rows, n]
  const float* sums;   // [rows, k / group]: the rows' group sums of `a` (zero points)
  const float* zeros;  // [groups, k / group, n] or null
  const float* bias;   // [groups, n] or null
  void* out;           // [rows, n] elem
  int groups, n, kg;
};

// A block per tile of kFinishRows rows (grid-stride over the tiles) and kFinishThreads columns,
// a column per thread: the tile's group sums (group_sums_kernel) staged in shared memory
// ([k / group][kFinishRows]), the column's fp32 D (and bias) in registers, per run of rows of
// one expert the zero terms loaded kZeroBatch at a time and added times the rows' sums, in
// group order; one rounding. The sums had been taken inside this kernel, a warp's loop of
// dependent loads per row and group: the finish took 3.6 of mixtral's 11.5 ms at 4096 tokens
// and 0.4 of 1.2 at 64 (H100, bench/results/2026-12-07-h100-ec428f1-tests-tune.md).
template <class T>
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(FinishArgs f) {
  extern __shared__ __align__(16) float s_sums[];  // [k / group][kFinishRows] (zero points)
  __shared__ int s_group[kFinishRows];
  const int64_t rows_end = f.row_offsets[f.groups];
  const int tid = threadIdx.x;
  const int col = blockIdx.x * kFinishThreads + tid;
  T* out = static_cast<T*>(f.out);
  const int64_t tiles = (rows_end + kFinishRows - 1) / kFinishRows;
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t r0 = tile * kFinishRows;
    const int rows = static_cast<int>(min(int64_t(kFinishRows), rows_end - r0));
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
    if (f.zeros != nullptr)
      for (int i = tid; i < kFinishRows * f.kg; i += kFinishThreads) {
        const int r = i / f.kg, gi = i - r * f.kg;  // read along the rows' sums, coalesced
        s_sums[gi * kFinishRows + r] = r < rows ? f.sums[(r0 + r) * f.kg + gi] : 0.0f;
      }
    __syncthreads();
    if (col < f.n) {
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
          const float* z = f.zeros + int64_t(g) * f.kg * f.n + col;
          for (int g0 = 0; g0 < f.kg; g0 += kZeroBatch) {
            float zb[kZeroBatch];
#pragma unroll
            for (int j = 0; j < kZeroBatch; ++j)
              zb[j] = g0 + j < f.kg ? __ldg(z + int64_t(g0 + j) * f.n) : 0.0f;
#pragma unroll
            for (int j = 0; j < kZeroBatch; ++j) {
              if (g0 + j >= f.kg) break;
              const float4* sums = reinterpret_cast<const float4*>(s_sums + (g0 + j) * kFinishRows);
#pragma unroll
              for (int q = 0; q < kFinishRows / 4; ++q) {
                const float4 v = sums[q];  // four rows' sums in one load
                const float sv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  const int r = 4 * q + e;
                  if (r >= rb && r < re) acc[r] = fmaf(zb[j], sv[e], acc[r]);
                }
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

// The group sums' place in the staging: after the fp32 D [max_rows, n].
std::size_t sums_offset(const IntGroupedShape& s) {
  return static_cast<std::size_t>(s.max_rows) * static_cast<std::size_t>(s.n);
}

}  // namespace

std::size_t staging_floats(const IntGroupedShape& s) {
  if (!s.zero_points && !s.bias) return 0;
  return sums_offset(s) + (s.zero_points ? static_cast<std::size_t>(s.max_rows) *
                                               static_cast<std::size_t>(s.k / s.group_size)
                                         : 0);
}

Status prepare_finish_int_gemm(const IntGroupedShape& s) {
  Status st = raise_dynamic_smem_limit(reinterpret_cast<const void*>(finish_for(s.elem)),
                                       finish_smem(s), "the int GEMM finish kernel");
  if (st.ok() && s.zero_points) {
    cudaFuncAttributes attr{};
    const void* sums = s.elem == DType::kFloat16
                           ? reinterpret_cast<const void*>(group_sums_kernel<__half>)
                           : reinterpret_cast<const void*>(group_sums_kernel<__nv_bfloat16>);
    st = cuda_status(cudaFuncGetAttributes(&attr, sums), "loading the int GEMM group-sum kernel");
  }
  return st;
}

Status finish_int_gemm(const IntGroupedShape& s, const int32_t* row_offsets, float* staging,
                       const void* a, const float* zeros, const float* bias, void* out,
                       int64_t rows_bound, int sm_count, cudaStream_t stream) {
  const int64_t rows = rows_bound > 0 ? std::min(rows_bound, s.max_rows) : s.max_rows;
  if (rows <= 0) return {};
  FinishArgs f{};
  f.row_offsets = row_offsets;
  f.d32 = staging;
  f.sums = staging + sums_offset(s);
  f.zeros = zeros;
  f.bias = bias;
  f.out = out;
  f.groups = s.groups;
  f.n = static_cast<int>(s.n);
  f.kg = static_cast<int>(s.k / s.group_size);
  if (zeros != nullptr) {
    const int64_t blocks = std::min<int64_t>((rows + kSumWarps - 1) / kSumWarps, 16 * sm_count);
    const int k = static_cast<int>(s.k);
    float* sums = staging + sums_offset(s);
    if (s.elem == DType::kFloat16)
      group_sums_kernel<__half><<<blocks, kSumWarps * 32, 0, stream>>>(
          row_offsets, s.groups, static_cast<const __half*>(a), k, s.group_size, sums);
    else
      group_sums_kernel<__nv_bfloat16><<<blocks, kSumWarps * 32, 0, stream>>>(
          row_offsets, s.groups, static_cast<const __nv_bfloat16*>(a), k, s.group_size, sums);
    if (Status st = cuda_status(cudaGetLastError(), "launching the int GEMM group-sum kernel");
        !st.ok())
      return st;
  }
  const int64_t tiles = (rows + kFinishRows - 1) / kFinishRows;
  const dim3 grid(static_cast<unsigned>((s.n + kFinishThreads - 1) / kFinishThreads),
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
  if (s.group_size != 32 && s.group_size != 64 && s.group_size != 128)
    return Status(ErrorCode::kUnsupported, what + " group size " + std::to_string(s.group_size) +
                                               ": groups of 32, 64 or 128 columns");
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
  // Groups of 32: the streaming GEMV and our wgmma kernel (the tensor-core GEMV sums 64-wide k
  // spans and CUTLASS's mainloop reloads scales per 64-deep k tile).
  const bool by_64 = shape.group_size % 64 == 0;
  state_->staged = by_64 && (shape.zero_points || shape.bias);
  DeviceGuard guard(device);
  const int sm_count = detail::require_sm90(device, "the int grouped GEMM");
  state_->sm_count = sm_count;
  std::vector<int_detail::IntTacticEntry> entries =
      by_64 ? int_detail::sm90_int_gemv_tactics(shape) : int_detail::sm90_int_stream_tactics(shape);
  for (auto& e : int_detail::sm90_int_wgmma_tactics(shape)) entries.push_back(std::move(e));
  if (by_64)
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
  // Groups of 32 have the streaming GEMV (first() falls back to it) and, past 8 rows, our wgmma
  // kernel where built (bf16); groups of 64 and 128 keep CUTLASS there until the two are
  // measured against each other.
  if (rows_per_group_hint <= 8.0)
    return first(true, rows_per_group_hint <= 4.0 ? ".gemv.n8" : ".gemv.n16");
  if (state_->shape.group_size % 64 != 0) {
    const char* want = rows_per_group_hint <= 64.0 ? ".wgmma.n64" : ".wgmma.n128";
    for (const char* part : {want, ".wgmma."})
      for (const std::string& n : names)
        if (n.find(part) != std::string::npos) return n;
    return names.front();
  }
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
  return state_->staged ? sizeof(float) * int_detail::staging_floats(state_->shape) : 0;
}

std::size_t IntGroupedGemm::workspace_bytes() const {
  std::size_t b = 0;
  for (const auto& t : state_->tactics) b += t->workspace_bytes();
  return b;
}

const IntGroupedShape& IntGroupedGemm::shape() const { return state_->shape; }

}  // namespace moekit::gemm
