// Finalize against the host sum over slots in slot order (fp32 fma, one rounding): bit-exact,
// bf16 and fp16, with and without the FC2 bias, slots that do not run here (row -1), tokens
// with no local slot (zeros), output poisoned before the run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "finalize/finalize.hpp"
#include "support/gpu.hpp"

namespace moekit::finalize {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class FinalizeTest : public GpuTest {};

TEST_F(FinalizeTest, MatchesHostSumInSlotOrder) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xf1a1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType elem : {DType::kBFloat16, DType::kFloat16})
    for (bool bias : {false, true})
      for (int k : {1, 2, 8, 11})
        for (int64_t tokens : {1, 7, 513}) {
          SCOPED_TRACE(std::string(to_string(elem)) + (bias ? " bias" : "") + " k" +
                       std::to_string(k) + " T" + std::to_string(tokens));
          const int64_t H = 264, L = 5;
          // Slots: every third one does not run here; token 0 has no local slot at all.
          std::vector<int32_t> slot_row(static_cast<std::size_t>(tokens * k), -1);
          std::vector<int32_t> slot_expert(slot_row.size(), -1);
          std::vector<float> w(slot_row.size());
          std::vector<int64_t> local;
          for (int64_t i = 0; i < tokens * k; ++i) {
            w[i] = normal(rng);
            if (i / k != 0 && i % 3 != 2) local.push_back(i);
          }
          const int32_t rows = static_cast<int32_t>(local.size());
          std::vector<int32_t> order(local.size());
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), rng);  // rows in any order
          for (std::size_t j = 0; j < local.size(); ++j) {
            slot_row[local[j]] = order[j];
            slot_expert[local[j]] = static_cast<int32_t>(local[j] % L);
          }
          std::vector<uint16_t> y(static_cast<std::size_t>(std::max(rows, 1) * H));
          fill_bits(y, elem, normal, rng);
          std::vector<float> b(bias ? L * H : 0);
          for (auto& v : b) v = normal(rng);

          std::vector<uint16_t> want(static_cast<std::size_t>(tokens * H));
          for (int64_t t = 0; t < tokens; ++t)
            for (int64_t h = 0; h < H; ++h) {
              float acc = 0.0f;
              for (int s = 0; s < k; ++s) {
                const int32_t r = slot_row[t * k + s];
                if (r < 0) continue;
                float v = from_bits(elem, y[r * H + h]);
                if (bias) v += b[slot_expert[t * k + s] * H + h];
                acc = std::fmaf(w[t * k + s], v, acc);
              }
              want[t * H + h] = to_bits(elem, acc);
            }

          DeviceBuffer d_y = to_device(y), d_rows = to_device(slot_row), d_w = to_device(w);
          DeviceBuffer d_e = to_device(slot_expert), d_b = to_device(b);
          DeviceBuffer d_out(want.size() * 2);
          d_out.poison();
          DeviceFinalize f;
          f.elem = elem;
          f.hidden = H;
          f.top_k = k;
          f.fc2_bias = bias ? d_b.as<float>() : nullptr;
          ASSERT_TRUE(prepare(f).ok());
          ASSERT_TRUE(run(f, tokens, d_y.ptr, d_rows.as<int32_t>(), d_w.as<float>(),
                          d_e.as<int32_t>(), d_out.ptr, nullptr)
                          .ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto got = to_host<uint16_t>(d_out.ptr, want.size());
          int64_t diff = 0;
          for (std::size_t i = 0; i < want.size(); ++i) diff += got[i] != want[i];
          EXPECT_EQ(diff, 0) << "elements differing from the host sum";
          for (int64_t h = 0; h < H; ++h) ASSERT_EQ(got[h], 0) << "token 0 must be zeros";
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
}

}  // namespace
}  // namespace moekit::finalize
