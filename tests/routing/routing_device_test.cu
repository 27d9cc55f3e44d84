// Device routing (route_device) against route_host for every method on fresh random logits
// (NaN and -inf sprinkled in), on logits built for exact ties, for E up to 512 and tokens 1, 7,
// 64, 513 and 4096. Ids must match exactly; weights exactly, except the full softmax's to a few
// fp32 ulps (the host sums its terms in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "routing/routing.hpp"
#include "routing/routing_device.hpp"
#include "routing/weight_math.hpp"
#include "support/gpu.hpp"

namespace moekit::routing {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

enum class Logits { kNormal, kTies };

struct Case {
  RoutingParams params;
  int64_t experts = 0, top_k = 0;
  std::string name;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](RoutingMethod m, int64_t e, int64_t k, int n_group = 1, int topk_group = 1,
                 bool bias = false, float scale = 1.0f, bool renorm = true) {
    Case c;
    c.params.method = m;
    c.params.n_group = n_group;
    c.params.topk_group = topk_group;
    c.params.correction_bias = bias;
    c.params.routed_scaling_factor = scale;
    c.params.renormalize = renorm;
    c.experts = e;
    c.top_k = k;
    c.name = std::string(to_string(m)) + " E" + std::to_string(e) + " k" + std::to_string(k) +
             " g" + std::to_string(n_group) + "/" + std::to_string(topk_group) +
             (bias ? " bias" : "") + " scale " + std::to_string(scale) + (renorm ? "" : " raw");
    out.push_back(c);
  };
  for (auto m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax}) {
    add(m, 8, 2);
    add(m, 60, 4, 1, 1, false, 1.5f);  // E not a multiple of 32
    add(m, 128, 8);
    add(m, 512, 32);
  }
  add(RoutingMethod::kLlama4, 16, 1);
  add(RoutingMethod::kLlama4, 128, 1, 1, 1, false, 2.0f);
  add(RoutingMethod::kLlama4, 64, 4);  // any top_k, as transformers' Llama4Router
  add(RoutingMethod::kLlama4, 300, 8, 1, 1, false, 1.5f);
  add(RoutingMethod::kDeepSeekV3, 256, 8, 8, 4, true, 2.5f);
  add(RoutingMethod::kDeepSeekV3, 64, 6, 8, 3, false, 1.0f, false);
  add(RoutingMethod::kDeepSeekV3, 32, 4, 32, 8, true);  // one expert per group
  add(RoutingMethod::kDeepSeekV3, 512, 8, 1, 1, true, 1.0f);
  add(RoutingMethod::kDeepSeekV3, 96, 8, 3, 2, true, 1.0f);
  return out;
}

std::vector<float> make_logits(Logits kind, int64_t n, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 999);
  // Ties: values whose sigmoid and exp are exact or equal on both sides (equal inputs).
  const float levels[] = {-1.0f, 0.0f, 0.5f, 0.5f, 1.0f, 2.0f};
  for (auto& x : v) {
    x = kind == Logits::kNormal ? normal(rng) : levels[pick(rng) % 6];
    const int r = pick(rng);
    if (r == 0) x = std::numeric_limits<float>::quiet_NaN();
    if (r == 1) x = -std::numeric_limits<float>::infinity();
    if (r == 2 && kind == Logits::kTies) x = -0.0f;
  }
  return v;
}

class RoutingDeviceTest : public GpuTest {};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Per argument d: exp_nonpositive(d), a weight from it, sigmoid_fp32(d) and sigmoid_fp32(-d).
constexpr int kWeightMathOuts = 4;
struct WeightMathOuts {
  float v[kWeightMathOuts];
};
__host__ __device__ WeightMathOuts weight_math_of(float d) {
  const float t = exp_nonpositive(d);
  return {{t, normalized_weight(t, 1.0 + static_cast<double>(-d), 1.5f), sigmoid_fp32(d),
           sigmoid_fp32(-d)}};
}
__global__ void weight_math_kernel(const float* d, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const WeightMathOuts o = weight_math_of(d[i]);
  for (int j = 0; j < kWeightMathOuts; ++j) out[i * kWeightMathOuts + j] = o.v[j];
}

