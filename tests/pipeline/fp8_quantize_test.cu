// The FP8 engine's two quantizing kernels against the host's rule (quant::prepare_activations,
// pipeline/fp8_quantize.cuh): the quantizing gather (permute::gather_quantized) and the quantizing
// activation (activation::run_device_quantized). The gather's codes and scales must be bit-equal
// to the host's (its arithmetic is a bf16 product, a max, a division and a rounding); the
// activation's where the activation is exact arithmetic (ReLU^2, identity), and within one e4m3
// step where device exp/tanh/erf differ from the host's by an ulp. Special values: all-zero
// groups (codes 0, no NaN), a value at exactly 448, subnormal codes, saturation of a static
// scale, NaN; the three scale modes (per 128 columns, static, per token); dropped slots, rows
// past offsets[L] and their weights stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "activation/activation_device.hpp"
#include "activation/activation_math.hpp"
#include "common/numeric.hpp"
#include "permute/permute.hpp"
#include "support/gpu.hpp"

namespace moekit {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

constexpr int64_t kGroup = 128;

float round_bf16(float x) { return numeric::bf16_to_float(numeric::float_to_bf16(x)); }

// The host's codes and scale of one group of 128 values (static scale when fixed > 0).
void quantize_group(const float* x, float fixed, uint8_t* codes, float* scale) {
  float s = fixed;
  if (!(fixed > 0.0f)) {
    float amax = 0.0f;
    for (int64_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(x[i]));
    s = std::max(amax, 1e-10f) / 448.0f;
  }
  for (int64_t i = 0; i < kGroup; ++i) codes[i] = numeric::float_to_e4m3_hd(x[i] / s);
  *scale = s;
}

// The host's per-token scale of a row: max(amax / 448, 1 / (448 * 512)).
float token_scale(const std::vector<float>& x) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  return std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
}

// Rows of H values with the special groups the rule must get right, then random ones; a NaN in
// row 2 where `with_nan`.
std::vector<float> special_rows(int64_t rows, int64_t H, std::mt19937_64& rng, bool with_nan) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(rows * H));
  for (auto& x : v) x = round_bf16(normal(rng));
  for (int64_t c = 0; c < H; ++c) v[c] = 0.0f;  // row 0: all zero
  if (rows > 1) {
    float* r = v.data() + H;
    r[0] = 448.0f;  // group 0: its amax maps to exactly 448
    for (int64_t c = 1; c < kGroup; ++c) r[c] = round_bf16(std::ldexp(1.0f, -12) * (c % 7));
    r[kGroup] = 1.0f;  // group 1: one large value, the rest subnormal codes
    for (int64_t c = kGroup + 1; c < 2 * kGroup; ++c) r[c] = std::ldexp(1.0f, -14);
  }
  if (with_nan && rows > 2) v[2 * H + 5] = NAN;  // row 2: a NaN in its first group
  return v;
}

class Fp8QuantizeTest : public GpuTest {};

