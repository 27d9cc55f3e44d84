// The FP8 engines' gather (permute.hpp, gather_quantized): each slot's hidden row, read from the
// caller's matrix, quantized to e4m3 with one fp32 scale per 128 columns and written at the
// slot's permuted row. A warp per item (a slot's row, or a chunk of it); each lane holds 4 of a
// group's 128 columns.
#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/cuda_status.hpp"
#include "permute/permute.hpp"
#include "pipeline/fp8_quantize.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::permute {
namespace {

constexpr int kWarps = 8;        // per block
constexpr int kChunkGroups = 8;  // 128-column groups a warp takes at once

struct QuantizeArgs {
  const __nv_bfloat16* hidden;  // [tokens, H]
  const int32_t* slot_row;
  const int32_t* slot_expert;
  float* weights;             // [tokens, k]: multiplied in and set to 1 where on_input
  const float* static_scale;  // [L] or null
  uint8_t* values;            // [P, H]
  float* scales;              // [P, H / 128]
  int64_t slots;              // tokens x k
  int top_k;
  int64_t hidden_size;
  bool on_input;
  bool per_token;  // one dynamic scale for the whole row (static_scale null)
};

// Work items: a slot's row in chunks of kChunkGroups groups, a warp each, so that a few tokens
// spread over many warps; the per-token scale (an amax over the whole row first) and the
// weight on the input (set to 1 once read) keep a slot's row in one item. A lane loads its
// values of a chunk's groups at once, then quantizes them: a loop of one group a step, each
// waiting on its load, took 14 us for qwen3's one token (16 groups) and 42 us for deepseek's
// (56) on an H100 (bench/results/2026-12-07-h100-ec428f1-tests-tune.md).
__global__ void __launch_bounds__(kWarps * 32) quantize_rows_kernel(QuantizeArgs a) {
  // The slots come from the permute: nothing is read before its end.
  pipeline::pdl_wait();
  pipeline::pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t groups = a.hidden_size / pipeline::kFp8Group;
  const bool whole_rows = a.per_token || a.on_input;
  const int64_t chunks = whole_rows ? 1 : (groups + kChunkGroups - 1) / kChunkGroups;
  const int64_t items = a.slots * chunks;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); item < items;
       item += warps) {
    const int64_t s = item / chunks;
    const int32_t r = a.slot_row[s];
    if (r < 0) continue;  // not this rank's expert, or a dropped caller id (the same in every lane)
    const int64_t g_begin = (item - s * chunks) * kChunkGroups;
    const int64_t g_end = whole_rows ? groups : std::min(groups, g_begin + kChunkGroups);
    const __nv_bfloat16* src = a.hidden + (s / a.top_k) * a.hidden_size;
    const float w = a.on_input ? a.weights[s] : 1.0f;
    const float fixed = a.static_scale ? a.static_scale[a.slot_expert[s]] : 0.0f;
    uint8_t* dst = a.values + static_cast<int64_t>(r) * a.hidden_size;
    float* dst_scales = a.scales + static_cast<int64_t>(r) * groups;
    // This lane's 4 values of up to kChunkGroups groups from g0, as the experts see them.
    auto load = [&](int64_t g0, float(&x)[kChunkGroups][4]) {
      uint2 raw[kChunkGroups];
#pragma unroll
      for (int j = 0; j < kChunkGroups; ++j)
        raw[j] =
            g0 + j < g_end
                ? *reinterpret_cast<const uint2*>(src + (g0 + j) * pipeline::kFp8Group + 4 * lane)
                : uint2{0, 0};
#pragma unroll
      for (int j = 0; j < kChunkGroups; ++j) {
        pipeline::unpack4_bf16(raw[j], x[j]);
        if (a.on_input) {  // Llama-4: the row times its weight, rounded to bf16 as the reference
#pragma unroll
          for (int i = 0; i < 4; ++i) x[j][i] = __bfloat162float(__float2bfloat16_rn(x[j][i] * w));
        }
      }
    };
    float scale = fixed;
    if (a.per_token) {  // a first pass for the row's amax (the row then sits in L1)
      float amax = 0.0f;
      for (int64_t g0 = g_begin; g0 < g_end; g0 += kChunkGroups) {
        float x[kChunkGroups][4];
        load(g0, x);
#pragma unroll
        for (int j = 0; j < kChunkGroups; ++j)
          if (g0 + j < g_end) amax = fmaxf(amax, pipeline::warp_amax4(x[j]));
      }
      scale = pipeline::token_scale(amax);
    }
    for (int64_t g0 = g_begin; g0 < g_end; g0 += kChunkGroups) {
      float x[kChunkGroups][4];
      load(g0, x);
#pragma unroll
      for (int j = 0; j < kChunkGroups; ++j) {
        const int64_t g = g0 + j;
        if (g >= g_end) break;
        const float sc =
            pipeline::quantize_group4(x[j], scale, dst + g * pipeline::kFp8Group + 4 * lane);
        if (lane == 0) dst_scales[g] = sc;
      }
    }
    if (a.on_input) {
      __syncwarp();  // every lane has read the weight
      if (lane == 0) a.weights[s] = 1.0f;
    }
  }
}

}  // namespace

Status prepare_gather_quantized() {
  cudaFuncAttributes attr;
  return cuda_status(cudaFuncGetAttributes(&attr, quantize_rows_kernel),
                     "loading the quantizing gather kernel");
}

Status gather_quantized(const Config& c, const Buffers& b, int64_t tokens, const void* hidden,
                        const QuantizedRows& out, cudaStream_t stream) {
  if (tokens < 0 || tokens > c.max_tokens)
    return Status(ErrorCode::kInvalidArgument, "tokens " + std::to_string(tokens) +
                                                   " is outside [0, max_tokens " +
                                                   std::to_string(c.max_tokens) + "]");
  const int64_t H = c.row_bytes / 2;  // bf16 rows
  if (H % pipeline::kFp8Group != 0)
    return Status(ErrorCode::kUnsupported, "the quantizing gather needs hidden " +
                                               std::to_string(H) + " a multiple of " +
                                               std::to_string(pipeline::kFp8Group));
  if (hidden == nullptr || out.values == nullptr || out.scales == nullptr)
    return Status(ErrorCode::kInvalidArgument, "the quantizing gather got a null pointer");
  if (tokens == 0) return {};
  QuantizeArgs a{};
  a.hidden = static_cast<const __nv_bfloat16*>(hidden);
  a.slot_row = b.slot_row;
  a.slot_expert = b.slot_expert;
  a.weights = b.topk_weights;
  a.static_scale = out.static_scale;
  a.values = static_cast<uint8_t*>(out.values);
  a.scales = out.scales;
  a.slots = tokens * c.top_k();
  a.top_k = c.top_k();
  a.hidden_size = H;
  a.on_input = out.weight_on_input;
  a.per_token = out.per_token && out.static_scale == nullptr;
  const int64_t groups = H / pipeline::kFp8Group;
  const int64_t items =
      a.slots * (a.per_token || a.on_input ? 1 : (groups + kChunkGroups - 1) / kChunkGroups);
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((items + kWarps - 1) / kWarps, 1, 132 * 32));
  return cuda_status(pipeline::launch_pdl(quantize_rows_kernel, blocks, kWarps * 32, 0, stream, a),
                     "launching the quantizing gather kernel");
}

}  // namespace moekit::permute
