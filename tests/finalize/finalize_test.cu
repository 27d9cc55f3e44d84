// Finalize against the host sum over slots in slot order (fp32 fma, one rounding): bit-exact,
// bf16 and fp16, with and without the FC2 bias, slots that do not run here (row -1), tokens
// with no local slot (zeros), output poisoned before the run; and under programmatic dependent
// launch, settled slots read early while FC2's output is still being written. The same for the
// sum over slices of fp32 partials (run_slices, one token's sliced kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "finalize/finalize.hpp"
#include "support/gpu.hpp"
#include "support/pdl_writer.cuh"

namespace moekit::finalize {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class FinalizeTest : public GpuTest {};

// A finalize of `elem`, H and k, with the FC2 bias `bias` (device) or none, its kernels loaded.
DeviceFinalize prepared(DType elem, int64_t H, int k, const float* bias) {
  DeviceFinalize f;
  f.elem = elem;
  f.hidden = H;
  f.top_k = k;
  f.fc2_bias = bias;
  EXPECT_TRUE(prepare(f).ok());
  return f;
}

// Slots of `tokens` x k: every third one does not run here; token 0 has no local slot at all.
// Rows in a random order; y and the bias random; `want` the host sum in slot order.
struct Case {
  std::vector<int32_t> slot_row, slot_expert;
  std::vector<float> w, b;
  std::vector<uint16_t> y, want;
};

Case make_case(DType elem, bool bias, int k, int64_t tokens, int64_t H, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t L = 5;
  Case c;
  c.slot_row.assign(static_cast<std::size_t>(tokens * k), -1);
  c.slot_expert.assign(c.slot_row.size(), -1);
  c.w.resize(c.slot_row.size());
  std::vector<int64_t> local;
  for (int64_t i = 0; i < tokens * k; ++i) {
    c.w[i] = normal(rng);
    if (i / k != 0 && i % 3 != 2) local.push_back(i);
  }
  const int32_t rows = static_cast<int32_t>(local.size());
  std::vector<int32_t> order(local.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);  // rows in any order
  for (std::size_t j = 0; j < local.size(); ++j) {
    c.slot_row[local[j]] = order[j];
    c.slot_expert[local[j]] = static_cast<int32_t>(local[j] % L);
  }
  c.y.resize(static_cast<std::size_t>(std::max(rows, 1) * H));
  fill_bits(c.y, elem, normal, rng);
  c.b.resize(bias ? L * H : 0);
  for (auto& v : c.b) v = normal(rng);
  c.want.resize(static_cast<std::size_t>(tokens * H));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int s = 0; s < k; ++s) {
        const int32_t r = c.slot_row[t * k + s];
        if (r < 0) continue;
        float v = from_bits(elem, c.y[r * H + h]);
        if (bias) v += c.b[c.slot_expert[t * k + s] * H + h];
        acc = std::fmaf(c.w[t * k + s], v, acc);
      }
      c.want[t * H + h] = to_bits(elem, acc);
    }
  return c;
}

void expect_exact(const Case& c, const DeviceBuffer& d_out, int64_t H) {
  const auto got = to_host<uint16_t>(d_out.ptr, c.want.size());
  int64_t diff = 0;
  for (std::size_t i = 0; i < c.want.size(); ++i) diff += got[i] != c.want[i];
  EXPECT_EQ(diff, 0) << "elements differing from the host sum";
  for (int64_t h = 0; h < H; ++h) ASSERT_EQ(got[h], 0) << "token 0 must be zeros";
}

TEST_F(FinalizeTest, MatchesHostSumInSlotOrder) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf1a1);
  for (DType elem : {DType::kBFloat16, DType::kFloat16})
    for (bool bias : {false, true})
      for (int k : {1, 2, 3, 4, 8, 11})
        for (int64_t tokens : {1, 7, 513})
          for (bool settled : {false, true}) {
            SCOPED_TRACE(std::string(to_string(elem)) + (bias ? " bias" : "") + " k" +
                         std::to_string(k) + " T" + std::to_string(tokens) +
                         (settled ? " slots_ready" : ""));
            const int64_t H = 264;
            const Case c = make_case(elem, bias, k, tokens, H, rng);
            DeviceBuffer d_y = to_device(c.y), d_rows = to_device(c.slot_row);
            DeviceBuffer d_w = to_device(c.w), d_e = to_device(c.slot_expert);
            DeviceBuffer d_b = to_device(c.b);
            DeviceBuffer d_out(c.want.size() * 2);
            d_out.poison();
            const DeviceFinalize f = prepared(elem, H, k, bias ? d_b.as<float>() : nullptr);
            ASSERT_TRUE(run(f, tokens, d_y.ptr, d_rows.as<int32_t>(), d_w.as<float>(),
                            d_e.as<int32_t>(), d_out.ptr, nullptr, settled)
                            .ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            expect_exact(c, d_out, H);
          }
}

