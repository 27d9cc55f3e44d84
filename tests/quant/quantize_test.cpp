// quantize(): per-format error bounds of quantize -> dequantize, zero points, the AWQ factor,
// and make_random_weights(): determinism, pinned values, statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/numeric.hpp"
#include "moekit/status.hpp"
#include "quant/quant.hpp"

namespace moekit::quant {
namespace {

std::vector<float> random_normal(std::size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> dequant_all(const QuantizedTensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.experts * t.rows * t.cols));
  for (int64_t e = 0; e < t.experts; ++e) dequantize_expert(t, e, out.data() + e * t.rows * t.cols);
  return out;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Absmax of the group of every element, for groups of `gr` rows x `gc` columns.
std::vector<float> group_absmax(const std::vector<float>& w, int64_t experts, int64_t rows,
                                int64_t cols, int64_t gr, int64_t gc) {
  std::vector<float> out(w.size());
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r0 = 0; r0 < rows; r0 += gr)
      for (int64_t c0 = 0; c0 < cols; c0 += gc) {
        const int64_t r1 = std::min(rows, r0 + gr), c1 = std::min(cols, c0 + gc);
        float m = 0;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            m = std::max(m, std::fabs(w[(e * rows + r) * cols + c]));
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) out[(e * rows + r) * cols + c] = m;
      }
  return out;
}

struct BoundCase {
  WeightFormat f;
  int group;
  bool zeros;
  double max_rel;  // Frobenius relative error on normal data
};

TEST(Quantize, ErrorBoundsPerFormat) {
  const int64_t E = 3, R = 130, C = 256;
  const auto w = random_normal(static_cast<std::size_t>(E * R * C), 9, 0.05f);
  const BoundCase cases[] = {
      {WeightFormat::kFP32, 0, false, 0.0},         {WeightFormat::kBF16, 0, false, 3e-3},
      {WeightFormat::kFP16, 0, false, 4e-4},        {WeightFormat::kFP8PerTensor, 0, false, 0.04},
      {WeightFormat::kFP8Block128, 0, false, 0.04}, {WeightFormat::kMXFP8, 0, false, 0.04},
      {WeightFormat::kInt8Group, 64, false, 0.01},  {WeightFormat::kInt8Group, 32, true, 0.01},
      {WeightFormat::kInt4Group, 128, false, 0.15}, {WeightFormat::kInt4Group, 64, true, 0.12},
      {WeightFormat::kMXFP4, 0, false, 0.15},       {WeightFormat::kNVFP4, 0, false, 0.12},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.f)) + " group " + std::to_string(c.group) +
                 (c.zeros ? " zeros" : ""));
    WeightQuant q;
    q.format = c.f;
    q.group_size = c.group;
    q.zero_points = c.zeros;
    const QuantizedTensor t = quantize(q, E, R, C, w.data());
    t.check_sizes("t");
    const auto d = dequant_all(t);
    const double rel = rel_error(d, w);
    EXPECT_LE(rel, c.max_rel);
    if (c.f != WeightFormat::kFP32) EXPECT_GT(rel, 0.0);
    // Per-element bounds from the format's grid and the absmax of the element's scale group.
    int64_t gr = 1, gc = C;
    switch (c.f) {
      case WeightFormat::kFP8PerTensor:
        gr = R;
        break;
      case WeightFormat::kFP8Block128:
        gr = 128;
        gc = 128;
        break;
      case WeightFormat::kMXFP8:
      case WeightFormat::kMXFP4:
        gc = 32;
        break;
      case WeightFormat::kNVFP4:
        gc = 16;
        break;
      case WeightFormat::kInt8Group:
      case WeightFormat::kInt4Group:
        gc = c.group;
        break;
      default:
        break;
    }
    const auto gmax = group_absmax(w, E, R, C, gr, gc);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double err = std::fabs(double(d[i]) - w[i]), a = std::fabs(w[i]), m = gmax[i];
      double bound = 0;
      switch (c.f) {
        case WeightFormat::kFP32:
          bound = 0;
          break;
        case WeightFormat::kBF16:
          bound = a * 0x1p-8;
          break;
        case WeightFormat::kFP16:
          bound = a * 0x1p-11 + 0x1p-25;
          break;
        case WeightFormat::kFP8PerTensor:  // relative half step, or half a subnormal step
        case WeightFormat::kFP8Block128:
          bound = a * 0x1p-4 + m / 448 * 0x1p-10 * 1.01;
          break;
        case WeightFormat::kMXFP8:  // the power-of-two scale is below 2 amax / 448
          bound = a * 0x1p-4 + m / 448 * 0x1p-9 * 1.01;
          break;
        case WeightFormat::kInt8Group:
        case WeightFormat::kInt4Group: {
          const double levels = c.f == WeightFormat::kInt8Group ? 127 : 7;
          // Half a step; with zero points the step is the range over 2 * levels + 1.
          bound = (c.zeros ? 2 * m / (2 * levels + 1) : m / levels) * 0.5 * 1.001;
          break;
        }
        case WeightFormat::kMXFP4:  // scale s < 2 amax / 6; half a step: <= |w| / 4 or s / 4
          bound = a * 0.25 + m / 3 * 0.25 * 1.01;
          break;
        case WeightFormat::kNVFP4:  // the e4m3 block scale adds up to 1/16 of amax / 6
          bound = a * 0.25 + m * 0.2;
          break;
        default:
          break;
      }
      ASSERT_LE(err, bound) << "w " << w[i] << " -> " << d[i] << " at " << i;
    }
  }
}

