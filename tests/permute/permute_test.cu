// The device permutation against the one the host derives from route_host's ids: offsets, the
// stable (expert, token, slot) order of the rows, each slot's row, each row's expert, and the
// gathered rows bit for bit. Both paths (single block, multi block) at tokens 1 .. 9000, the
// multi-block path up to 20000 (5000, 9000, 16384 and 20000 cut into 2500, 3000, 4096 and 4000
// chunks: 10, 12, 16 and 16 scan segments, the last ones partly filled), EP ranks (ids of other
// ranks dropped), skewed caller ids, and bad caller ids (dropped, reported).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "permute/permute.hpp"
#include "routing/routing.hpp"
#include "support/gpu.hpp"

namespace moekit::permute {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

// Device buffers of one Config, poisoned.
struct Workspace {
  std::vector<DeviceBuffer> keep;
  Buffers b;
  explicit Workspace(const Config& c) {
    const BufferCounts n = buffer_counts(c);
    auto take = [&](std::size_t bytes) {
      keep.emplace_back(bytes);
      keep.back().poison();
      return keep.back().ptr;
    };
    b.topk_ids = static_cast<int32_t*>(take(n.per_slot * 4));
    b.topk_weights = static_cast<float*>(take(n.per_slot * 4));
    b.slot_expert = static_cast<int32_t*>(take(n.per_slot * 4));
    b.slot_rank = static_cast<int32_t*>(take(n.per_slot * 4));
    b.slot_row = static_cast<int32_t*>(take(n.per_slot * 4));
    b.chunk_counts = static_cast<int32_t*>(take(n.chunk_counts * 4));
    b.segment_totals = static_cast<int32_t*>(take(n.segment_totals * 4));
    b.offsets = static_cast<int32_t*>(take(n.offsets * 4));
    b.row_expert = static_cast<int32_t*>(take(n.rows * 4));
    b.row_token = static_cast<int32_t*>(take(n.rows * 4));  // 0xff..: unwritten
    b.permuted = take(n.permuted_bytes);
    b.error_word = static_cast<unsigned long long*>(take(8));                // 0xff..: kNoError
    b.offsets_flag = static_cast<uint32_t*>(take(4));                        // 0xff..: stale
    b.expert_done = static_cast<int32_t*>(take((c.local_experts + 2) * 4));  // 0xff..: stale
  }
};

struct Expected {
  std::vector<int32_t> offsets, slot_row, row_expert, row_token;
};

// The permutation by definition: rows of local expert e hold its (token, slot) pairs in order.
Expected expected_permutation(const std::vector<int32_t>& ids, int64_t tokens, int k, int first,
                              int local) {
  Expected x;
  x.slot_row.assign(ids.size(), -1);
  x.offsets.assign(1, 0);
  for (int e = 0; e < local; ++e) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int s = 0; s < k; ++s)
        if (ids[t * k + s] == first + e) {
          x.slot_row[t * k + s] = static_cast<int32_t>(x.row_expert.size());
          x.row_expert.push_back(e);
          x.row_token.push_back(static_cast<int32_t>(t));
        }
    x.offsets.push_back(static_cast<int32_t>(x.row_expert.size()));
  }
  return x;
}

// The permute's inputs copied to the device, and the Inputs that point at them.
struct DeviceInputs {
  DeviceBuffer hidden, logits, ids, weights;
  Inputs in;
  DeviceInputs(const std::vector<uint16_t>& h, const std::vector<float>& l,
               const std::vector<int32_t>& i, const std::vector<float>& w)
      : hidden(to_device(h)), logits(to_device(l)), ids(to_device(i)), weights(to_device(w)) {
    in.hidden = hidden.ptr;
    in.logits = logits.as<float>();
    in.ids = ids.as<int32_t>();
    in.weights = weights.as<float>();
  }
};

struct PermuteCase {
  RoutingParams params;
  int64_t experts = 32;
  int top_k = 4;
  int ep_size = 1, ep_rank = 0;
  int64_t hidden = 136;  // 272 bytes: not a multiple of 32 vectors per warp
  bool bias = false;     // DeepSeek-V3: a random correction bias (params.correction_bias)
  // Logits on a grid of 0.5 with some -inf, -0 and NaN, so that many experts tie: the slots must
  // still come in the host's order (equal values to the lower id, NaN as -inf, -0 as +0).
  bool tied = false;
};