// The weights' fp32 arithmetic gives the host's bits on the GPU (no contraction, no approximate
// divide), over every 4099th float of [-88, 0] (the sigmoid at both signs) and the edges.
TEST_F(RoutingDeviceTest, WeightMathMatchesHostBitForBit) {
  std::vector<float> d = {0.0f, -0.0f, -87.0f, -87.5f, -INFINITY, NAN};
  for (uint32_t bits = 0x80000000u; bits <= bits_of(-88.0f); bits += 4099)
    d.push_back(float_of(bits));
  const int n = static_cast<int>(d.size());
  DeviceBuffer d_d = to_device(d), d_out(d.size() * kWeightMathOuts * 4);
  d_out.poison();
  weight_math_kernel<<<(n + 255) / 256, 256>>>(d_d.as<float>(), d_out.as<float>(), n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host<float>(d_out.ptr, d.size() * kWeightMathOuts);
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const WeightMathOuts want = weight_math_of(d[i]);
    for (int j = 0; j < kWeightMathOuts; ++j) {
      const float g = got[i * kWeightMathOuts + j], w = want.v[j];
      if (bits_of(g) != bits_of(w) && !(std::isnan(g) && std::isnan(w)) && ++bad <= 3)
        ADD_FAILURE() << "d " << d[i] << " output " << j << ": device " << g << ", host " << w;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(RoutingDeviceTest, MatchesHostForEveryMethod) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0x5157);
  for (const Case& c : cases()) {
    for (Logits kind : {Logits::kNormal, Logits::kTies}) {
      for (int64_t tokens : {1, 7, 64, 513, 4096}) {
        SCOPED_TRACE(c.name + (kind == Logits::kTies ? " ties" : " normal") + " T" +
                     std::to_string(tokens));
        const int64_t E = c.experts, k = c.top_k;
        std::vector<float> logits = make_logits(kind, tokens * E, rng);
        std::vector<float> bias;
        if (c.params.correction_bias) {
          std::uniform_real_distribution<float> u(-0.5f, 0.5f);
          bias.resize(static_cast<std::size_t>(E));
          for (auto& b : bias) b = kind == Logits::kTies ? 0.25f * std::floor(4 * u(rng)) : u(rng);
        }
        std::vector<int32_t> ids(static_cast<std::size_t>(tokens * k));
        std::vector<float> w(ids.size());
        ASSERT_TRUE(route_host(c.params, tokens, E, k, logits.data(),
                               bias.empty() ? nullptr : bias.data(), ids.data(), w.data())
                        .ok());

        DeviceBuffer d_logits = to_device(logits), d_bias = to_device(bias);
        DeviceBuffer d_ids(ids.size() * 4), d_w(w.size() * 4);
        d_ids.poison();
        d_w.poison();
        DeviceRouting r;
        ASSERT_TRUE(
            make_device_routing(c.params, E, k, bias.empty() ? nullptr : d_bias.as<float>(), &r)
                .ok());
        ASSERT_TRUE(prepare_route_device(r).ok());
        ASSERT_TRUE(route_device(r, tokens, d_logits.as<float>(), d_ids.as<int32_t>(),
                                 d_w.as<float>(), nullptr)
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got_ids = to_host<int32_t>(d_ids.ptr, ids.size());
        const auto got_w = to_host<float>(d_w.ptr, w.size());
        int64_t bad_ids = 0, bad_w = 0;
        for (std::size_t i = 0; i < ids.size(); ++i) {
          if (got_ids[i] != ids[i]) {
            if (++bad_ids <= 3)
              ADD_FAILURE() << "token " << i / k << " slot " << i % k << ": device id "
                            << got_ids[i] << ", host " << ids[i];
            continue;
          }
          // Every sum but the full softmax's runs in slot order on both sides: the same bits.
          const float tol = c.params.method == RoutingMethod::kSoftmaxTopK
                                ? 4e-7f * std::fabs(w[i]) + 1e-30f
                                : 0.0f;
          if (!(std::fabs(got_w[i] - w[i]) <= tol) && ++bad_w <= 3)
            ADD_FAILURE() << "token " << i / k << " slot " << i % k << ": device weight "
                          << got_w[i] << ", host " << w[i];
        }
        ASSERT_EQ(bad_ids, 0);
        ASSERT_EQ(bad_w, 0);
      }
    }
  }
}

// Host-side limits: no GPU needed.
TEST(RoutingDeviceLimits, RefusesWhatTheKernelsCannotRun) {
  RoutingParams p;
  p.method = RoutingMethod::kTopKSoftmax;
  DeviceRouting r;
  EXPECT_EQ(make_device_routing(p, 1024, 8, nullptr, &r).code(), ErrorCode::kUnsupported);
  EXPECT_EQ(make_device_routing(p, 128, 33, nullptr, &r).code(), ErrorCode::kUnsupported);
  EXPECT_EQ(make_device_routing(p, 4, 8, nullptr, &r).code(), ErrorCode::kUnsupported);
  p.method = RoutingMethod::kDeepSeekV3;
  p.n_group = 64;
  p.topk_group = 4;
  EXPECT_EQ(make_device_routing(p, 256, 8, nullptr, &r).code(), ErrorCode::kUnsupported);
  p.n_group = 8;
  p.correction_bias = true;
  EXPECT_EQ(make_device_routing(p, 256, 8, nullptr, &r).code(), ErrorCode::kInvalidArgument);
  p.method = RoutingMethod::kExternal;
  p.correction_bias = false;
  ASSERT_TRUE(make_device_routing(p, 256, 8, nullptr, &r).ok());
  EXPECT_EQ(route_device(r, 4, nullptr, nullptr, nullptr, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace moekit::routing