// Past one item per thread of the grid (132 x 16 blocks of 256) each thread sums 4 items at a
// time where k <= 2 without a bias: here all four live in the first step, and the second holds
// dead items. The other cases as a check that the large-T pick keeps them right.
TEST_F(FinalizeTest, ManyItemsPerThreadMatchHostSum) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf1a3);
  // 128 vectors a token: 2176000 items, 4.02 per thread of the grid
  const int64_t H = 1024, tokens = 17000;
  for (bool bias : {false, true})
    for (int k : {2, 4}) {
      SCOPED_TRACE(std::string(bias ? "bias" : "no bias") + " k" + std::to_string(k));
      const Case c = make_case(DType::kBFloat16, bias, k, tokens, H, rng);
      DeviceBuffer d_y = to_device(c.y), d_rows = to_device(c.slot_row);
      DeviceBuffer d_w = to_device(c.w), d_e = to_device(c.slot_expert), d_b = to_device(c.b);
      DeviceBuffer d_out(c.want.size() * 2);
      d_out.poison();
      const DeviceFinalize f = prepared(DType::kBFloat16, H, k, bias ? d_b.as<float>() : nullptr);
      ASSERT_TRUE(run(f, tokens, d_y.ptr, d_rows.as<int32_t>(), d_w.as<float>(), d_e.as<int32_t>(),
                      d_out.ptr, nullptr, true)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expect_exact(c, d_out, H);
    }
}

// Lets its dependent start at once, spins ~`ns`, then writes the real y over the stale one.
__global__ void slow_y_writer(uint4* y, const uint4* src, int64_t vecs, long long ns) {
  launch_dependents_then_spin(ns);
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) y[i] = src[i];
}

TEST_F(FinalizeTest, SettledSlotsStillWaitForFc2Output) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf1a2);
  const int64_t H = 512, tokens = 7;
  const int k = 8;
  const Case c = make_case(DType::kBFloat16, true, k, tokens, H, rng);
  DeviceBuffer d_src = to_device(c.y), d_rows = to_device(c.slot_row);
  DeviceBuffer d_w = to_device(c.w), d_e = to_device(c.slot_expert), d_b = to_device(c.b);
  DeviceBuffer d_y(c.y.size() * 2), d_out(c.want.size() * 2);
  d_y.poison();  // stale until the slow writer runs
  d_out.poison();
  const DeviceFinalize f = prepared(DType::kBFloat16, H, k, d_b.as<float>());
  slow_y_writer<<<1, 256>>>(static_cast<uint4*>(d_y.ptr), static_cast<const uint4*>(d_src.ptr),
                            static_cast<int64_t>(c.y.size() / 8), 200000);
  ASSERT_TRUE(run(f, tokens, d_y.ptr, d_rows.as<int32_t>(), d_w.as<float>(), d_e.as<int32_t>(),
                  d_out.ptr, nullptr, true)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_exact(c, d_out, H);
}

// run_slices: each slot's row is the sum of `slices` fp32 partial rows. The host sum follows the
// kernel's order: lane l (of kLanes = 64) sums pairs (slot, slice) l, l + 64, ... by fmaf of the
// slot's weight; the lanes add in the kernel's tree (pairs within each 8, then the 8 sums in
// order); then the weighted biases in slot order; one rounding.
std::vector<uint16_t> host_slices(DType elem, const Case& c, const std::vector<float>& parts,
                                  int64_t slices, int k, int64_t tokens, int64_t H, bool bias) {
  constexpr int kLanes = 64, kLanesPerWarp = 8;
  std::vector<uint16_t> want(static_cast<std::size_t>(tokens * H));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float lane_sum[kLanes];
      for (int l = 0; l < kLanes; ++l) {
        float acc = 0.0f;
        for (int64_t p = l; p < k * slices; p += kLanes) {
          const int64_t q = p / slices, s = p % slices;
          const int32_t r = c.slot_row[t * k + q];
          if (r >= 0) acc = std::fmaf(c.w[t * k + q], parts[(r * slices + s) * H + h], acc);
        }
        lane_sum[l] = acc;
      }
      // The kernel's tree: lanes l and l ^ m within a warp's 8 (m = 1, 2, 4), then the warps.
      for (int m = 1; m < kLanesPerWarp; m *= 2) {
        float next[kLanes];
        for (int l = 0; l < kLanes; ++l) next[l] = lane_sum[l] + lane_sum[l ^ m];
        std::copy(next, next + kLanes, lane_sum);
      }
      float sum = lane_sum[0];
      for (int l = kLanesPerWarp; l < kLanes; l += kLanesPerWarp) sum += lane_sum[l];
      for (int q = 0; bias && q < k; ++q)
        if (c.slot_row[t * k + q] >= 0)
          sum = std::fmaf(c.w[t * k + q], c.b[c.slot_expert[t * k + q] * H + h], sum);
      want[t * H + h] = to_bits(elem, sum);
    }
  return want;
}

