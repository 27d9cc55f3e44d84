// Routing weights applied to the gathered rows (permute.hpp, apply_weights_to_rows): the
// experts' input placement of the weight (RouterWeightPlacement::kInput, Llama-4).
#include <algorithm>

#include "common/cuda_status.hpp"
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

using RowWeightsKernel = void (*)(RowWeightsArgs);

Status pick(DType elem, RowWeightsKernel* out) {
  switch (elem) {
    case DType::kBFloat16:
      *out = row_weights_kernel<__nv_bfloat16>;
      return {};
    case DType::kFloat16:
      *out = row_weights_kernel<__half>;
      return {};
    default:
      return Status(ErrorCode::kUnsupported,
                    std::string("the routing weights on the experts' input take bf16 or fp16 rows, "
                                "not ") +
                        to_string(elem));
  }
}

}  // namespace

Status prepare_apply_weights_to_rows(DType elem) {
  RowWeightsKernel k = nullptr;
  Status s = pick(elem, &k);
  if (!s.ok()) return s;
  cudaFuncAttributes attr;
  return cuda_status(cudaFuncGetAttributes(&attr, k), "loading the row weights kernel");
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
