// The expert-parallel dispatch and combine kernels (comm/dispatch_device.hpp) on one GPU against
// the host plan (comm/dispatch.hpp): worlds of 1, 2, 4 and 8 ranks simulated by packing for every
// destination and feeding the "received" segments back, no NCCL. Outputs are poisoned first,
// inputs fresh and random, routing uniform, skewed, onto half the experts (the others get
// nothing) or onto one rank; bad ids are dropped and reported, never written out of bounds. The
// all-gather fallback's pieces: one fixed segment with round-robin padding, the widening to
// fp32 and the combine of fp32 sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "comm/dispatch.hpp"
#include "comm/dispatch_device.hpp"
#include "permute/permute.hpp"
#include "support/gpu.hpp"

namespace moekit::comm {
namespace {

using devtest::DeviceBuffer;
using devtest::from_bits;
using devtest::to_bits;
using devtest::to_device;
using devtest::to_host;

enum class Routing { kUniform, kSkewed, kHalfTheExperts, kOneRank };
const char* name(Routing r) {
  switch (r) {
    case Routing::kUniform:
      return "uniform";
    case Routing::kSkewed:
      return "skewed";
    case Routing::kHalfTheExperts:
      return "half the experts";
    case Routing::kOneRank:
      return "one rank";
  }
  return "?";
}

// k distinct experts per token from the routing's pool (kOneRank: one rank's experts, the same
// rank for every token; kHalfTheExperts: even experts only; kSkewed: expert i drawn with weight
// 1 / (i + 1)^1.5).
std::vector<int32_t> draw_ids(int64_t T, int k, int E, int n, Routing r, std::mt19937_64& rng) {
  std::vector<int32_t> pool;
  const int per_rank = E / n, target = static_cast<int>(rng() % n);
  for (int e = 0; e < E; ++e) {
    if (r == Routing::kHalfTheExperts && e % 2 != 0) continue;
    if (r == Routing::kOneRank && e / per_rank != target) continue;
    pool.push_back(e);
  }
  EXPECT_GE(static_cast<int>(pool.size()), k);
  std::vector<double> w(pool.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0 / std::pow(double(i + 1), 1.5);
  std::discrete_distribution<size_t> skewed(w.begin(), w.end());
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    if (r == Routing::kSkewed) {
      std::vector<int32_t> got;
      while (static_cast<int>(got.size()) < k) {
        const int32_t e = pool[skewed(rng)];
        if (std::find(got.begin(), got.end(), e) == got.end()) got.push_back(e);
      }
      std::copy(got.begin(), got.end(), ids.begin() + t * k);
    } else {
      std::shuffle(pool.begin(), pool.end(), rng);
      std::copy(pool.begin(), pool.begin() + k, ids.begin() + t * k);
    }
  }
  return ids;
}

// One rank's inputs (hidden bits of `dtype`, ids, weights) and its packed device output.
struct RankPack {
  device::DispatchShape shape;
  DType dtype = DType::kBFloat16;
  std::vector<uint16_t> hidden;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int64_t rows = 0;  // send capacity in rows
  DeviceBuffer d_hidden, d_ids, d_weights, row_of, counts, send_rows, send_ids, send_weights, error;