// Runs one permutation and checks it. `ids` (kExternal) are the caller's; for routed methods
// the host routes the logits. `dropped` marks caller slots the device must drop.
// gather false: Inputs::gather off (the next GEMM reads the tokens' own rows), so the permuted
// rows must stay as the workspace left them.
void check_one(const PermuteCase& su, int64_t tokens, Path path, std::mt19937_64& rng,
               const std::vector<int32_t>* ext_ids = nullptr, bool gather = true) {
  const int k = su.top_k;
  const int64_t E = su.experts;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> bias;
  if (su.bias)
    for (int64_t e = 0; e < E; ++e) bias.push_back(0.05f * normal(rng));
  DeviceBuffer d_bias = to_device(bias);
  Config c;
  ASSERT_TRUE(routing::make_device_routing(su.params, E, k, su.bias ? d_bias.as<float>() : nullptr,
                                           &c.routing)
                  .ok());
  c.local_experts = static_cast<int>(E / su.ep_size);
  c.first_expert = su.ep_rank * c.local_experts;
  c.row_bytes = su.hidden * 2;
  c.max_tokens = tokens + 5;
  ASSERT_TRUE(prepare(c).ok());
  Workspace ws(c);

  std::vector<uint16_t> hidden(static_cast<std::size_t>(tokens * su.hidden));
  fill_bits(hidden, DType::kBFloat16, normal, rng);
  std::vector<int32_t> ids(static_cast<std::size_t>(tokens * k));
  std::vector<float> weights(ids.size());
  std::vector<float> logits;
  if (ext_ids) {
    ids = *ext_ids;
    for (auto& w : weights) w = 0.5f + 0.5f * std::fabs(normal(rng));
  } else {
    logits.resize(static_cast<std::size_t>(tokens * E));
    for (auto& l : logits) {
      l = normal(rng);
      if (su.tied) {
        l = std::round(l * 2.0f) / 2.0f;
        const uint64_t u = rng() % 16;
        if (u == 0) l = -INFINITY;
        if (u == 1) l = -0.0f;
        if (u == 2) l = NAN;
      }
    }
    ASSERT_TRUE(routing::route_host(su.params, tokens, E, k, logits.data(),
                                    su.bias ? bias.data() : nullptr, ids.data(), weights.data())
                    .ok());
  }
  // What the device must make of the ids: bad caller ids become -1.
  std::vector<int32_t> kept = ids;
  int64_t first_bad = -1;
  for (int64_t t = 0; t < tokens; ++t)
    for (int s = 0; s < k; ++s) {
      const int32_t v = ids[t * k + s];
      bool bad = v < 0 || v >= E;
      for (int i = 0; i < s; ++i) bad = bad || ids[t * k + i] == v;
      if (bad) {
        kept[t * k + s] = -1;
        if (first_bad < 0) first_bad = t * k + s;
      }
    }
  const Expected x = expected_permutation(kept, tokens, k, c.first_expert, c.local_experts);

  const DeviceInputs d(hidden, logits, ids, weights);
  Inputs in = d.in;
  in.gather = gather;
  ASSERT_TRUE(run(c, ws.b, tokens, in, nullptr, path).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const int L = c.local_experts;
  const auto offsets = to_host<int32_t>(ws.b.offsets, L + 1);
  EXPECT_EQ(offsets, x.offsets);
  // The single-block kernel sets the flag (after clearing the stale value); the multi-block
  // kernels leave it alone (OffsetsFinal).
  const bool single =
      path == Path::kSingleBlock || (path == Path::kAuto && tokens <= kSingleBlockMaxTokens);
  EXPECT_EQ(to_host<uint32_t>(ws.b.offsets_flag, 1)[0], single ? 1u : 0xffffffffu);
  EXPECT_EQ(clears_expert_done(tokens, path), single);
  EXPECT_EQ(to_host<int32_t>(ws.b.expert_done, L + 2),
            std::vector<int32_t>(L + 2, single ? 0 : -1));
  const auto got_ids = to_host<int32_t>(ws.b.topk_ids, ids.size());
  EXPECT_EQ(got_ids, kept);
  const auto got_w = to_host<float>(ws.b.topk_weights, ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const float want = kept[i] < 0 ? 0.0f : weights[i];
    EXPECT_NEAR(got_w[i], want, 4e-7f * std::fabs(want)) << "slot " << i;
  }
  EXPECT_EQ(to_host<int32_t>(ws.b.slot_row, ids.size()), x.slot_row);
  const int64_t rows = x.offsets.back();
  EXPECT_EQ(to_host<int32_t>(ws.b.row_expert, rows), x.row_expert);
  // Each row's token: the multi-block path writes it (a GEMM after a run without the gather reads
  // the rows by it); the single block does not.
  if (!single) EXPECT_EQ(to_host<int32_t>(ws.b.row_token, rows), x.row_token);
  const auto permuted = to_host<uint16_t>(ws.b.permuted, rows * su.hidden);
  int64_t wrong_rows = 0;
  for (int64_t r = 0; r < rows; ++r)
    wrong_rows +=
        gather
            ? !std::equal(permuted.begin() + r * su.hidden, permuted.begin() + (r + 1) * su.hidden,
                          hidden.begin() + x.row_token[r] * su.hidden)
            : std::any_of(permuted.begin() + r * su.hidden, permuted.begin() + (r + 1) * su.hidden,
                          [](uint16_t v) { return v != 0xffff; });
  EXPECT_EQ(wrong_rows, 0) << (gather ? "gathered rows differing from their token's hidden row"
                                      : "rows written though nothing was to be gathered");
  const auto word = to_host<unsigned long long>(ws.b.error_word, 1)[0];
  if (first_bad < 0) {
    EXPECT_EQ(word, kNoError);
  } else {
    EXPECT_EQ(static_cast<int64_t>(word >> 32), first_bad);
    EXPECT_EQ(static_cast<int32_t>(word & 0xffffffffu), ids[first_bad]);
    EXPECT_EQ(decode_error(word, static_cast<int>(E), k).code(), ErrorCode::kInvalidArgument);
  }
}

class PermuteTest : public GpuTest {};

TEST_F(PermuteTest, RoutedTokensBothPaths) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9e37);
  PermuteCase su;
  su.params.method = RoutingMethod::kTopKSoftmax;
  for (int64_t tokens : {1, 7, 64, 65, 513, 4096, 5000, 9000})
    for (Path path : {Path::kSingleBlock, Path::kMultiBlock, Path::kAuto}) {
      SCOPED_TRACE("T" + std::to_string(tokens) + " path " + std::to_string(int(path)));
      check_one(su, tokens, path, rng);
    }
  for (int64_t tokens : {16384, 20000}) {
    SCOPED_TRACE("T" + std::to_string(tokens) + " multi block");
    check_one(su, tokens, Path::kMultiBlock, rng);
  }
}