TEST(Quantize, Fp8Block128PartialBlocks) {
  // [2, 130, 200]: the last block row holds 2 rows and the last block column 72 columns; a
  // block whose absmax is a power-of-two multiple of 448 is reproduced exactly.
  const int64_t E = 2, R = 130, C = 200;
  auto w = random_normal(static_cast<std::size_t>(E * R * C), 21);
  for (int64_t r = 128; r < 130; ++r)
    for (int64_t c = 128; c < 200; ++c) w[(R + r) * C + c] = (c % 2 ? -1.0f : 1.0f) * float(c % 8);
  WeightQuant q;
  q.format = WeightFormat::kFP8Block128;
  const auto t = quantize(q, E, R, C, w.data());
  ASSERT_EQ(t.scales.size(), 8u);
  EXPECT_EQ(t.scales[4 + 3], 7.0f / 448.0f);  // expert 1, block (1, 1): absmax 7
  const auto d = dequant_all(t);
  for (int64_t r = 128; r < 130; ++r)
    for (int64_t c = 128; c < 200; ++c) ASSERT_EQ(d[(R * C) + r * C + c], w[(R + r) * C + c]);
  EXPECT_LE(rel_error(d, w), 0.04);
}

TEST(Quantize, ZeroPointsAreInRangeAndExactForTheirGrid) {
  // A group whose values sit exactly on a grid of step 0.5 from -2 to 5.5: codes are exact.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = -2.0f + 0.5f * static_cast<float>(i % 16);
  WeightQuant q;
  q.format = WeightFormat::kInt4Group;
  q.group_size = 32;
  q.zero_points = true;
  const auto t = quantize(q, 1, 1, 32, w.data());
  EXPECT_EQ(t.scales[0], 0.5f);  // (5.5 - (-2)) / 15
  EXPECT_EQ(t.zeros[0], 4);      // -(-2) / 0.5
  EXPECT_EQ(t.values[0], 0x10);  // element 0: code 0, element 1: code 1 (low nibble first)
  EXPECT_EQ(dequant_all(t), w);
  // Signed int8 without zero points: absmax 127 maps to code 127, -127 to 0x81.
  std::vector<float> v(32, 0.0f);
  v[0] = 127.0f;
  v[1] = -127.0f;
  v[2] = 63.5f;  // 63.5: tie, to even 64
  q.format = WeightFormat::kInt8Group;
  q.zero_points = false;
  const auto s = quantize(q, 1, 1, 32, v.data());
  EXPECT_EQ(s.scales[0], 1.0f);
  EXPECT_EQ(s.values[0], 127);
  EXPECT_EQ(s.values[1], 0x81);
  EXPECT_EQ(s.values[2], 64);
}