TEST_F(Fp8QuantizeTest, GatherMatchesTheHostBitForBit) {
  std::mt19937_64 rng(base_seed() ^ 0xf8a1);
  // 10 groups a row: the kernel's chunks of 8 groups, one whole and one partial.
  const int64_t T = 7, k = 3, H = 1280, L = 4, groups = H / kGroup;
  const std::vector<float> hidden = special_rows(T, H, rng, true);
  std::vector<uint16_t> hidden_bits(hidden.size());
  for (std::size_t i = 0; i < hidden.size(); ++i)
    hidden_bits[i] = numeric::float_to_bf16(hidden[i]);
  // Slots: a permutation of rows, two dropped (-1), experts cycling.
  const int64_t slots = T * k;
  std::vector<int32_t> slot_row(slots), slot_expert(slots);
  std::vector<int32_t> perm(slots);
  for (int64_t s = 0; s < slots; ++s) perm[s] = static_cast<int32_t>(s);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t s = 0; s < slots; ++s) {
    slot_row[s] = (s == 4 || s == 11) ? -1 : perm[s];
    slot_expert[s] = slot_row[s] < 0 ? -1 : static_cast<int32_t>(s % L);
  }
  std::uniform_real_distribution<float> unit(0.1f, 1.0f);
  std::vector<float> weights(slots);
  for (auto& w : weights) w = unit(rng);
  const std::vector<float> static_scales = {0.5f / 448, 1.0f / 448, 2.0f / 448, 4.0f / 448};

  for (const bool on_input : {false, true})
    for (const int mode : {0, 1, 2}) {  // per 128 columns, static, per token
      const bool fixed = mode == 1, per_token = mode == 2;
      SCOPED_TRACE(std::string(on_input ? "weight on input" : "weight on output") +
                   (fixed       ? ", static scales"
                    : per_token ? ", per token"
                                : ", per 128 columns"));
      permute::Config c;
      c.routing.top_k = static_cast<int>(k);
      c.local_experts = static_cast<int>(L);
      c.row_bytes = H * 2;
      c.max_tokens = T;
      DeviceBuffer d_hidden = to_device(hidden_bits), d_row = to_device(slot_row),
                   d_expert = to_device(slot_expert), d_weights = to_device(weights),
                   d_static = to_device(static_scales);
      DeviceBuffer values(slots * H), scales(slots * groups * sizeof(float));
      values.poison();
      scales.poison();
      permute::Buffers b;
      b.slot_row = d_row.as<int32_t>();
      b.slot_expert = d_expert.as<int32_t>();
      b.topk_weights = d_weights.as<float>();
      permute::QuantizedRows out;
      out.values = values.ptr;
      out.scales = scales.as<float>();
      out.static_scale = fixed ? d_static.as<float>() : nullptr;
      out.weight_on_input = on_input;
      out.per_token = per_token;
      ASSERT_TRUE(permute::prepare_gather_quantized().ok());
      const Status st = permute::gather_quantized(c, b, T, d_hidden.ptr, out, nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = to_host<uint8_t>(values.ptr, slots * H);
      const auto got_scales = to_host<float>(scales.ptr, slots * groups);
      const auto got_weights = to_host<float>(d_weights.ptr, slots);
      std::vector<bool> written(slots, false);
      for (int64_t s = 0; s < slots; ++s) {
        const int32_t r = slot_row[s];
        EXPECT_EQ(got_weights[s], on_input && r >= 0 ? 1.0f : weights[s]) << "slot " << s;
        if (r < 0) continue;
        written[r] = true;
        std::vector<float> x(hidden.begin() + (s / k) * H, hidden.begin() + (s / k + 1) * H);
        if (on_input)
          for (auto& v : x) v = round_bf16(v * weights[s]);
        const float row_scale = per_token ? token_scale(x) : 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          uint8_t want[kGroup];
          float want_scale = 0;
          quantize_group(x.data() + g * kGroup, fixed ? static_scales[slot_expert[s]] : row_scale,
                         want, &want_scale);
          EXPECT_EQ(std::memcmp(&got_scales[r * groups + g], &want_scale, 4), 0)
              << "slot " << s << " group " << g << ": " << got_scales[r * groups + g] << " vs "
              << want_scale;
          for (int64_t i = 0; i < kGroup; ++i)
            ASSERT_EQ(got[r * H + g * kGroup + i], want[i])
                << "slot " << s << " row " << r << " column " << g * kGroup + i << " value "
                << x[g * kGroup + i];
        }
      }
      for (int64_t r = 0; r < slots; ++r)
        if (!written[r])
          for (int64_t i = 0; i < H; ++i) ASSERT_EQ(got[r * H + i], 0xff) << "unwritten row " << r;
    }
}

