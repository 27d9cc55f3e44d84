// Expert-parallel dispatch and combine as index plans on the host: which token rows go to which
// rank (each row once per rank, whatever number of its top-k experts that rank holds), where the
// results come back to, and the masked fixed-capacity layout of the low-latency form. The
// device kernels that pack rows by these plans are separate (GPU work, not here).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/status.hpp"

namespace moekit::comm {

// The most ranks the device dispatch kernels take (dispatch_kernels.cu): their shared memory
// holds 16 bytes per rank (segment bases, a token's rows), within the 48 KiB every launch gets.
inline constexpr int kMaxDispatchRanks = 2048;

// Expert e lives on rank e / (num_experts / ep_size): derive_local's contiguous split.
struct ExpertPlacement {
  int64_t num_experts = 0;
  int ep_size = 1;
  int64_t experts_per_rank() const { return num_experts / ep_size; }
  int rank_of(int64_t expert) const { return static_cast<int>(expert / experts_per_rank()); }
};

// One rank's all-to-all plan. rows_to[d] lists the local tokens sent to rank d, ascending, each
// once; send_counts[d] == rows_to[d].size(). The results come back in the same order, so the
// combine reads rows_to again.
struct DispatchPlan {
  std::vector<std::vector<int64_t>> rows_to;
  std::vector<int64_t> send_counts;
  int64_t total_rows() const;
};

// ids [tokens, top_k] are global expert ids. An id outside [0, num_experts) is
// kInvalidArgument naming the token, slot and value (nothing is planned).
Status plan_dispatch(const ExpertPlacement& placement, int64_t tokens, int64_t top_k,
                     const int32_t* ids, DispatchPlan* plan);

// Copies the rows of src ([tokens, row_bytes]) into send in plan order (rank 0's rows first).
void pack_rows(const DispatchPlan& plan, const void* src, int64_t row_bytes, void* send);

// out[tokens, hidden] = the sum over ranks (in rank order) of the rows returned for each token;
// returned holds plan.total_rows() rows in plan order. Tokens sent nowhere (never, with valid
// ids) get zeros.
void combine_rows(const DispatchPlan& plan, const float* returned, int64_t tokens, int64_t hidden,
                  float* out);

// The low-latency form's receive layout on one rank: a fixed `capacity` of slots per local
// expert. Slot (e, j) for j < count[e] holds one (source rank, token, top-k slot); slots are
// filled in source-rank order, then token order. Pairs past the capacity are dropped and
// counted, never written out of bounds.
struct MaskedSlot {
  int32_t rank = -1, token = -1, slot = -1;
};
struct MaskedLayout {
  int64_t local_experts = 0, capacity = 0;
  std::vector<int64_t> count;     // [local_experts], at most capacity
  std::vector<MaskedSlot> slots;  // [local_experts * capacity]
  int64_t dropped = 0;            // pairs that did not fit
  std::string first_drop;         // names the expert that overflowed first, when dropped > 0
};

// Every source rank's routing: ids[s] holds tokens[s] * top_k global expert ids.
struct RankRoutingView {
  int64_t tokens = 0;
  const int32_t* ids = nullptr;
};
Status plan_masked(const ExpertPlacement& placement, int dest_rank, int64_t capacity, int64_t top_k,
                   const std::vector<RankRoutingView>& sources, MaskedLayout* out);

// The capacity per local expert that can never drop: every token of every rank may pick one
// expert (a token picks an expert at most once).
int64_t lossless_capacity(int64_t max_tokens_per_rank, int ep_size);

// The fallback's layout: every rank's tokens padded to `padded` rows, gathered rank-major.
struct GatherPlan {
  std::vector<int64_t> tokens_of;  // [world]
  int64_t padded = 0;              // max over tokens_of
  int64_t rows() const { return padded * static_cast<int64_t>(tokens_of.size()); }
};
GatherPlan plan_gather(const std::vector<int64_t>& tokens_of);

}  // namespace moekit::comm