// Tied logits (PermuteCase::tied) on both paths: the warp's argmax rounds (routing_warp.cuh)
// give the host's slots, for 1 to 4 experts per lane. H200, 2026-12-01 ran it against a bitonic
// top-k in the single-block kernel (a bitonic variant, not kept).
TEST_F(PermuteTest, TiedLogitsInTheHostsOrder) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x71ed);
  for (RoutingMethod m : {RoutingMethod::kTopKSoftmax, RoutingMethod::kSoftmaxTopK})
    for (int64_t experts : {16, 64, 128})
      for (int top_k : {2, 3, 8})
        for (int64_t tokens : {1, 7, 64})
          for (Path path : {Path::kSingleBlock, Path::kMultiBlock}) {
            PermuteCase su;
            su.params.method = m;
            su.experts = experts;
            su.top_k = top_k;
            su.tied = true;
            SCOPED_TRACE("method " + std::to_string(int(m)) + " E" + std::to_string(experts) +
                         " k" + std::to_string(top_k) + " T" + std::to_string(tokens) + " path " +
                         std::to_string(int(path)));
            check_one(su, tokens, path, rng);
          }
}

// Without the gather (the chained decode GEMV reads the tokens' own rows; past the single block,
// FC1 reads them by each row's token): routing, offsets and slots as with it, no row written,
// the offsets final at the flag on the single block; the multi-block path refuses such a run
// without Buffers::row_token.
TEST_F(PermuteTest, RunsWithoutTheGather) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x9e38);
  PermuteCase su;
  su.params.method = RoutingMethod::kTopKSoftmax;
  for (int64_t tokens : {1, 2, 5, 8, 64}) {
    SCOPED_TRACE("T" + std::to_string(tokens));
    check_one(su, tokens, Path::kAuto, rng, nullptr, false);
  }
  Config c;
  ASSERT_TRUE(
      routing::make_device_routing(su.params, su.experts, su.top_k, nullptr, &c.routing).ok());
  c.local_experts = static_cast<int>(su.experts);
  c.row_bytes = su.hidden * 2;
  c.max_tokens = 100;
  ASSERT_TRUE(prepare(c).ok());
  EXPECT_EQ(offsets_final_for_next_kernel(c, 8, Path::kAuto, false), OffsetsFinal::kAtFlag);
  // Past the single block, each row's token instead of the row (Buffers::row_token)...
  for (int64_t tokens : {65, 100})
    for (Path path : {Path::kAuto, Path::kMultiBlock}) {
      SCOPED_TRACE("T" + std::to_string(tokens));
      check_one(su, tokens, path, rng, nullptr, false);
    }
  check_one(su, 8, Path::kMultiBlock, rng, nullptr, false);
  // ... which that path then needs.
  Workspace ws(c);
  ws.b.row_token = nullptr;
  Inputs in;
  in.gather = false;
  const Status s = run(c, ws.b, 65, in, nullptr, Path::kAuto);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Buffers::row_token"), std::string::npos) << s.message();
  EXPECT_TRUE(single_block_path(64));
  EXPECT_FALSE(single_block_path(65));
  EXPECT_FALSE(single_block_path(1, Path::kMultiBlock));
}

