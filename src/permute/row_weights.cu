// Passes over the gathered rows (permute.hpp): the routing weights of the experts' input
// placement (apply_weights_to_rows, RouterWeightPlacement::kInput, Llama-4), the int group
// formats' AWQ pre-quant scale per column (apply_column_scales) and MXFP8's rounding of the
// activations through e4m3 (round_rows_to_mxfp8).
#include <algorithm>
#include <string>

#include "common/cuda_status.hpp"
#include "common/numeric.hpp"
#include "permute/permute.hpp"
#include "pipeline/elem8.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::permute {
namespace {

constexpr int kWarps = 8;  // per block; one warp per slot

struct RowWeightsArgs {
  const int32_t* slot_row;
  float* weights;
  uint4* rows;
  int64_t slots;     // tokens x k
  int64_t row_vecs;  // 16-byte vectors per row
};

// One warp per slot (grid-stride): row r = slot_row[s] (one slot per row, so no two warps touch
// a row) becomes round(float(row) * weight) and the weight 1. The lanes read the weight before
// the warp barrier, lane 0 writes 1 after it.
template <class T>
__global__ void __launch_bounds__(kWarps * 32) row_weights_kernel(RowWeightsArgs a) {
  // The slots and the rows come from the permute: nothing is read before its end. The next
  // kernel (FC1, or write_problems) may start now; it reads the rows and the weights only after
  // its own wait, which waits for this kernel's end.
  pipeline::pdl_wait();
  pipeline::pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); s < a.slots;
       s += warps) {
    const int32_t r = a.slot_row[s];
    if (r < 0) continue;  // not this rank's expert, or a dropped caller id (the same in every lane)
    const float w = a.weights[s];
    uint4* row = a.rows + static_cast<int64_t>(r) * a.row_vecs;
    for (int64_t v = lane; v < a.row_vecs; v += 32) {
      float x[8];
      pipeline::unpack8<T>(row[v], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] *= w;
      row[v] = pipeline::pack8<T>(x);
    }
    __syncwarp();
    if (lane == 0) a.weights[s] = 1.0f;
  }
}

// The kernel of `elem` (bf16 or fp16 rows), else kUnsupported naming it and `what`.
template <class Kernel>
Status pick_by_elem(DType elem, Kernel bf16, Kernel fp16, const char* what, Kernel* out) {
  switch (elem) {
    case DType::kBFloat16:
      *out = bf16;
      return {};
    case DType::kFloat16:
      *out = fp16;
      return {};
    default:
      return Status(ErrorCode::kUnsupported,
                    std::string(what) + " take bf16 or fp16 rows, not " + to_string(elem));
  }
}

using RowWeightsKernel = void (*)(RowWeightsArgs);

Status pick(DType elem, RowWeightsKernel* out) {
  return pick_by_elem<RowWeightsKernel>(elem, row_weights_kernel<__nv_bfloat16>,
                                        row_weights_kernel<__half>,
                                        "the routing weights on the experts' input", out);
}

struct ColumnScalesArgs {
  const int32_t* rows_end;  // &offsets[L]
  const int32_t* row_expert;
  const float* scales;  // [L, cols]
  uint4* rows;
  int64_t row_vecs;  // 16-byte vectors per row
};

// One thread per 16-byte vector of the filled rows (grid-stride): its 8 elements times their
// columns' scales of the row's expert.
template <class T>
__global__ void __launch_bounds__(256) column_scales_kernel(ColumnScalesArgs a) {
  pipeline::pdl_wait();  // the rows and the offsets come from earlier kernels
  pipeline::pdl_launch_dependents();
  const int64_t n = static_cast<int64_t>(*a.rows_end) * a.row_vecs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / a.row_vecs, v = i - row * a.row_vecs;
    const float* s = a.scales + static_cast<int64_t>(a.row_expert[row]) * a.row_vecs * 8 + 8 * v;
    const float4 s0 = __ldg(reinterpret_cast<const float4*>(s));
    const float4 s1 = __ldg(reinterpret_cast<const float4*>(s) + 1);
    const float f[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    float x[8];
    pipeline::unpack8<T>(a.rows[i], x);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] *= f[j];
    a.rows[i] = pipeline::pack8<T>(x);
  }
}

using ColumnScalesKernel = void (*)(ColumnScalesArgs);

Status pick_column_scales(const ColumnScales& c, ColumnScalesKernel* out) {
  if (c.cols <= 0 || c.cols % 8 != 0)
    return Status(ErrorCode::kUnsupported, "the pre-quant scale's columns " +
                                               std::to_string(c.cols) +
                                               " are not a positive multiple of 8");
  return pick_by_elem<ColumnScalesKernel>(c.elem, column_scales_kernel<__nv_bfloat16>,
                                          column_scales_kernel<__half>,
                                          "the pre-quant scale's products", out);
}

struct Mxfp8Args {
  const int32_t* rows_end;  // &offsets[L]
  uint4* rows;
  int64_t row_vecs;  // 16-byte vectors per row, a multiple of 4
};