// Bit-exact against host_slices, outputs poisoned first; the last case as the dependent of a
// kernel that writes the partials late (settled slots are read before the wait, the partials
// after it). H 264: the last block's column quads are partial.
TEST_F(FinalizeTest, SlicesMatchHostSumInOrder) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf1a3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t H = 264;
  for (DType elem : {DType::kBFloat16, DType::kFloat16})
    for (bool bias : {false, true})
      for (int k : {1, 4, 8})
        for (int64_t slices : {1, 9, 90})
          for (int64_t tokens : {1, 3}) {
            const bool late = elem == DType::kBFloat16 && bias && k == 8 && slices == 90;
            SCOPED_TRACE(std::string(to_string(elem)) + (bias ? " bias" : "") + " k" +
                         std::to_string(k) + " slices " + std::to_string(slices) + " T" +
                         std::to_string(tokens) + (late ? " late partials" : ""));
            Case c = make_case(elem, bias, k, tokens, H, rng);
            const int64_t rows = int64_t(c.y.size()) / H;
            std::vector<float> parts(static_cast<std::size_t>(rows * slices * H));
            for (auto& v : parts) v = normal(rng);
            const std::vector<uint16_t> want =
                host_slices(elem, c, parts, slices, k, tokens, H, bias);
            DeviceBuffer d_src = to_device(parts), d_rows = to_device(c.slot_row);
            DeviceBuffer d_w = to_device(c.w), d_e = to_device(c.slot_expert);
            DeviceBuffer d_b = to_device(c.b), d_out(want.size() * 2);
            DeviceBuffer d_parts(parts.size() * 4);
            if (late)
              d_parts.poison();
            else
              ASSERT_EQ(
                  cudaMemcpy(d_parts.ptr, parts.data(), d_parts.bytes, cudaMemcpyHostToDevice),
                  cudaSuccess);
            d_out.poison();
            const DeviceFinalize f = prepared(elem, H, k, bias ? d_b.as<float>() : nullptr);
            if (late)
              slow_y_writer<<<1, 256>>>(static_cast<uint4*>(d_parts.ptr),
                                        static_cast<const uint4*>(d_src.ptr),
                                        static_cast<int64_t>(d_parts.bytes / 16), 200000);
            ASSERT_TRUE(run_slices(f, tokens, d_parts.as<float>(), slices, d_rows.as<int32_t>(),
                                   d_w.as<float>(), d_e.as<int32_t>(), d_out.ptr, nullptr)
                            .ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            c.want = want;
            expect_exact(c, d_out, H);
          }
}

TEST(FinalizeLimits, RefusesWhatItCannotRun) {
  DeviceFinalize f;
  f.elem = DType::kFloat32;
  f.hidden = 64;
  f.top_k = 2;
  EXPECT_EQ(prepare(f).code(), ErrorCode::kUnsupported);
  f.elem = DType::kBFloat16;
  f.hidden = 60;
  EXPECT_EQ(prepare(f).code(), ErrorCode::kUnsupported);
  // The sliced finalize: at most 32 slots, at least one slice (nothing is launched).
  f.hidden = 64;
  f.top_k = 33;
  const Status many = run_slices(f, 1, nullptr, 4, nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(many.code(), ErrorCode::kUnsupported);
  EXPECT_NE(many.message().find("33"), std::string::npos) << many.message();
  f.top_k = 2;
  const Status none = run_slices(f, 1, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(none.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(none.message().find("slices 0"), std::string::npos) << none.message();
}

}  // namespace
}  // namespace moekit::finalize