TEST(Quantize, AwqStoresTheSmoothedWeightsAndTheActivationsUndoIt) {
  const int64_t E = 2, R = 8, C = 64;
  const auto w = random_normal(static_cast<std::size_t>(E * R * C), 4);
  const auto x = random_normal(static_cast<std::size_t>(C), 5);
  WeightQuant q;
  q.format = WeightFormat::kInt8Group;
  q.group_size = 32;
  q.pre_quant_scale = true;
  const auto t = quantize(q, E, R, C, w.data(), 4.0f, 77);
  ASSERT_EQ(t.pre_quant_scale.size(), static_cast<std::size_t>(E * C));
  for (float p : t.pre_quant_scale) {
    EXPECT_GE(p, 0.5f);
    EXPECT_LE(p, 2.0f);
  }
  EXPECT_EQ(quantize(q, E, R, C, w.data(), 4.0f, 77).pre_quant_scale, t.pre_quant_scale);
  EXPECT_NE(quantize(q, E, R, C, w.data(), 4.0f, 78).pre_quant_scale, t.pre_quant_scale);
  const auto d = dequant_all(t);
  for (int64_t e = 0; e < E; ++e) {
    auto xs = x;
    prepare_activations(t, e, xs.data(), 1, DType::kFloat32);
    for (int64_t r = 0; r < R; ++r) {
      double y = 0, y_ref = 0, norm = 0;
      for (int64_t c = 0; c < C; ++c) {
        y += double(d[(e * R + r) * C + c]) * xs[c];
        y_ref += double(w[(e * R + r) * C + c]) * x[c];
        norm += std::fabs(double(w[(e * R + r) * C + c]) * x[c]);
      }
      EXPECT_NEAR(y, y_ref, 0.02 * norm) << e << " " << r;
    }
  }
}

TEST(Quantize, Fp8PerTensorScales) {
  std::vector<float> w(2 * 4 * 32);
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = (i < 128 ? 0.01f : 1.0f) * float(int(i % 7) - 3);
  WeightQuant q;
  q.format = WeightFormat::kFP8PerTensor;
  const auto t = quantize(q, 2, 4, 32, w.data(), 8.96f);
  EXPECT_EQ(t.weight_scale[0], (0.01f * 3.0f) / 448.0f);
  EXPECT_EQ(t.weight_scale[1], 3.0f / 448.0f);
  EXPECT_EQ(t.input_scale, (std::vector<float>{8.96f / 448.0f, 8.96f / 448.0f}));
}