TEST_F(Fp8QuantizeTest, ActivationMatchesTheHost) {
  std::mt19937_64 rng(base_seed() ^ 0xf8a2);
  struct Case {
    activation::Kind kind;
    GateUpLayout layout;
    bool exact;  // no transcendental: codes bit-equal
  };
  const std::vector<Case> cases = {
      {activation::Kind::kReLU2, GateUpLayout::kHalves, true},
      {activation::Kind::kIdentity, GateUpLayout::kHalves, true},
      {activation::Kind::kSwiGLU, GateUpLayout::kHalves, false},
      {activation::Kind::kSwiGLUClamped, GateUpLayout::kInterleaved, false}};
  const int64_t I = 256, L = 3, max_rows = 9, rows = 7, groups = I / kGroup;
  for (const Case& cs : cases)
    for (const DType fc1_dtype : {DType::kBFloat16, DType::kFloat32})
      for (const bool bias : {false, true})
        for (const int mode : {0, 1, 2}) {  // per 128 outputs, static, per token
          const bool fixed = mode == 1, per_token = mode == 2;
          SCOPED_TRACE("kind " + std::to_string(int(cs.kind)) + " " + to_string(fc1_dtype) +
                       (bias ? " bias" : "") +
                       (fixed       ? " static"
                        : per_token ? " per token"
                                    : " per 128 outputs"));
          activation::DeviceActivation a;
          a.elem = DType::kBFloat16;
          a.params.kind = cs.kind;
          if (cs.kind == activation::Kind::kSwiGLUClamped) {
            a.params.limit = 7.0f;
            a.params.alpha = 1.702f;
            a.params.beta = 1.0f;
          }
          a.intermediate = I;
          a.local_experts = static_cast<int>(L);
          const int64_t R = a.fc1_rows();
          // No NaN here: the device's fminf and the host's clamp may treat it differently.
          std::vector<float> fc1 = special_rows(max_rows, R, rng, false);
          if (fc1_dtype == DType::kFloat32)  // accumulators: not on the bf16 grid
            for (auto& v : fc1) v *= 1.0f + 1.0f / 1024;
          std::vector<float> b(bias ? L * R : 0);
          std::normal_distribution<float> normal(0.0f, 0.5f);
          for (auto& v : b) v = normal(rng);
          const std::vector<int32_t> offsets = {0, 3, 3, static_cast<int32_t>(rows)};
          std::vector<int32_t> row_expert(max_rows, -1);
          for (int64_t r = 0; r < rows; ++r) row_expert[r] = r < 3 ? 0 : 2;
          const std::vector<float> static_scales = {1.0f / 448, 3.0f / 448, 8.0f / 448};
          DeviceBuffer d_in = fc1_dtype == DType::kFloat32 ? to_device(fc1) : [&] {
            std::vector<uint16_t> bits(fc1.size());
            for (std::size_t i = 0; i < fc1.size(); ++i) bits[i] = numeric::float_to_bf16(fc1[i]);
            return to_device(bits);
          }();
          DeviceBuffer d_bias = to_device(b), d_offsets = to_device(offsets),
                       d_row_expert = to_device(row_expert), d_static = to_device(static_scales);
          a.fc1_bias = bias ? d_bias.as<float>() : nullptr;
          DeviceBuffer values(max_rows * I), scales(max_rows * groups * sizeof(float));
          values.poison();
          scales.poison();
          activation::QuantizedActivations out;
          out.values = values.ptr;
          out.scales = scales.as<float>();
          out.static_scale = fixed ? d_static.as<float>() : nullptr;
          out.per_token = per_token;
          ASSERT_TRUE(
              activation::prepare_device_quantized(a, cs.layout, fc1_dtype, per_token).ok());
          const Status st = activation::run_device_quantized(
              a, cs.layout, fc1_dtype, d_in.ptr, out, d_row_expert.as<int32_t>(),
              d_offsets.as<int32_t>(), max_rows, nullptr);
          ASSERT_TRUE(st.ok()) << st.message();
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto got = to_host<uint8_t>(values.ptr, max_rows * I);
          const auto got_scales = to_host<float>(scales.ptr, max_rows * groups);
          int64_t off_by_one = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const int32_t e = row_expert[r];
            auto y = [&](int64_t c) {  // FC1's value as the reference rounds it
              const float v =
                  fc1_dtype == DType::kFloat32 ? fc1[r * R + c] : round_bf16(fc1[r * R + c]);
              return round_bf16(bias ? v + b[e * R + c] : v);
            };
            std::vector<float> x(I);
            for (int64_t j = 0; j < I; ++j) {
              float v;
              if (!activation::is_gated(a.params.kind))
                v = activation::apply_plain(a.params, y(j));
              else if (cs.layout == GateUpLayout::kInterleaved)
                v = activation::apply_gated(a.params, y(2 * j), y(2 * j + 1));
              else
                v = activation::apply_gated(a.params, y(j), y(I + j));
              x[j] = round_bf16(v);
            }
            const float row_scale = per_token ? token_scale(x) : 0.0f;
            for (int64_t g = 0; g < groups; ++g) {
              uint8_t want[kGroup];
              float want_scale = 0;
              quantize_group(x.data() + g * kGroup, fixed ? static_scales[e] : row_scale, want,
                             &want_scale);
              const float gs = got_scales[r * groups + g];
              if (cs.exact || fixed)
                EXPECT_EQ(gs, want_scale) << "row " << r << " group " << g;
              else
                EXPECT_NEAR(gs, want_scale, want_scale * (1.0f / 128)) << "row " << r;
              for (int64_t i = 0; i < kGroup; ++i) {
                const uint8_t gc = got[r * I + g * kGroup + i], wc = want[i];
                if (gc == wc) continue;
                // Device transcendentals an fp32 ulp away may move a value across a rounding
                // boundary: at most one code, and only where the host used exp/tanh/erf.
                ASSERT_FALSE(cs.exact && !std::isnan(x[g * kGroup + i]))
                    << "row " << r << " column " << g * kGroup + i << ": code " << int(gc) << " vs "
                    << int(wc);
                ASSERT_EQ(gc & 0x80, wc & 0x80) << "row " << r << " column " << g * kGroup + i;
                ASSERT_LE(std::abs(int(gc & 0x7f) - int(wc & 0x7f)), 1)
                    << "row " << r << " column " << g * kGroup + i;
                ++off_by_one;
              }
            }
          }
          EXPECT_LE(off_by_one, rows * I / 50) << "codes one step away";
          for (int64_t r = rows; r < max_rows; ++r)
            for (int64_t i = 0; i < I; ++i)
              ASSERT_EQ(got[r * I + i], 0xff) << "row " << r << " past offsets[L]";
        }
}

}  // namespace
}  // namespace moekit