// DeepSeek-V3 group selection on both paths against the host. At up to 4 tokens and 8+ experts
// per lane (256+ experts) the single block scores every (token, expert) and (token, group) with
// all its warps first; otherwise a warp per token does it alone. Group sizes 32, 8, 1 and 64
// (by shift; 64 puts two values of a group on each lane), 24 and 36 (by division), and no
// groups; each on the pre-scored path too except 1.
TEST_F(PermuteTest, DeepSeekGroupsBothPaths) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xd5e3);
  struct Shape {
    int64_t experts;
    int top_k, n_group, topk_group;
    bool bias;
  };
  const Shape shapes[] = {{256, 8, 8, 4, true},   {64, 6, 8, 3, false}, {32, 4, 32, 8, true},
                          {96, 8, 4, 2, true},    {128, 8, 2, 1, true}, {512, 8, 1, 1, true},
                          {256, 8, 32, 8, false}, {288, 6, 8, 3, true}, {512, 8, 8, 2, false}};
  for (const Shape& sh : shapes)
    for (int64_t tokens : {1, 3, 4, 5, 9, 64})
      for (Path path : {Path::kSingleBlock, Path::kMultiBlock}) {
        PermuteCase su;
        su.params.method = RoutingMethod::kDeepSeekV3;
        su.params.n_group = sh.n_group;
        su.params.topk_group = sh.topk_group;
        su.params.correction_bias = sh.bias;
        su.params.routed_scaling_factor = 2.5f;
        su.experts = sh.experts;
        su.top_k = sh.top_k;
        su.bias = sh.bias;
        SCOPED_TRACE("E" + std::to_string(sh.experts) + " groups " + std::to_string(sh.n_group) +
                     " T" + std::to_string(tokens) + " path " + std::to_string(int(path)));
        check_one(su, tokens, path, rng);
      }
}

