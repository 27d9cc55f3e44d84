// The activation kernel (src/activation/activation_device.cu) against activation_math.hpp on
// the host: every kind (gated ones in the engine's blocked gate/up order), clamp with and
// without alpha/beta, FC1 bias, bf16 and fp16. Device exp/tanh/erf may differ from the host's
// by an ulp or two of fp32, so a result may land one element ulp away; rows past offsets[L]
// must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "activation/activation_device.hpp"
#include "activation/activation_math.hpp"
#include "support/gpu.hpp"

namespace moekit::activation {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class ActivationDeviceTest : public GpuTest {};

struct KindCase {
  Kind kind;
  float limit = INFINITY, alpha = 1.0f, beta = 0.0f;
};

TEST_F(ActivationDeviceTest, MatchesHostMath) {
  std::mt19937_64 rng(devtest::base_seed() ^ 0xac71);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const std::vector<KindCase> kinds = {{Kind::kSwiGLU},
                                       {Kind::kSwiGLUClamped, 7.0f, 1.702f, 1.0f},
                                       {Kind::kSwiGLUClamped, 2.0f},
                                       {Kind::kGeGLUTanh},
                                       {Kind::kGeGLUErf},
                                       {Kind::kSiLU},
                                       {Kind::kGeLUTanh},
                                       {Kind::kGeLUErf},
                                       {Kind::kReLU2},
                                       {Kind::kIdentity}};
  for (DType elem : {DType::kBFloat16, DType::kFloat16})
    for (const KindCase& kc : kinds)
      for (bool bias : {false, true}) {
        SCOPED_TRACE(std::string(to_string(elem)) + " kind " + std::to_string(int(kc.kind)) +
                     (bias ? " bias" : ""));
        DeviceActivation a;
        a.elem = elem;
        a.params.kind = kc.kind;
        a.params.limit = kc.limit;
        a.params.alpha = kc.alpha;
        a.params.beta = kc.beta;
        a.intermediate = 136;
        a.local_experts = 3;
        const int64_t I = a.intermediate, R = a.fc1_rows();
        const int64_t max_rows = 70, rows = 61;  // rows [61, 70) must stay untouched
        std::vector<int32_t> offsets = {0, 20, 20, static_cast<int32_t>(rows)};
        std::vector<int32_t> row_expert(max_rows, -1);
        for (int e = 0; e < 3; ++e)
          for (int32_t r = offsets[e]; r < offsets[e + 1]; ++r) row_expert[r] = e;
        std::vector<uint16_t> in(static_cast<std::size_t>(max_rows * R));
        fill_bits(in, elem, normal, rng);
        std::vector<float> b(bias ? 3 * R : 0);
        for (auto& v : b) v = normal(rng);

        DeviceBuffer d_in = to_device(in), d_b = to_device(b), d_off = to_device(offsets);
        DeviceBuffer d_re = to_device(row_expert), d_out(max_rows * I * 2);
        d_out.poison();
        a.fc1_bias = bias ? d_b.as<float>() : nullptr;
        ASSERT_TRUE(prepare_device(a).ok());
        ASSERT_TRUE(run_device(a, d_in.ptr, d_out.ptr, d_re.as<int32_t>(), d_off.as<int32_t>(),
                               max_rows, nullptr)
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = to_host<uint16_t>(d_out.ptr, max_rows * I);

        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < I; ++i) {
            auto at = [&](int64_t col) {
              const float x = from_bits(elem, in[r * R + col]);
              return bias ? x + b[row_expert[r] * R + col] : x;
            };
            float y;
            if (!is_gated(kc.kind)) {
              y = apply_plain(a.params, at(i));
            } else {
              y = apply_gated(a.params, at(blocked_gate_row(i)), at(blocked_up_row(i)));
            }
            const float want = from_bits(elem, to_bits(elem, y));
            const float g = from_bits(elem, got[r * I + i]);
            const float ulp = elem == DType::kBFloat16 ? 0x1p-7f : 0x1p-10f;
            if (!(std::fabs(g - want) <= ulp * std::fabs(want) + 1e-6f) && ++bad <= 3)
              ADD_FAILURE() << "row " << r << " col " << i << ": device " << g << ", host " << want;
          }
        EXPECT_EQ(bad, 0);
        int64_t touched = 0;
        for (int64_t i = rows * I; i < max_rows * I; ++i) touched += got[i] != 0xffff;
        EXPECT_EQ(touched, 0) << "elements past offsets[L] were written";
      }
}

// The device clamps with min.NaN / max.NaN (activation_math.hpp): a NaN gate or up stays NaN
// through the clamp, as torch.clamp and the host's comparisons keep it; finite values around
// the limit still match the host.
TEST_F(ActivationDeviceTest, ClampedKindKeepsNaN) {
  for (DType elem : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(to_string(elem));
    DeviceActivation a;
    a.elem = elem;
    a.params.kind = Kind::kSwiGLUClamped;
    a.params.limit = 7.0f;
    a.params.alpha = 1.702f;
    a.params.beta = 1.0f;
    a.intermediate = 16;
    a.local_experts = 1;
    const int64_t I = a.intermediate, R = a.fc1_rows();
    std::vector<int32_t> offsets = {0, 1}, row_expert = {0};
    std::vector<uint16_t> in(static_cast<std::size_t>(R));
    for (int64_t c = 0; c < R; ++c) in[c] = to_bits(elem, -10.0f + 1.5f * (c % 14));  // +-limit
    const uint16_t nan = elem == DType::kBFloat16 ? 0x7fc0 : 0x7e00;
    in[blocked_gate_row(0)] = nan;  // output 0: NaN gate
    in[blocked_up_row(1)] = nan;    // output 1: NaN up
    DeviceBuffer d_in = to_device(in), d_off = to_device(offsets), d_re = to_device(row_expert);
    DeviceBuffer d_out(I * 2);
    d_out.poison();
    ASSERT_TRUE(prepare_device(a).ok());
    ASSERT_TRUE(
        run_device(a, d_in.ptr, d_out.ptr, d_re.as<int32_t>(), d_off.as<int32_t>(), 1, nullptr)
            .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host<uint16_t>(d_out.ptr, I);
    EXPECT_TRUE(std::isnan(from_bits(elem, got[0])));
    EXPECT_TRUE(std::isnan(from_bits(elem, got[1])));
    for (int64_t i = 2; i < I; ++i) {
      const float want = from_bits(
          elem, to_bits(elem, apply_gated(a.params, from_bits(elem, in[blocked_gate_row(i)]),
                                          from_bits(elem, in[blocked_up_row(i)]))));
      const float g = from_bits(elem, got[i]);
      const float ulp = elem == DType::kBFloat16 ? 0x1p-7f : 0x1p-10f;
      EXPECT_LE(std::fabs(g - want), ulp * std::fabs(want) + 1e-6f) << "output " << i;
    }
  }
}

__global__ void x_sigmoid_fast_kernel(const float* x, float a, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x_sigmoid_fast(x[i], a);
}

// The fused FC1 epilogue's x * sigmoid(a x) through tanh.approx (activation_math.hpp), against
// the exact value in double: within 2^-14 |x| over [-40, 40] in steps of 2^-8 (a = 1, SwiGLU;
// a = 1.702, gpt-oss), where a bf16 ulp of x is 2^-8 |x| or more (the H200 measured 2^-18 |x|);
// +-inf and NaN as the exact form gives them (+inf, NaN, NaN).
TEST_F(ActivationDeviceTest, FastXSigmoidWithinItsBound) {
  std::vector<float> x;
  for (int i = -40 * 256; i <= 40 * 256; ++i) x.push_back(float(i) / 256.0f);
  const int finite = int(x.size());
  x.insert(x.end(), {INFINITY, -INFINITY, NAN});
  DeviceBuffer d_x = to_device(x), d_out(x.size() * sizeof(float));
  for (float a : {1.0f, 1.702f}) {
    SCOPED_TRACE("a = " + std::to_string(a));
    d_out.poison();
    const int n = int(x.size());
    x_sigmoid_fast_kernel<<<(n + 255) / 256, 256>>>(d_x.as<float>(), a, d_out.as<float>(), n);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host<float>(d_out.ptr, x.size());
    double worst = 0;  // the largest |error| / |x|
    for (int i = 0; i < finite; ++i) {
      const double xd = x[i], exact = xd / (1.0 + std::exp(-double(a) * xd));
      const double err = std::fabs(double(got[i]) - exact);
      EXPECT_LE(err, 0x1p-14 * std::fabs(xd) + 1e-30) << "x = " << x[i];
      if (xd != 0) worst = std::max(worst, err / std::fabs(xd));
    }
    std::printf("x_sigmoid_fast(a = %.3f): largest |error| / |x| = %.3g (2^%.2f)\n", a, worst,
                std::log2(worst));
    EXPECT_EQ(got[finite], INFINITY);
    EXPECT_TRUE(std::isnan(got[finite + 1]));
    EXPECT_TRUE(std::isnan(got[finite + 2]));
  }
}

TEST(ActivationDeviceLimits, RefusesWhatItCannotRun) {
  DeviceActivation a;
  a.elem = DType::kFloat32;
  a.intermediate = 64;
  EXPECT_EQ(prepare_device(a).code(), ErrorCode::kUnsupported);
  a.elem = DType::kBFloat16;
  a.intermediate = 60;
  EXPECT_EQ(prepare_device(a).code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace moekit::activation
