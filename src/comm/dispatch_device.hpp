// Expert-parallel dispatch and combine on the device: the kernels that pack token rows for the
// all-to-all by the same plan as the host (dispatch.hpp), scatter the experts' results back to
// their tokens, and lay received rows out per local expert (the masked layout). No host sync, no
// allocation: every entry point enqueues on `stream` and is CUDA-graph capturable.
// C++17: CUDA translation units include this.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit::comm::device {

// One rank's dispatch. Expert e lives on rank e / (num_experts / ep_size) (ExpertPlacement).
struct DispatchShape {
  int64_t tokens = 0;  // this rank's T
  int top_k = 0;
  int num_experts = 0;
  int ep_size = 1;
  int64_t row_bytes = 0;  // bytes of one hidden row (H * element size), even
  // 0: the normal form, rank d's segment right after rank d - 1's (sizes from the counts, the
  // host's DispatchPlan order). > 0: the low-latency form, rank d's segment at d * segment_rows
  // rows, fixed size, with tokens <= segment_rows; its rows past the count get padding ids.
  int64_t segment_rows = 0;
  // The padding rows' ids (segment_rows > 0), always with weight 0.
  enum class PadIds {
    // Experts outside the segment's destination: a receiver running every row computes nothing
    // for them (the low-latency all-to-all).
    kOutsideDestination,
    // Padding row i of the segment gets experts ((pad_origin + i) * top_k + j) mod num_experts:
    // spread over all experts, for the all-gather fallback (ep_size 1, one segment), where every
    // rank runs every gathered row and some rank must compute each padding row.
    kRoundRobin,
  };
  PadIds pad_ids = PadIds::kOutsideDestination;
  int64_t pad_origin = 0;  // kRoundRobin: the segment's first row among all gathered rows
};

// Device arrays, rows = ep_size * max_tokens at most (each token goes to a rank once).
struct DispatchBuffers {
  int32_t* row_of = nullptr;       // [T, ep_size] token t's row in rank d's segment, -1: not sent
  int64_t* send_counts = nullptr;  // [ep_size] rows for each rank
  void* send_rows = nullptr;       // [rows, row_bytes]
  int32_t* send_ids = nullptr;     // [rows, k] the token's global ids (-1 for a dropped slot)
  float* send_weights = nullptr;   // [rows, k] its routing weights (0 for a dropped slot)
  // First bad id since it was last reset to permute::kNoError, in the permute's format
  // ((token * k + slot) << 32 | id, decoded by permute::decode_error).
  unsigned long long* error_word = nullptr;
};

// Counts each token once per destination rank, places it in that rank's segment in token order
// (rank 0's segment first), and copies its row, its k ids and its k weights there: the order of
// plan_dispatch + pack_rows. An id outside [0, num_experts) drops its slot (sent nowhere, id -1
// and weight 0 in every copy of the row) and is recorded in error_word; nothing is written out
// of bounds. Fixed segments (segment_rows > 0): the padding rows of each segment (count ..
// segment_rows) get weight 0 and ids by DispatchShape::pad_ids: kOutsideDestination, experts
// outside the destination's range where there are enough ((d + 1) * E / n + j, modulo E), so
// that a local layer running every row computes nothing for them; kRoundRobin, as that enum
// says. Their hidden rows are left as they are (zero them once at build). kInvalidArgument for
// a bad shape (tokens past segment_rows, more than kMaxDispatchRanks ranks included).
Status pack_dispatch(const DispatchShape& s, const void* hidden, const int32_t* ids,
                     const float* weights, const DispatchBuffers& b, cudaStream_t stream);

// out [T, hidden] (dtype bf16 / fp16) = for each token, the sum in fp32 over ranks d = 0, 1, ...
// of the row that came back from d (returned holds rows in the send layout of the same
// DispatchShape: normal form at the prefix sum of send_counts, low-latency at d * segment_rows),
// rounded once to nearest even: the host combine_rows' order. Tokens sent nowhere get zeros.
// returned_f32: the returned rows are fp32 (the all-gather fallback's reduce-scatter sums, with
// ep_size 1: each token's one row rounded to dtype), else dtype.
Status combine(const DispatchShape& s, DType dtype, const int32_t* row_of,
               const int64_t* send_counts, const void* returned, void* out, cudaStream_t stream,
               bool returned_f32 = false);

// dst[i] = float(src[i]) for i < count; src bf16 / fp16 (else kUnsupported). The all-gather
// fallback widens its experts' results so that the reduce-scatter sums them in fp32.
Status widen_to_f32(DType dtype, const void* src, int64_t count, float* dst, cudaStream_t stream);

// The low-latency form's receive side on rank dest_rank: recv_ids holds ep_size segments of
// segment_rows rows of k global ids (source s's segment at s * segment_rows, recv_counts[s]
// rows valid). Slot (e, j) of local expert e, j < count[e], gets (source rank, row within its
// segment, top-k slot), filled in source-rank order then row order: plan_masked's order (rows
// are in token order). Pairs past `capacity` are counted in *dropped, never written.
struct MaskedDeviceLayout {
  int32_t* slot_rank = nullptr;  // [local_experts, capacity]
  int32_t* slot_row = nullptr;   // [local_experts, capacity]
  int32_t* slot_k = nullptr;     // [local_experts, capacity]
  int64_t* count = nullptr;      // [local_experts]
  int64_t* dropped = nullptr;    // [1]
};
Status build_masked_layout(const DispatchShape& s, int dest_rank, int64_t capacity,
                           const int32_t* recv_ids, const int64_t* recv_counts,
                           const MaskedDeviceLayout& out, cudaStream_t stream);

}  // namespace moekit::comm::device