TEST(Quantize, RejectsImpossibleShapes) {
  std::vector<float> w(64, 1.0f);
  WeightQuant q;
  q.format = WeightFormat::kMXFP4;
  EXPECT_THROW(quantize(q, 1, 2, 31, w.data()), Error);  // not a multiple of 32
  q.format = WeightFormat::kInt4Group;
  q.group_size = 0;
  EXPECT_THROW(quantize(q, 1, 1, 64, w.data()), Error);
  q.format = WeightFormat::kBF16;
  q.zero_points = true;
  try {
    quantize(q, 1, 1, 64, w.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
}

MoeSpec random_spec(WeightFormat f) {
  MoeSpec s;
  s.num_experts = 4;
  s.top_k = 2;
  s.hidden = 128;
  s.intermediate = 128;
  s.weights.format = f;
  s.weights.group_size = 32;
  s.fc1_bias = true;
  s.fc2_bias = true;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  return s;
}

uint64_t fnv1a(const void* p, std::size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

uint64_t hash_weights(const MoeWeights& w) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const QuantizedTensor* t : {&w.fc1, &w.fc2}) {
    h = fnv1a(t->values.data(), t->values.size(), h);
    h = fnv1a(t->scales.data(), t->scales.size() * 4, h);
    h = fnv1a(t->scale_bytes.data(), t->scale_bytes.size(), h);
    h = fnv1a(t->zeros.data(), t->zeros.size(), h);
    h = fnv1a(t->weight_scale.data(), t->weight_scale.size() * 4, h);
    h = fnv1a(t->global_scale.data(), t->global_scale.size() * 4, h);
    h = fnv1a(t->pre_quant_scale.data(), t->pre_quant_scale.size() * 4, h);
  }
  h = fnv1a(w.fc1_bias.data(), w.fc1_bias.size() * 4, h);
  h = fnv1a(w.fc2_bias.data(), w.fc2_bias.size() * 4, h);
  return fnv1a(w.routing_bias.data(), w.routing_bias.size() * 4, h);
}

TEST(RandomWeights, SameSeedSameWeightsOtherSeedOthers) {
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kInt4Group, WeightFormat::kNVFP4}) {
    const MoeSpec s = random_spec(f);
    const auto a = make_random_weights(s, 123), b = make_random_weights(s, 123);
    const auto c = make_random_weights(s, 124);
    EXPECT_EQ(hash_weights(a), hash_weights(b)) << to_string(f);
    EXPECT_NE(hash_weights(a), hash_weights(c)) << to_string(f);
    EXPECT_EQ(a.fc1.values, b.fc1.values);
    EXPECT_NO_THROW(check_weights(s, a));
  }
}

// The values are a pure function of the seed on every machine: pinned here. If this changes,
// every recorded checksum (CLI output, benchmark inputs) changes with it.
TEST(RandomWeights, PinnedValues) {
  MoeSpec s = random_spec(WeightFormat::kFP32);
  s.fc1_bias = false;
  s.fc2_bias = false;
  const auto w = make_random_weights(s, 2024);
  std::vector<float> d(static_cast<std::size_t>(w.fc1.rows * w.fc1.cols));
  dequantize_expert(w.fc1, 0, d.data());
  // The first four values, also computed by an independent script (Python, libm's log/cos):
  // splitmix64 stream (seed 2024, fc1, expert 0), Box-Muller, times 1/sqrt(128).
  const uint32_t want[4] = {0xbdb535cau, 0x3d60e5b1u, 0x3b8ec371u, 0x3cb5b7edu};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(numeric::float_to_bits(d[i]), want[i]) << i;
  EXPECT_EQ(hash_weights(w), 0xb2929a4111b7e33dull);
}

TEST(RandomWeights, NormalWithTheFanInScale) {
  MoeSpec s = random_spec(WeightFormat::kFP32);
  s.num_experts = 8;
  s.hidden = 512;
  s.intermediate = 256;
  const auto w = make_random_weights(s, 7);
  const auto d = dequant_all(w.fc1);
  double sum = 0, sq = 0, q4 = 0;
  for (float v : d) {
    sum += v;
    sq += double(v) * v;
  }
  const double n = static_cast<double>(d.size());
  const double mean = sum / n, var = sq / n - mean * mean;
  for (float v : d) q4 += std::pow((v - mean), 4);
  EXPECT_NEAR(mean, 0.0, 4 * std::sqrt(var / n));
  EXPECT_NEAR(var * 512, 1.0, 0.01);             // sd 1 / sqrt(hidden)
  EXPECT_NEAR(q4 / n / (var * var), 3.0, 0.05);  // normal kurtosis
  // Experts differ.
  EXPECT_NE(std::vector<float>(d.begin(), d.begin() + 100),
            std::vector<float>(d.begin() + 512 * 512, d.begin() + 512 * 512 + 100));
}

}  // namespace
}  // namespace moekit::quant
