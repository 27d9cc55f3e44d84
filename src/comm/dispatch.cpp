#include "comm/dispatch.hpp"

#include <algorithm>
#include <cstring>

namespace moekit::comm {

int64_t DispatchPlan::total_rows() const {
  int64_t n = 0;
  for (int64_t c : send_counts) n += c;
  return n;
}

namespace {

Status check_id(const ExpertPlacement& p, int64_t token, int64_t slot, int32_t id) {
  if (id >= 0 && id < p.num_experts) return {};
  return Status(ErrorCode::kInvalidArgument, "expert id " + std::to_string(id) + " of token " +
                                                 std::to_string(token) + " slot " +
                                                 std::to_string(slot) + " is outside [0, " +
                                                 std::to_string(p.num_experts) + ")");
}

Status check_placement(const ExpertPlacement& p) {
  if (p.ep_size < 1 || p.num_experts < p.ep_size || p.num_experts % p.ep_size != 0)
    return Status(ErrorCode::kInvalidArgument, "ep_size " + std::to_string(p.ep_size) +
                                                   " does not divide num_experts " +
                                                   std::to_string(p.num_experts));
  return {};
}

}  // namespace

Status plan_dispatch(const ExpertPlacement& placement, int64_t tokens, int64_t top_k,
                     const int32_t* ids, DispatchPlan* plan) {
  if (Status st = check_placement(placement); !st.ok()) return st;
  if (tokens < 0 || top_k < 1)
    return Status(ErrorCode::kInvalidArgument, "dispatch of " + std::to_string(tokens) +
                                                   " tokens with top_k " + std::to_string(top_k));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      if (Status st = check_id(placement, t, j, ids[t * top_k + j]); !st.ok()) return st;
    }
  }
  const int n = placement.ep_size;
  plan->rows_to.assign(n, {});
  plan->send_counts.assign(n, 0);
  std::vector<int64_t> last_token_to(n, -1);  // a token goes to a rank once
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int d = placement.rank_of(ids[t * top_k + j]);
      if (last_token_to[d] == t) continue;
      last_token_to[d] = t;
      plan->rows_to[d].push_back(t);
    }
  }
  for (int d = 0; d < n; ++d) plan->send_counts[d] = static_cast<int64_t>(plan->rows_to[d].size());
  return {};
}

void pack_rows(const DispatchPlan& plan, const void* src, int64_t row_bytes, void* send) {
  auto* out = static_cast<uint8_t*>(send);
  const auto* in = static_cast<const uint8_t*>(src);
  for (const auto& rows : plan.rows_to) {
    for (int64_t t : rows) {
      std::memcpy(out, in + t * row_bytes, row_bytes);
      out += row_bytes;
    }
  }
}

void combine_rows(const DispatchPlan& plan, const float* returned, int64_t tokens, int64_t hidden,
                  float* out) {
  std::fill_n(out, tokens * hidden, 0.0f);
  const float* r = returned;
  for (const auto& rows : plan.rows_to) {
    for (int64_t t : rows) {
      float* o = out + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += r[h];
      r += hidden;
    }
  }
}

Status plan_masked(const ExpertPlacement& placement, int dest_rank, int64_t capacity, int64_t top_k,
                   const std::vector<RankRoutingView>& sources, MaskedLayout* out) {
  if (Status st = check_placement(placement); !st.ok()) return st;
  if (dest_rank < 0 || dest_rank >= placement.ep_size)
    return Status(ErrorCode::kInvalidArgument, "destination rank " + std::to_string(dest_rank) +
                                                   " in a world of " +
                                                   std::to_string(placement.ep_size));
  if (capacity < 0 || top_k < 1)
    return Status(ErrorCode::kInvalidArgument, "masked layout with capacity " +
                                                   std::to_string(capacity) + " and top_k " +
                                                   std::to_string(top_k));
  if (static_cast<int>(sources.size()) != placement.ep_size)
    return Status(ErrorCode::kInvalidArgument, std::to_string(sources.size()) +
                                                   " source ranks in a world of " +
                                                   std::to_string(placement.ep_size));
  for (const RankRoutingView& s : sources) {
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        if (Status st = check_id(placement, t, j, s.ids[t * top_k + j]); !st.ok()) return st;
      }
    }
  }
  const int64_t local = placement.experts_per_rank(), first = dest_rank * local;
  out->local_experts = local;
  out->capacity = capacity;
  out->count.assign(local, 0);
  out->slots.assign(local * capacity, MaskedSlot{});
  out->dropped = 0;
  out->first_drop.clear();
  for (int s = 0; s < placement.ep_size; ++s) {
    for (int64_t t = 0; t < sources[s].tokens; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t e = sources[s].ids[t * top_k + j] - first;
        if (e < 0 || e >= local) continue;
        if (out->count[e] == capacity) {
          if (out->dropped++ == 0)
            out->first_drop = "expert " + std::to_string(first + e) + " on rank " +
                              std::to_string(dest_rank) + " overflowed its " +
                              std::to_string(capacity) + " slots at rank " + std::to_string(s) +
                              "'s token " + std::to_string(t);
          continue;
        }
        out->slots[e * capacity + out->count[e]++] =
            MaskedSlot{s, static_cast<int32_t>(t), static_cast<int32_t>(j)};
      }
    }
  }
  return {};
}

int64_t lossless_capacity(int64_t max_tokens_per_rank, int ep_size) {
  return max_tokens_per_rank * ep_size;
}

GatherPlan plan_gather(const std::vector<int64_t>& tokens_of) {
  GatherPlan p;
  p.tokens_of = tokens_of;
  for (int64_t t : tokens_of) p.padded = std::max(p.padded, t);
  return p;
}

}  // namespace moekit::comm