// Four threads per 32-column group, a 16-byte vector each (grid-stride): a group's vectors are
// consecutive and start at a multiple of 4, as does the stride, so its four lanes (one quad of
// the warp) take each step together and share the amax by two shuffles.
template <class T>
__global__ void __launch_bounds__(256) mxfp8_rows_kernel(Mxfp8Args a) {
  pipeline::pdl_wait();  // the rows and the offsets come from earlier kernels
  pipeline::pdl_launch_dependents();
  const unsigned quad = 0xfu << (threadIdx.x & 28u);
  const int64_t n = static_cast<int64_t>(*a.rows_end) * a.row_vecs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[8];
    pipeline::unpack8<T>(a.rows[i], x);
    float amax = 0.0f;  // fmaxf skips a NaN, as std::max does in the reference
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
    amax = fmaxf(amax, __shfl_xor_sync(quad, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(quad, amax, 2));
    const float s = numeric::mxfp8_activation_scale_hd(amax);  // the reference's functions
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = numeric::round_through_e4m3_hd(x[j], s);
    a.rows[i] = pipeline::pack8<T>(x);
  }
}

using Mxfp8Kernel = void (*)(Mxfp8Args);

// Loads `k` (before any graph capture); `what` names it in the error.
template <class Kernel>
Status load_kernel(Kernel k, const char* what) {
  cudaFuncAttributes attr;
  return cuda_status(cudaFuncGetAttributes(&attr, k), std::string("loading the ") + what);
}

// Launches a pass of one thread per 16-byte vector (grid-stride, 256 a block) over at most
// max_rows rows of `cols` elements, with programmatic dependent launch.
template <class Kernel, class Args>
Status launch_vector_pass(Kernel k, int64_t max_rows, int64_t cols, const Args& a,
                          cudaStream_t stream, const char* what) {
  if (max_rows <= 0) return {};
  const int64_t vecs = max_rows * (cols / 8);
  const int blocks = static_cast<int>(std::clamp<int64_t>((vecs + 255) / 256, 1, 132 * 16));
  return cuda_status(pipeline::launch_pdl(k, blocks, 256, 0, stream, a),
                     std::string("launching the ") + what);
}

Status pick_mxfp8(const Mxfp8Rows& c, Mxfp8Kernel* out) {
  if (c.cols <= 0 || c.cols % 32 != 0)
    return Status(ErrorCode::kUnsupported, "MXFP8's activation rounding takes columns " +
                                               std::to_string(c.cols) +
                                               ", not a positive multiple of 32");
  return pick_by_elem<Mxfp8Kernel>(c.elem, mxfp8_rows_kernel<__nv_bfloat16>,
                                   mxfp8_rows_kernel<__half>, "MXFP8's activation rounding", out);
}

}  // namespace

Status prepare_round_rows_to_mxfp8(const Mxfp8Rows& c) {
  Mxfp8Kernel k = nullptr;
  const Status s = pick_mxfp8(c, &k);
  return s.ok() ? load_kernel(k, "MXFP8 rounding kernel") : s;
}

Status round_rows_to_mxfp8(const Mxfp8Rows& c, void* rows, int64_t max_rows, cudaStream_t stream) {
  Mxfp8Kernel k = nullptr;
  const Status s = pick_mxfp8(c, &k);
  if (!s.ok()) return s;
  const Mxfp8Args a{c.offsets + c.local_experts, static_cast<uint4*>(rows), c.cols / 8};
  return launch_vector_pass(k, max_rows, c.cols, a, stream, "MXFP8 rounding kernel");
}

Status prepare_apply_column_scales(const ColumnScales& c) {
  ColumnScalesKernel k = nullptr;
  const Status s = pick_column_scales(c, &k);
  return s.ok() ? load_kernel(k, "column scales kernel") : s;
}

Status apply_column_scales(const ColumnScales& c, void* rows, int64_t max_rows,
                           cudaStream_t stream) {
  ColumnScalesKernel k = nullptr;
  const Status s = pick_column_scales(c, &k);
  if (!s.ok()) return s;
  const ColumnScalesArgs a{c.offsets + c.local_experts, c.row_expert, c.scales,
                           static_cast<uint4*>(rows), c.cols / 8};
  return launch_vector_pass(k, max_rows, c.cols, a, stream, "column scales kernel");
}

Status prepare_apply_weights_to_rows(DType elem) {
  RowWeightsKernel k = nullptr;
  const Status s = pick(elem, &k);
  return s.ok() ? load_kernel(k, "row weights kernel") : s;
}

Status apply_weights_to_rows(const Config& c, const Buffers& b, int64_t tokens, DType elem,
                             cudaStream_t stream) {
  if (tokens < 0 || tokens > c.max_tokens)
    return Status(ErrorCode::kInvalidArgument, "tokens " + std::to_string(tokens) +
                                                   " is outside [0, max_tokens " +
                                                   std::to_string(c.max_tokens) + "]");
  if (tokens == 0) return {};
  RowWeightsKernel k = nullptr;
  Status s = pick(elem, &k);
  if (!s.ok()) return s;
  const int64_t slots = tokens * c.top_k();
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((slots + kWarps - 1) / kWarps, 1, 132 * 16));
  RowWeightsArgs a{b.slot_row, b.topk_weights, static_cast<uint4*>(b.permuted), slots,
                   c.row_bytes / 16};
  return cuda_status(pipeline::launch_pdl(k, blocks, kWarps * 32, 0, stream, a),
                     "launching the row weights kernel");
}

}  // namespace moekit::permute