TEST_F(PermuteTest, ExpertParallelRanksDropOtherExperts) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x1234);
  PermuteCase su;
  su.params.method = RoutingMethod::kSoftmaxTopK;
  su.experts = 64;
  su.top_k = 8;
  su.ep_size = 4;
  for (int rank = 0; rank < 4; ++rank)
    for (int64_t tokens : {1, 64, 513})
      for (Path path : {Path::kSingleBlock, Path::kMultiBlock}) {
        su.ep_rank = rank;
        SCOPED_TRACE("rank " + std::to_string(rank) + " T" + std::to_string(tokens));
        check_one(su, tokens, path, rng);
      }
}

TEST_F(PermuteTest, SkewedCallerIds) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x77);
  PermuteCase su;
  su.params.method = RoutingMethod::kExternal;
  su.experts = 16;
  su.top_k = 2;
  for (int64_t tokens : {1, 64, 4096}) {
    // Every token to experts 5 and 3: one expert holds every first slot, most hold nothing.
    std::vector<int32_t> ids(static_cast<std::size_t>(tokens * 2));
    for (int64_t t = 0; t < tokens; ++t) {
      ids[t * 2] = 5;
      ids[t * 2 + 1] = 3;
    }
    for (Path path : {Path::kSingleBlock, Path::kMultiBlock}) {
      SCOPED_TRACE("T" + std::to_string(tokens));
      check_one(su, tokens, path, rng, &ids);
    }
  }
}

TEST_F(PermuteTest, BadCallerIdsAreDroppedAndReported) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x4242);
  PermuteCase su;
  su.params.method = RoutingMethod::kExternal;
  su.experts = 8;
  su.top_k = 3;
  for (int64_t tokens : {7, 513}) {
    std::vector<int32_t> ids(static_cast<std::size_t>(tokens * 3));
    for (int64_t t = 0; t < tokens; ++t)
      for (int s = 0; s < 3; ++s) ids[t * 3 + s] = static_cast<int32_t>((t + 2 * s) % 8);
    ids[3 * 3 + 1] = 8;           // out of range
    ids[4 * 3 + 0] = -1;          // negative
    ids[5 * 3 + 2] = ids[5 * 3];  // repeat of slot 0
    ids[6 * 3 + 1] = 1 << 30;     // far out of range
    for (Path path : {Path::kSingleBlock, Path::kMultiBlock}) {
      SCOPED_TRACE("T" + std::to_string(tokens));
      check_one(su, tokens, path, rng, &ids);
    }
  }
}