  RankPack(const device::DispatchShape& s, DType t, std::vector<int32_t> topk_ids,
           std::mt19937_64& rng, int64_t send_rows_capacity = -1)
      : shape(s), dtype(t), ids(std::move(topk_ids)) {
    const int64_t H = s.row_bytes / 2, k = s.top_k;
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> uw(0.05f, 1.0f);
    hidden.resize(static_cast<size_t>(s.tokens * H));
    devtest::fill_bits(hidden, t, normal, rng);
    weights.resize(static_cast<size_t>(s.tokens * k));
    for (auto& w : weights) w = uw(rng);
    rows = send_rows_capacity >= 0 ? send_rows_capacity
           : s.segment_rows > 0    ? s.segment_rows * s.ep_size
                                   : s.tokens * s.ep_size;
    d_hidden = to_device(hidden);
    d_ids = to_device(ids);
    d_weights = to_device(weights);
    row_of = DeviceBuffer(static_cast<size_t>(s.tokens * s.ep_size) * 4);
    counts = DeviceBuffer(static_cast<size_t>(s.ep_size) * 8);
    send_rows = DeviceBuffer(static_cast<size_t>(rows * s.row_bytes));
    send_ids = DeviceBuffer(static_cast<size_t>(rows * k) * 4);
    send_weights = DeviceBuffer(static_cast<size_t>(rows * k) * 4);
    error = DeviceBuffer(8);
    for (DeviceBuffer* b : {&row_of, &counts, &send_rows, &send_ids, &send_weights, &error})
      b->poison();  // the error word's 0xff bytes are permute::kNoError
  }
  device::DispatchBuffers buffers() const {
    device::DispatchBuffers b;
    b.row_of = row_of.as<int32_t>();
    b.send_counts = counts.as<int64_t>();
    b.send_rows = send_rows.ptr;
    b.send_ids = send_ids.as<int32_t>();
    b.send_weights = send_weights.as<float>();
    b.error_word = error.as<unsigned long long>();
    return b;
  }
  Status pack(cudaStream_t stream) {
    const Status st = device::pack_dispatch(shape, d_hidden.ptr, d_ids.as<int32_t>(),
                                            d_weights.as<float>(), buffers(), stream);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return st;
  }
  DispatchPlan host_plan() const {
    DispatchPlan p;
    EXPECT_TRUE(
        plan_dispatch({shape.num_experts, shape.ep_size}, shape.tokens, shape.top_k, ids.data(), &p)
            .ok());
    return p;
  }
  // Where rank d's segment starts in the send layout, in rows.
  int64_t base(const DispatchPlan& p, int d) const {
    if (shape.segment_rows > 0) return d * shape.segment_rows;
    int64_t b = 0;
    for (int q = 0; q < d; ++q) b += p.send_counts[q];
    return b;
  }
};

class EpDispatchKernels : public devtest::GpuTest {
 protected:
  void SetUp() override {
    devtest::GpuTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

device::DispatchShape make_shape(int64_t T, int k, int E, int n, int64_t H, int64_t segment) {
  device::DispatchShape s;
  s.tokens = T;
  s.top_k = k;
  s.num_experts = E;
  s.ep_size = n;
  s.row_bytes = H * 2;
  s.segment_rows = segment;
  return s;
}

// The packed rows, ids and weights equal pack_rows of the host plan, segment by segment; what
// the pack does not own (past the rows in the normal form, the padding rows' hidden in the
// low-latency form) keeps its poison; row_of names each token's row.
void expect_matches_host_plan(RankPack& p) {
  const device::DispatchShape& s = p.shape;
  const int n = s.ep_size, k = s.top_k;
  const int64_t rb = s.row_bytes;
  const DispatchPlan plan = p.host_plan();
  EXPECT_EQ(to_host<int64_t>(p.counts.ptr, n), plan.send_counts);
  const auto rows = to_host<uint8_t>(p.send_rows.ptr, static_cast<size_t>(p.rows * rb));
  const auto ids = to_host<int32_t>(p.send_ids.ptr, static_cast<size_t>(p.rows * k));
  const auto weights = to_host<float>(p.send_weights.ptr, static_cast<size_t>(p.rows * k));
  const auto row_of = to_host<int32_t>(p.row_of.ptr, static_cast<size_t>(s.tokens * n));
  std::vector<int32_t> want_row_of(row_of.size(), -1);
  int64_t mismatches = 0;
  for (int d = 0; d < n; ++d) {
    const int64_t base = p.base(plan, d);
    for (size_t i = 0; i < plan.rows_to[d].size(); ++i) {
      const int64_t t = plan.rows_to[d][i], at = base + static_cast<int64_t>(i);
      want_row_of[t * n + d] = static_cast<int32_t>(i);
      const uint8_t* src = reinterpret_cast<const uint8_t*>(p.hidden.data()) + t * rb;
      mismatches += std::memcmp(rows.data() + at * rb, src, rb) != 0;
      for (int j = 0; j < k; ++j) {
        mismatches += ids[at * k + j] != p.ids[t * k + j];
        mismatches += weights[at * k + j] != p.weights[t * k + j];
      }
    }
    const int64_t count = plan.send_counts[d];
    if (s.segment_rows > 0) {  // padding: hidden untouched, ids by pad_ids, weight 0
      const int64_t per_rank = s.num_experts / n;
      const bool round_robin = s.pad_ids == device::DispatchShape::PadIds::kRoundRobin;
      for (int64_t r = count; r < s.segment_rows; ++r) {
        const int64_t at = base + r;
        for (int64_t b = 0; b < rb; ++b) mismatches += rows[at * rb + b] != 0xff;
        for (int j = 0; j < k; ++j) {
          const int64_t want = round_robin ? (s.pad_origin + r) * k + j : (d + 1) * per_rank + j;
          mismatches += ids[at * k + j] != static_cast<int32_t>(want % s.num_experts);
          mismatches += weights[at * k + j] != 0.0f;
        }
      }
    }
  }
  if (s.segment_rows == 0) {  // past the packed rows: untouched
    for (int64_t at = plan.total_rows(); at < p.rows; ++at) {
      for (int64_t b = 0; b < rb; ++b) mismatches += rows[at * rb + b] != 0xff;
      for (int j = 0; j < k; ++j) mismatches += ids[at * k + j] != -1;
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(row_of, want_row_of);
  EXPECT_EQ(to_host<unsigned long long>(p.error.ptr, 1)[0], permute::kNoError);
}

TEST_F(EpDispatchKernels, PackMatchesTheHostPlanForEveryWorldSizeAndRouting) {
  std::mt19937_64 rng(devtest::base_seed());
  for (int n : {1, 2, 4, 8}) {
    for (Routing r :
         {Routing::kUniform, Routing::kSkewed, Routing::kHalfTheExperts, Routing::kOneRank}) {
      // 4099: more than one round of the plan's scan (2048 tokens a round), a partial last one
      // (not under compute-sanitizer, where it only adds time).
      for (int64_t T : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{600}, int64_t{4099}}) {
        if (T == 4099 && devtest::sanitizer_run()) continue;
        for (int64_t H : {int64_t{7}, int64_t{256}}) {  // 14-byte rows: the 2-byte copy
          for (int64_t segment : {int64_t{0}, std::max<int64_t>(T, 1) + 3}) {
            SCOPED_TRACE(testing::Message() << "world " << n << ", " << name(r) << ", T " << T
                                            << ", H " << H << ", segment " << segment);
            const int E = 32, k = 4;
            RankPack p(make_shape(T, k, E, n, H, segment),
                       T % 2 ? DType::kFloat16 : DType::kBFloat16, draw_ids(T, k, E, n, r, rng),
                       rng);
            ASSERT_TRUE(p.pack(stream_).ok());
            expect_matches_host_plan(p);
          }
        }
      }
    }
  }
}

// Host: out = for each token, the sum over ranks of returned rows as the host combine does,
// rounded once.
std::vector<uint16_t> host_combine(const RankPack& p, const DispatchPlan& plan,
                                   const std::vector<uint16_t>& returned_packed) {
  const int64_t H = p.shape.row_bytes / 2, T = p.shape.tokens;
  std::vector<float> r(returned_packed.size()), out(static_cast<size_t>(T * H));
  for (size_t i = 0; i < r.size(); ++i) r[i] = from_bits(p.dtype, returned_packed[i]);
  combine_rows(plan, r.data(), T, H, out.data());
  std::vector<uint16_t> bits(out.size());
  for (size_t i = 0; i < out.size(); ++i) bits[i] = to_bits(p.dtype, out[i]);
  return bits;
}

// The returned rows (host, packed back to back in plan order) in p's send layout.
std::vector<uint16_t> in_send_layout(const RankPack& p, const DispatchPlan& plan,
                                     const std::vector<uint16_t>& packed) {
  const int64_t H = p.shape.row_bytes / 2;
  std::vector<uint16_t> laid(static_cast<size_t>(p.rows * H), 0xffff);
  int64_t from = 0;
  for (int d = 0; d < p.shape.ep_size; ++d) {
    const int64_t c = plan.send_counts[d];
    std::copy_n(packed.begin() + from * H, c * H, laid.begin() + p.base(plan, d) * H);
    from += c;
  }
  return laid;
}

TEST_F(EpDispatchKernels, CombineSumsInRankOrderLikeTheHost) {
  std::mt19937_64 rng(devtest::base_seed() + 1);
  std::normal_distribution<float> normal;
  for (int n : {1, 2, 4, 8}) {
    for (Routing r : {Routing::kUniform, Routing::kSkewed, Routing::kOneRank}) {
      for (int64_t segment : {int64_t{0}, int64_t{300}}) {
        for (DType t : {DType::kBFloat16, DType::kFloat16}) {
          SCOPED_TRACE(testing::Message() << "world " << n << ", " << name(r) << ", segment "
                                          << segment << ", " << to_string(t));
          const int64_t T = 211, H = 130;
          RankPack p(make_shape(T, 8, 64, n, H, segment), t, draw_ids(T, 8, 64, n, r, rng), rng);
          ASSERT_TRUE(p.pack(stream_).ok());
          const DispatchPlan plan = p.host_plan();
          std::vector<uint16_t> packed(static_cast<size_t>(plan.total_rows() * H));
          devtest::fill_bits(packed, t, normal, rng);
          DeviceBuffer returned = to_device(in_send_layout(p, plan, packed));
          DeviceBuffer out(static_cast<size_t>(T * H) * 2);
          out.poison();
          ASSERT_TRUE(device::combine(p.shape, t, p.row_of.as<int32_t>(), p.counts.as<int64_t>(),
                                      returned.ptr, out.ptr, stream_)
                          .ok());
          ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
          EXPECT_EQ(to_host<uint16_t>(out.ptr, static_cast<size_t>(T * H)),
                    host_combine(p, plan, packed));
        }
      }
    }
  }
}

// A world of n ranks on one GPU: every rank packs; each destination's "received" segments are
// what the others packed for it; the destination's experts scale each row by
// sum over its local slots of weight * (id + 1) (rounded to the row's dtype, as a layer's output
// is); those results go back in each source's send layout and its combine sums them. The combine
// equals the host's on the same results, and the whole equals x * sum_j w_j (id_j + 1) within
// the dtype's rounding. The low-latency form also builds each destination's masked layout, equal
// to plan_masked's.
void simulate_world(int n, Routing routing, int64_t segment, int64_t masked_capacity,
                    cudaStream_t stream, std::mt19937_64& rng) {
  const int E = 64, k = 6, per_rank = E / n;
  const int64_t H = 96;
  const DType t = DType::kBFloat16;
  std::vector<std::unique_ptr<RankPack>> ranks;
  std::vector<DispatchPlan> plans;
  for (int s = 0; s < n; ++s) {
    const int64_t T = s == 1 ? 0 : 5 + static_cast<int64_t>(rng() % 60);  // a rank with none
    auto shape = make_shape(T, k, E, n, H, segment);
    ranks.push_back(std::make_unique<RankPack>(shape, t, draw_ids(T, k, E, n, routing, rng), rng));
    ASSERT_TRUE(ranks.back()->pack(stream).ok());
    plans.push_back(ranks.back()->host_plan());
  }
  // Each source's send buffers on the host.
  std::vector<std::vector<uint16_t>> rows(n);
  std::vector<std::vector<int32_t>> ids(n);
  std::vector<std::vector<float>> weights(n);
  for (int s = 0; s < n; ++s) {
    rows[s] = to_host<uint16_t>(ranks[s]->send_rows.ptr, static_cast<size_t>(ranks[s]->rows * H));
    ids[s] = to_host<int32_t>(ranks[s]->send_ids.ptr, static_cast<size_t>(ranks[s]->rows * k));
    weights[s] =
        to_host<float>(ranks[s]->send_weights.ptr, static_cast<size_t>(ranks[s]->rows * k));
  }
  // Destination d's experts on every row it received; results back into each source's layout.
  std::vector<std::vector<uint16_t>> returned(n);
  for (int s = 0; s < n; ++s) returned[s].assign(static_cast<size_t>(ranks[s]->rows * H), 0xffff);
  for (int d = 0; d < n; ++d) {
    for (int s = 0; s < n; ++s) {
      const int64_t base = ranks[s]->base(plans[s], d);
      for (int64_t i = 0; i < plans[s].send_counts[d]; ++i) {
        const int64_t at = base + i;
        float scale = 0;
        for (int j = 0; j < k; ++j) {
          const int32_t id = ids[s][at * k + j];
          if (id / per_rank == d) scale += weights[s][at * k + j] * float(id + 1);
        }
        for (int64_t h = 0; h < H; ++h)
          returned[s][at * H + h] = to_bits(t, scale * from_bits(t, rows[s][at * H + h]));
      }
    }
  }
  for (int s = 0; s < n; ++s) {
    RankPack& p = *ranks[s];
    const int64_t T = p.shape.tokens;
    DeviceBuffer back = to_device(returned[s]);
    DeviceBuffer out(static_cast<size_t>(std::max<int64_t>(T, 1) * H) * 2);
    out.poison();
    ASSERT_TRUE(device::combine(p.shape, t, p.row_of.as<int32_t>(), p.counts.as<int64_t>(),
                                back.ptr, out.ptr, stream)
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto got = to_host<uint16_t>(out.ptr, static_cast<size_t>(T * H));
    // The host combine on the same results, packed back to back.
    std::vector<uint16_t> packed;
    for (int d = 0; d < n; ++d) {
      const int64_t base = p.base(plans[s], d);
      packed.insert(packed.end(), returned[s].begin() + base * H,
                    returned[s].begin() + (base + plans[s].send_counts[d]) * H);
    }
    EXPECT_EQ(got, host_combine(p, plans[s], packed)) << "source rank " << s;
    double diff = 0, norm = 0;
    for (int64_t tok = 0; tok < T; ++tok) {
      float scale = 0;
      for (int j = 0; j < k; ++j) scale += p.weights[tok * k + j] * float(p.ids[tok * k + j] + 1);
      for (int64_t h = 0; h < H; ++h) {
        const double want = double(scale) * from_bits(t, p.hidden[tok * H + h]);
        const double dv = from_bits(t, got[tok * H + h]) - want;
        diff += dv * dv;
        norm += want * want;
      }
    }
    if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), 1e-2) << "source rank " << s;
  }
  if (segment == 0) return;
  // The low-latency receive side: each destination's masked layout against plan_masked's.
  std::vector<RankRoutingView> views;
  for (int s = 0; s < n; ++s) views.push_back({ranks[s]->shape.tokens, ranks[s]->ids.data()});
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> recv_ids(static_cast<size_t>(n * segment * k));
    std::vector<int64_t> recv_counts(n);
    for (int s = 0; s < n; ++s) {
      std::copy_n(ids[s].begin() + d * segment * k, segment * k,
                  recv_ids.begin() + s * segment * k);
      recv_counts[s] = plans[s].send_counts[d];
    }
    DeviceBuffer d_ids = to_device(recv_ids), d_counts = to_device(recv_counts);
    const int64_t cells = per_rank * masked_capacity;
    DeviceBuffer slot_rank(cells * 4 + 4), slot_row(cells * 4 + 4), slot_k(cells * 4 + 4),
        count(per_rank * 8), dropped(8);
    for (DeviceBuffer* b : {&slot_rank, &slot_row, &slot_k, &count, &dropped}) b->poison();
    device::MaskedDeviceLayout out{slot_rank.as<int32_t>(), slot_row.as<int32_t>(),
                                   slot_k.as<int32_t>(), count.as<int64_t>(),
                                   dropped.as<int64_t>()};
    ASSERT_TRUE(device::build_masked_layout(ranks[0]->shape, d, masked_capacity,
                                            d_ids.as<int32_t>(), d_counts.as<int64_t>(), out,
                                            stream)
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    MaskedLayout want;
    ASSERT_TRUE(plan_masked({E, n}, d, masked_capacity, k, views, &want).ok());
    EXPECT_EQ(to_host<int64_t>(count.ptr, per_rank), want.count) << "rank " << d;
    EXPECT_EQ(to_host<int64_t>(dropped.ptr, 1)[0], want.dropped) << "rank " << d;
    const auto got_rank = to_host<int32_t>(slot_rank.ptr, cells);
    const auto got_row = to_host<int32_t>(slot_row.ptr, cells);
    const auto got_k = to_host<int32_t>(slot_k.ptr, cells);
    int64_t mismatches = 0;
    for (int64_t e = 0; e < per_rank; ++e) {
      for (int64_t j = 0; j < want.count[e]; ++j) {
        const int64_t at = e * masked_capacity + j;
        const MaskedSlot& w = want.slots[at];
        mismatches += got_rank[at] != w.rank || got_k[at] != w.slot;
        // The device names the row within the source's segment; the host the source's token.
        mismatches += got_row[at] < 0 || got_row[at] >= plans[w.rank].send_counts[d] ||
                      plans[w.rank].rows_to[d][got_row[at]] != w.token;
      }
      for (int64_t j = want.count[e]; j < masked_capacity; ++j)
        mismatches += got_rank[e * masked_capacity + j] != -1;  // untouched
    }
    EXPECT_EQ(mismatches, 0) << "rank " << d;
  }
}

TEST_F(EpDispatchKernels, SimulatedWorldsRoundTripLikeTheHost) {
  std::mt19937_64 rng(devtest::base_seed() + 2);
  for (int n : {2, 4, 8}) {
    for (Routing r :
         {Routing::kUniform, Routing::kSkewed, Routing::kHalfTheExperts, Routing::kOneRank}) {
      SCOPED_TRACE(testing::Message() << "world " << n << ", " << name(r));
      simulate_world(n, r, 0, 0, stream_, rng);
      const int64_t segment = 64;  // every rank's tokens fit
      simulate_world(n, r, segment, lossless_capacity(segment, n), stream_, rng);
      simulate_world(n, r, segment, 3, stream_, rng);  // tight: pairs dropped and counted
    }
  }
}

TEST_F(EpDispatchKernels, BadIdsAreDroppedReportedAndNeverWrittenOutOfBounds) {
  std::mt19937_64 rng(devtest::base_seed() + 3);
  const int E = 16, k = 4, n = 4, per_rank = E / n;
  const int64_t T = 6, H = 64;
  std::vector<int32_t> ids = {0,  5,  9,  13,  //
                              1,  4,  16, 2,   // slot 2 past the experts: the first bad one
                              3,  7,  11, 15,  //
                              -5, 6,  10, 14,  // a negative id
                              -1, 99, 16, -2,  // every slot bad: the token goes nowhere
                              12, 13, 14, 15};
  // Sent to rank d: the tokens with a valid slot there, ascending.
  std::vector<std::vector<int64_t>> rows_to(n);
  for (int64_t t = 0; t < T; ++t) {
    for (int d = 0; d < n; ++d) {
      for (int j = 0; j < k; ++j) {
        const int32_t id = ids[t * k + j];
        if (id >= 0 && id < E && id / per_rank == d) {
          rows_to[d].push_back(t);
          break;
        }
      }
    }
  }
  int64_t total = 0;
  for (auto& r : rows_to) total += static_cast<int64_t>(r.size());
  // The send buffers hold exactly the valid rows plus a poisoned guard that must stay so.
  const int64_t guard = 8;
  for (int64_t segment : {int64_t{0}, int64_t{8}}) {
    SCOPED_TRACE(testing::Message() << "segment " << segment);
    const int64_t rows = segment > 0 ? n * segment : total;
    RankPack p(make_shape(T, k, E, n, H, segment), DType::kBFloat16, ids, rng, rows + guard);
    ASSERT_TRUE(p.pack(stream_).ok());
    const auto counts = to_host<int64_t>(p.counts.ptr, n);
    for (int d = 0; d < n; ++d) EXPECT_EQ(counts[d], (int64_t)rows_to[d].size()) << "rank " << d;
    const auto row_of = to_host<int32_t>(p.row_of.ptr, T * n);
    for (int d = 0; d < n; ++d) EXPECT_EQ(row_of[4 * n + d], -1) << "rank " << d;
    const auto send_ids = to_host<int32_t>(p.send_ids.ptr, (rows + guard) * k);
    const auto send_w = to_host<float>(p.send_weights.ptr, (rows + guard) * k);
    const auto send_rows = to_host<uint16_t>(p.send_rows.ptr, (rows + guard) * H);
    for (int64_t i = rows * k; i < (rows + guard) * k; ++i) {
      EXPECT_EQ(send_ids[i], -1);
      EXPECT_TRUE(std::isnan(send_w[i]));
    }
    for (int64_t i = rows * H; i < (rows + guard) * H; ++i) ASSERT_EQ(send_rows[i], 0xffff);
    // Token 1's copy for rank 0 (whose segment starts at row 0 in both forms) carries its bad
    // slot as id -1, weight 0.
    ASSERT_GE(row_of[1 * n + 0], 0);
    EXPECT_EQ(send_ids[row_of[1 * n + 0] * k + 2], -1);
    EXPECT_EQ(send_w[row_of[1 * n + 0] * k + 2], 0.0f);
    const unsigned long long word = to_host<unsigned long long>(p.error.ptr, 1)[0];
    EXPECT_EQ(word, (static_cast<unsigned long long>(1 * k + 2) << 32) | 16u);
    const Status st = permute::decode_error(word, E, k);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("16"), std::string::npos) << st.message();
    // The token sent nowhere combines to zeros.
    DeviceBuffer back((rows + guard) * H * 2), out(T * H * 2);
    ASSERT_EQ(cudaMemset(back.ptr, 0, back.bytes), cudaSuccess);
    out.poison();
    ASSERT_TRUE(device::combine(p.shape, DType::kBFloat16, p.row_of.as<int32_t>(),
                                p.counts.as<int64_t>(), back.ptr, out.ptr, stream_)
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const auto got = to_host<uint16_t>(out.ptr, T * H);
    for (int64_t h = 0; h < H; ++h) ASSERT_EQ(got[4 * H + h], 0) << "column " << h;
  }
}

TEST_F(EpDispatchKernels, LowLatencyPackAndCombineReplayInACudaGraph) {
  std::mt19937_64 rng(devtest::base_seed() + 4);
  const int E = 32, k = 4, n = 4;
  const int64_t T = 24, H = 128, segment = 32;
  RankPack p(make_shape(T, k, E, n, H, segment), DType::kBFloat16,
             draw_ids(T, k, E, n, Routing::kSkewed, rng), rng);
  DeviceBuffer out(T * H * 2);
  // One graph: pack, then combine the packed rows as if every rank sent them back unchanged.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status packed = device::pack_dispatch(p.shape, p.d_hidden.ptr, p.d_ids.as<int32_t>(),
                                              p.d_weights.as<float>(), p.buffers(), stream_);
  const Status combined =
      device::combine(p.shape, DType::kBFloat16, p.row_of.as<int32_t>(), p.counts.as<int64_t>(),
                      p.send_rows.ptr, out.ptr, stream_);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_TRUE(packed.ok() && combined.ok());
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::normal_distribution<float> normal;
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(testing::Message() << "replay " << replay);
    // Fresh routing and rows in the same buffers.
    p.ids = draw_ids(T, k, E, n, replay == 1 ? Routing::kOneRank : Routing::kUniform, rng);
    devtest::fill_bits(p.hidden, DType::kBFloat16, normal, rng);
    devtest::upload(p.d_ids, p.ids);
    devtest::upload(p.d_hidden, p.hidden);
    for (DeviceBuffer* b : {&out, &p.send_rows, &p.send_ids, &p.send_weights, &p.row_of})
      b->poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    expect_matches_host_plan(p);
    const DispatchPlan plan = p.host_plan();
    std::vector<uint16_t> sent;
    for (int d = 0; d < n; ++d) {
      for (int64_t t : plan.rows_to[d])
        sent.insert(sent.end(), p.hidden.begin() + t * H, p.hidden.begin() + (t + 1) * H);
    }
    EXPECT_EQ(to_host<uint16_t>(out.ptr, T * H), host_combine(p, plan, sent));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The all-gather fallback's side: one rank's tokens packed as one fixed segment (ep_size 1)
// whose padding ids go round-robin over every expert from the rank's first gathered row; then,
// as if the reduce-scatter had summed the segment's rows, fp32 rows combined into the tokens:
// each token's row rounded once, tokens with no row zeros.
TEST_F(EpDispatchKernels, GatherSegmentPacksAndCombinesFp32Sums) {
  std::mt19937_64 rng(devtest::base_seed() + 5);
  std::normal_distribution<float> normal;
  for (int64_t T : {int64_t{0}, int64_t{1}, int64_t{50}, int64_t{64}}) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      for (int64_t H : {int64_t{7}, int64_t{256}}) {
        SCOPED_TRACE(testing::Message() << "T " << T << ", " << to_string(t) << ", H " << H);
        const int E = 16, k = 4;
        const int64_t P = 64, rank = 3;
        device::DispatchShape shape = make_shape(T, k, E, 1, H, P);
        shape.pad_ids = device::DispatchShape::PadIds::kRoundRobin;
        shape.pad_origin = rank * P;
        RankPack p(shape, t, draw_ids(T, k, E, 1, Routing::kSkewed, rng), rng);
        ASSERT_TRUE(p.pack(stream_).ok());
        expect_matches_host_plan(p);
        // Every padding row's k ids are distinct (the local layer refuses repeats).
        const auto ids = to_host<int32_t>(p.send_ids.ptr, static_cast<size_t>(P * k));
        for (int64_t r = T; r < P; ++r) {
          std::vector<int32_t> row(ids.begin() + r * k, ids.begin() + (r + 1) * k);
          std::sort(row.begin(), row.end());
          EXPECT_EQ(std::unique(row.begin(), row.end()), row.end()) << "padding row " << r;
        }
        std::vector<float> sums(static_cast<size_t>(P * H));
        for (float& x : sums) x = 4.0f * normal(rng);
        DeviceBuffer returned = to_device(sums),
                     out(static_cast<size_t>(std::max<int64_t>(T, 1) * H) * 2);
        out.poison();
        ASSERT_TRUE(device::combine(p.shape, t, p.row_of.as<int32_t>(), p.counts.as<int64_t>(),
                                    returned.ptr, out.ptr, stream_, /*returned_f32=*/true)
                        .ok());
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        // With valid ids every token has row t of the segment.
        std::vector<uint16_t> want(static_cast<size_t>(T * H));
        for (int64_t i = 0; i < T * H; ++i) want[i] = to_bits(t, sums[i]);
        EXPECT_EQ(to_host<uint16_t>(out.ptr, static_cast<size_t>(T * H)), want);
      }
    }
  }
}

TEST_F(EpDispatchKernels, WidenToF32IsExact) {
  std::mt19937_64 rng(devtest::base_seed() + 6);
  std::normal_distribution<float> normal;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    // 8-element vectors where the count allows, one at a time otherwise.
    for (int64_t count : {int64_t{1}, int64_t{13}, int64_t{4096}, int64_t{100003}}) {
      SCOPED_TRACE(testing::Message() << to_string(t) << ", count " << count);
      std::vector<uint16_t> bits(static_cast<size_t>(count));
      devtest::fill_bits(bits, t, normal, rng);
      DeviceBuffer src = to_device(bits), dst(static_cast<size_t>(count + 8) * 4);
      dst.poison();
      ASSERT_TRUE(device::widen_to_f32(t, src.ptr, count, dst.as<float>(), stream_).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const auto got = to_host<uint32_t>(dst.ptr, static_cast<size_t>(count + 8));
      int64_t mismatches = 0;
      for (int64_t i = 0; i < count; ++i) {
        const float want = from_bits(t, bits[i]);
        uint32_t want_bits = 0;
        std::memcpy(&want_bits, &want, 4);
        mismatches += got[i] != want_bits;
      }
      for (int64_t i = count; i < count + 8; ++i) mismatches += got[i] != 0xffffffffu;  // untouched
      EXPECT_EQ(mismatches, 0);
    }
  }
}

// The shape checks run before anything is launched: no GPU needed.
TEST(EpDispatchKernelShapes, BadShapesAreRefusedWithTheValue) {
  device::DispatchShape s = make_shape(4, 2, 16, 4, 8, 0);
  device::DispatchBuffers b;
  auto pack_code = [&] { return device::pack_dispatch(s, nullptr, nullptr, nullptr, b, nullptr); };
  s.ep_size = 3;  // does not divide 16 experts
  EXPECT_EQ(pack_code().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(pack_code().message().find("3"), std::string::npos);
  s.ep_size = 4096;
  s.num_experts = 4096;
  EXPECT_EQ(pack_code().code(), ErrorCode::kInvalidArgument);  // past the kernels' ranks
  s.ep_size = 4;
  s.num_experts = 16;
  s.segment_rows = 2;  // 4 tokens do not fit
  EXPECT_EQ(pack_code().code(), ErrorCode::kInvalidArgument);
  s.segment_rows = 0;
  s.row_bytes = 7;
  EXPECT_EQ(pack_code().code(), ErrorCode::kInvalidArgument);
  s.row_bytes = 16;
  s.top_k = 0;
  EXPECT_EQ(pack_code().code(), ErrorCode::kInvalidArgument);
  s.top_k = 2;
  EXPECT_EQ(device::combine(s, DType::kFloat32, nullptr, nullptr, nullptr, nullptr, nullptr).code(),
            ErrorCode::kUnsupported);
  EXPECT_EQ(device::widen_to_f32(DType::kFloat32, nullptr, 8, nullptr, nullptr).code(),
            ErrorCode::kUnsupported);
  const Status negative = device::widen_to_f32(DType::kBFloat16, nullptr, -8, nullptr, nullptr);
  EXPECT_EQ(negative.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("-8"), std::string::npos) << negative.message();
  s.pad_origin = -1;
  EXPECT_EQ(pack_code().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(pack_code().message().find("-1"), std::string::npos);
  s.pad_origin = 0;
  device::MaskedDeviceLayout m;
  s.segment_rows = 8;
  EXPECT_EQ(device::build_masked_layout(s, 4, 8, nullptr, nullptr, m, nullptr).code(),
            ErrorCode::kInvalidArgument);  // rank 4 of 4
  EXPECT_EQ(device::build_masked_layout(s, 0, -1, nullptr, nullptr, m, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace moekit::comm
