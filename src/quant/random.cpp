// Deterministic random weights. Every value is a pure function of (seed, tensor, global expert,
// element), computed with integer hashing and basic IEEE arithmetic only (no C library
// transcendental functions, whose last bits differ between libraries), so a seed gives the same
// weights on every machine, for every TP/EP rank, whatever the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/checked.hpp"
#include "common/weights_slice.hpp"
#include "moekit/status.hpp"
#include "quant/quant.hpp"
#include "quant/quant_internal.hpp"

namespace moekit::quant {
namespace detail {
namespace {

// Stream labels: one per tensor of a layer.
enum : uint64_t {
  kTagFc1 = 1,
  kTagFc2 = 2,
  kTagFc1Bias = 3,
  kTagFc2Bias = 4,
  kTagRoutingBias = 5,
  kTagFc1Smooth = 6,
  kTagFc2Smooth = 7,
};

double bits_to_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
uint64_t double_to_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// Branch-free helpers: the octant and mantissa tests are coin flips, which a branch predictor
// cannot learn. Negation flips the sign bit, as unary minus does.
inline double select(int cond, double if_true, double if_false) {
  const uint64_t mask = 0 - static_cast<uint64_t>(cond != 0);
  return bits_to_double((double_to_bits(if_true) & mask) | (double_to_bits(if_false) & ~mask));
}
inline double negate_if(int cond, double x) {
  return bits_to_double(double_to_bits(x) ^ (static_cast<uint64_t>(cond != 0) << 63));
}

// The normals are computed in blocks of kLanes independent pairs, each step as a loop over the
// lanes, so the long dependency chains of the series overlap (and may use SIMD): ~4x faster than
// one pair at a time, with the very same operations per value.
constexpr int kLanes = 16;

// ln(x) for x in (0, 1], x normal: x = m * 2^k with m in [sqrt(1/2), sqrt(2)), then the atanh
// series 2 (s + s^3/3 + ...) with s = (m - 1) / (m + 1), |s| < 0.172 (ten terms: ~1e-16).
void log_lanes(const double* x, double* out) {
  static constexpr double kInvOdd[] = {1.0 / 19.0, 1.0 / 17.0, 1.0 / 15.0, 1.0 / 13.0, 1.0 / 11.0,
                                       1.0 / 9.0,  1.0 / 7.0,  1.0 / 5.0,  1.0 / 3.0,  1.0};
  double k[kLanes], s[kLanes], s2[kLanes], p[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t b = double_to_bits(x[l]);
    const double m = bits_to_double((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    const int big = m > 1.4142135623730951;
    const double mr = select(big, m * 0.5, m);  // exact
    k[l] = static_cast<double>(static_cast<int>((b >> 52) & 0x7ff) - 1023 + big);
    s[l] = (mr - 1.0) / (mr + 1.0);
    s2[l] = s[l] * s[l];
    p[l] = kInvOdd[0];
  }
  for (int j = 1; j < 10; ++j)
    for (int l = 0; l < kLanes; ++l) p[l] = p[l] * s2[l] + kInvOdd[j];
  for (int l = 0; l < kLanes; ++l) out[l] = k[l] * 0.6931471805599453 + 2.0 * s[l] * p[l];
}

// sin and cos of 2 pi u for u in [0, 1): the octant of u picks the signs and which of sin/cos
// of the reduced angle a in [0, pi/4] each is; sin a and cos a come from their Taylor series
// (error < 1e-16).
void sincos_turn_lanes(const double* u, double* sn, double* cs) {
  static constexpr double kSin[] = {
      -1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0,
      -1.0 / 5040.0,          1.0 / 120.0,        -1.0 / 6.0,        1.0};
  static constexpr double kCos[] = {1.0 / 20922789888000.0,
                                    -1.0 / 87178291200.0,
                                    1.0 / 479001600.0,
                                    -1.0 / 3628800.0,
                                    1.0 / 40320.0,
                                    -1.0 / 720.0,
                                    1.0 / 24.0,
                                    -1.0 / 2.0,
                                    1.0};
  const double kQuarterPi = 0.7853981633974483;
  int oct[kLanes];
  double a[kLanes], a2[kLanes], ps[kLanes], pc[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const double t = u[l] * 8.0;  // exact: a power of two
    oct[l] = static_cast<int>(t);
    const double f = t - oct[l];
    // Odd octants count down from their upper edge, so the argument stays in [0, pi/4].
    a[l] = select(oct[l] & 1, 1.0 - f, f) * kQuarterPi;
    a2[l] = a[l] * a[l];
    ps[l] = kSin[0];
    pc[l] = kCos[0];
  }
  for (int j = 1; j < 8; ++j)
    for (int l = 0; l < kLanes; ++l) ps[l] = ps[l] * a2[l] + kSin[j];
  for (int j = 1; j < 9; ++j)
    for (int l = 0; l < kLanes; ++l) pc[l] = pc[l] * a2[l] + kCos[j];
  for (int l = 0; l < kLanes; ++l) {
    // Octant o: sin is +-s or +-c, cos the other; {1,2,5,6} swap, {4..7} negate sin,
    // {2..5} negate cos.
    const int o = oct[l];
    const double s = a[l] * ps[l], c = pc[l];
    const int swap = ((o + 1) & 2) != 0;
    sn[l] = negate_if((o & 4) != 0, select(swap, c, s));
    cs[l] = negate_if(((o + 2) & 4) != 0, select(swap, s, c));
  }
}

}  // namespace

void normal_fill(uint64_t key, float stddev, float* out, int64_t n) {
  const double sd = stddev;
  double u1[kLanes], u2[kLanes], r[kLanes], sn[kLanes], cs[kLanes];
  for (int64_t base = 0; base < n; base += 2 * kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const auto pair = static_cast<uint64_t>(base + 2 * l);
      u1[l] = static_cast<double>((stream_bits(key, pair) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
      u2[l] = to_unit(stream_bits(key, pair + 1));                                  // [0, 1)
    }
    log_lanes(u1, r);
    for (int l = 0; l < kLanes; ++l) r[l] = std::sqrt(-2.0 * r[l]);  // IEEE: correctly rounded
    sincos_turn_lanes(u2, sn, cs);
    if (n - base >= 2 * kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        out[base + 2 * l] = static_cast<float>(r[l] * cs[l] * sd);
        out[base + 2 * l + 1] = static_cast<float>(r[l] * sn[l] * sd);
      }
    } else {
      for (int64_t i = base; i < n; ++i) {
        const auto l = static_cast<int>((i - base) / 2);
        out[i] = static_cast<float>(((i - base) % 2 == 0 ? r[l] * cs[l] : r[l] * sn[l]) * sd);
      }
    }
  }
}

}  // namespace detail

namespace {

// Quantizes `experts` experts of a [rows, cols] projection whose expert e (local) is drawn
// from the stream (seed, tag, first_expert + e).
QuantizedTensor random_tensor(const WeightQuant& q, uint64_t seed, uint64_t tag,
                              uint64_t smooth_tag, int64_t first_expert, int64_t experts,
                              int64_t rows, int64_t cols) {
  QuantizedTensor t = detail::make_empty(q, experts, rows, cols);
  detail::fill_pre_quant_scale(t, detail::splitmix64(seed ^ smooth_tag), first_expert);
  const float sd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(cols)));
  detail::parallel_for(experts, [&](int64_t e) {
    const int64_t n = product_or_throw({rows, cols}, "one expert's random weights [rows, cols]");
    std::vector<float> w(static_cast<std::size_t>(n));
    detail::normal_fill(detail::stream_key(seed, tag, static_cast<uint64_t>(first_expert + e)), sd,
                        w.data(), n);
    detail::quantize_expert(t, e, w.data(), 4.0f);
  });
  return t;
}

std::vector<float> random_table(uint64_t seed, uint64_t tag, int64_t first_expert, int64_t experts,
                                int64_t width, float sd) {
  std::vector<float> t(static_cast<std::size_t>(
      product_or_throw({experts, width}, "a random table [experts, width]")));
  for (int64_t e = 0; e < experts; ++e)
    detail::normal_fill(detail::stream_key(seed, tag, static_cast<uint64_t>(first_expert + e)), sd,
                        t.data() + e * width, width);
  return t;
}

}  // namespace

MoeWeights make_random_weights(const MoeSpec& spec, uint64_t seed) {
  const LocalProblem lp = derive_local(spec);
  const int64_t H = spec.hidden, I = spec.intermediate, F = spec.fc1_rows();
  const int64_t e0 = lp.first_expert, ne = lp.num_experts;
  constexpr float kBiasStd = 0.1f;

  // Draw the local experts unsharded along the intermediate, then cut this TP rank's slice, so
  // the TP ranks together hold exactly the unsharded layer (scales included).
  MoeWeights w;
  w.fc1 = random_tensor(spec.weights, seed, detail::kTagFc1, detail::kTagFc1Smooth, e0, ne, F, H);
  w.fc2 = random_tensor(spec.weights, seed, detail::kTagFc2, detail::kTagFc2Smooth, e0, ne, H, I);
  if (spec.fc1_bias) w.fc1_bias = random_table(seed, detail::kTagFc1Bias, e0, ne, F, kBiasStd);
  if (spec.fc2_bias) w.fc2_bias = random_table(seed, detail::kTagFc2Bias, e0, ne, H, kBiasStd);
  if (spec.routing.correction_bias)
    w.routing_bias = random_table(seed, detail::kTagRoutingBias, 0, 1, spec.num_experts, kBiasStd);

  if (lp.intermediate != I) {
    const auto rows = ::moekit::detail::fc1_row_map(activation_is_gated(spec.activation.kind),
                                                    spec.gate_up_layout, I, lp.intermediate_offset,
                                                    lp.intermediate);
    std::vector<int64_t> all_h(static_cast<std::size_t>(H));
    for (int64_t i = 0; i < H; ++i) all_h[i] = i;
    w.fc1 = ::moekit::detail::slice_tensor(w.fc1, "fc1", 0, ne, rows, 0, H);
    w.fc2 = ::moekit::detail::slice_tensor(w.fc2, "fc2", 0, ne, all_h, lp.intermediate_offset,
                                           lp.intermediate);
    w.fc1_bias = ::moekit::detail::slice_table(w.fc1_bias, F, 0, ne, rows);
  }
  check_weights(spec, w);
  return w;
}

}  // namespace moekit::quant