// A timing probe, not a check: MOEKIT_PERMUTE_TIMING=1 prints the mean time of 200
// back-to-back single-block permutes (inputs stay in L2) at decode sizes, so the routing, the
// gather and the rest can be told apart by difference: deepseek-v3 routing against caller ids,
// and each with a 7168-wide row against a 136-wide one.
TEST_F(PermuteTest, DecodeTiming) {
  if (std::getenv("MOEKIT_PERMUTE_TIMING") == nullptr)
    GTEST_SKIP() << "set MOEKIT_PERMUTE_TIMING=1";
  struct Probe {
    const char* name;
    RoutingParams params;
    int64_t experts;
    int top_k;
    int64_t hidden;
  };
  RoutingParams ds;
  ds.method = RoutingMethod::kDeepSeekV3;
  ds.n_group = 8;
  ds.topk_group = 4;
  ds.correction_bias = true;
  ds.routed_scaling_factor = 2.5f;
  RoutingParams ext;
  ext.method = RoutingMethod::kExternal;
  RoutingParams qw;
  qw.method = RoutingMethod::kTopKSoftmax;
  const Probe probes[] = {
      {"deepseek routed H7168", ds, 256, 8, 7168}, {"deepseek routed H136", ds, 256, 8, 136},
      {"deepseek ids H7168", ext, 256, 8, 7168},   {"deepseek ids H136", ext, 256, 8, 136},
      {"qwen3 routed H2048", qw, 128, 8, 2048},    {"qwen3 ids H2048", ext, 128, 8, 2048}};
  std::mt19937_64 rng(devtest::base_seed() ^ 0x7173);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Probe& pr : probes)
    for (int64_t tokens : {1, 8, 64}) {
      std::vector<float> bias(static_cast<std::size_t>(pr.experts));
      for (auto& b : bias) b = 0.1f * normal(rng);
      DeviceBuffer d_bias = to_device(bias);
      Config c;
      const float* bias_ptr = pr.params.correction_bias ? d_bias.as<float>() : nullptr;
      ASSERT_TRUE(
          routing::make_device_routing(pr.params, pr.experts, pr.top_k, bias_ptr, &c.routing).ok());
      c.local_experts = static_cast<int>(pr.experts);
      c.row_bytes = pr.hidden * 2;
      c.max_tokens = tokens;
      ASSERT_TRUE(prepare(c).ok());
      Workspace ws(c);
      std::vector<uint16_t> hidden(static_cast<std::size_t>(tokens * pr.hidden));
      fill_bits(hidden, DType::kBFloat16, normal, rng);
      std::vector<float> logits(static_cast<std::size_t>(tokens * pr.experts));
      for (auto& l : logits) l = normal(rng);
      std::vector<int32_t> ids(static_cast<std::size_t>(tokens * pr.top_k));
      for (std::size_t i = 0; i < ids.size(); ++i)
        ids[i] = static_cast<int32_t>((i * 37) % pr.experts);  // distinct within a token
      std::vector<float> w(ids.size(), 0.125f);
      const DeviceInputs d(hidden, logits, ids, w);
      const Inputs& in = d.in;
      for (int i = 0; i < 20; ++i)
        ASSERT_TRUE(run(c, ws.b, tokens, in, nullptr, Path::kSingleBlock).ok());
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      constexpr int kReps = 200;
      cudaEventRecord(e0);
      for (int i = 0; i < kReps; ++i) (void)run(c, ws.b, tokens, in, nullptr, Path::kSingleBlock);
      cudaEventRecord(e1);
      ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
      float ms = 0.f;
      cudaEventElapsedTime(&ms, e0, e1);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      std::printf("[ timing ] single-block permute %-24s T=%-3lld %7.2f us\n", pr.name,
                  static_cast<long long>(tokens), 1000.0 * ms / kReps);
    }
}

TEST(PermuteLimits, DecodesErrorWords) {
  EXPECT_TRUE(decode_error(kNoError, 8, 2).ok());
  const Status s = decode_error((static_cast<unsigned long long>(7 * 2 + 1) << 32) | 9u, 8, 2);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[7, 1]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("9"), std::string::npos) << s.message();
}

// The GEMM after the permute may read the offsets at its start where the permute's last kernel
// is not their writer; where it is (the single-block kernel gathering small rows), at its flag.
TEST(PermuteLimits, WhenTheOffsetsAreFinalForTheNextKernel) {
  Config c;
  c.routing.top_k = 8;
  c.local_experts = 128;
  c.row_bytes = 4096;  // qwen3's hidden 2048 in bf16
  c.max_tokens = 4096;
  using F = OffsetsFinal;
  EXPECT_EQ(offsets_final_for_next_kernel(c, 0), F::kAfterItsWait);  // nothing runs
  EXPECT_EQ(offsets_final_for_next_kernel(c, 1), F::kAtFlag);      // 32 KB of rows, gathered in it
  EXPECT_EQ(offsets_final_for_next_kernel(c, 4), F::kAtFlag);      // 128 KB: still
  EXPECT_EQ(offsets_final_for_next_kernel(c, 5), F::kAtItsStart);  // the gather kernel follows
  EXPECT_EQ(offsets_final_for_next_kernel(c, kSingleBlockMaxTokens + 1), F::kAtItsStart);
  EXPECT_EQ(offsets_final_for_next_kernel(c, 1, Path::kSingleBlock), F::kAtFlag);
  EXPECT_EQ(offsets_final_for_next_kernel(c, 1, Path::kMultiBlock), F::kAtItsStart);
  c.local_experts = 2;  // a rank with 2 experts keeps at most 2 rows per token
  EXPECT_EQ(offsets_final_for_next_kernel(c, 16), F::kAtFlag);  // 16 x 2 x 4 KB = 128 KB
  EXPECT_EQ(offsets_final_for_next_kernel(c, 17), F::kAtItsStart);
}

}  // namespace
}  // namespace moekit::permute
