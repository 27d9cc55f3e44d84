// Encoding fp32 weights into every WeightFormat (scales from the data: absmax per block or
// group, min/max with zero points). Layouts: include/moekit/types.hpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/numeric.hpp"
#include "moekit/status.hpp"
#include "quant/quant.hpp"
#include "quant/quant_internal.hpp"

namespace moekit::quant {
namespace detail {
namespace {

using numeric::e4m3_to_float_hd;
using numeric::e8m0_to_float_hd;
using numeric::float_to_e2m1_hd;
using numeric::float_to_e4m3_hd;
using numeric::float_to_e8m0_ceil_hd;

bool is_int(WeightFormat f) {
  return f == WeightFormat::kInt8Group || f == WeightFormat::kInt4Group;
}

// Round half to even for |y| < 2^22 without depending on the C library's rounding functions:
// adding 1.5 * 2^23 leaves no fraction bits, and the FPU rounds to nearest even.
inline float rne_small(float y) {
  const float magic = 12582912.0f;
  return (y + magic) - magic;
}

float absmax(const float* w, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

[[noreturn]] void bad(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "quantize: " + msg);
}

// Int group of n values into codes (signed, or unsigned with a zero point); returns the scale.
float quantize_int_group(const float* w, int64_t n, int bits, bool zero_point, int* codes,
                         uint8_t* zero) {
  const int qmax_signed = (1 << (bits - 1)) - 1;  // 7 or 127: symmetric around 0
  const int levels = (1 << bits) - 1;             // 15 or 255
  if (!zero_point) {
    const float m = absmax(w, n);
    const float s = m > 0.0f ? m / static_cast<float>(qmax_signed) : 1.0f;
    for (int64_t i = 0; i < n; ++i)
      codes[i] = static_cast<int>(
          std::clamp(rne_small(w[i] / s), -qmax_signed - 1.0f, static_cast<float>(qmax_signed)));
    return s;
  }
  // Asymmetric over [min(w, 0), max(w, 0)], so the zero point always lies in [0, levels].
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  const float s = hi > lo ? (hi - lo) / static_cast<float>(levels) : 1.0f;
  const float z = std::clamp(rne_small(-lo / s), 0.0f, static_cast<float>(levels));
  *zero = static_cast<uint8_t>(z);
  for (int64_t i = 0; i < n; ++i)
    codes[i] =
        static_cast<int>(std::clamp(rne_small(w[i] / s) + z, 0.0f, static_cast<float>(levels)));
  return s;
}

}  // namespace

QuantizedTensor make_empty(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols) {
  const WeightFormat f = q.format;
  const std::string fname = to_string(f);
  if (fname == "unknown")
    bad("weight format id " + std::to_string(static_cast<int>(f)) + " is unknown");
  if (experts < 0 || rows < 0 || cols < 0)
    bad("shape [" + std::to_string(experts) + ", " + std::to_string(rows) + ", " +
        std::to_string(cols) + "] has a negative extent");
  if (!is_int(f) && (q.zero_points || q.pre_quant_scale))
    bad(fname + " has no zero points or pre-quant scale; only int8_group and int4_group do");
  QuantizedTensor t;
  t.format = f;
  t.experts = experts;
  t.rows = rows;
  t.cols = cols;
  t.group_size = is_int(f) ? q.group_size : format_scale_group(f, 0);
  if (is_int(f) && t.group_size <= 0)
    bad("group_size " + std::to_string(q.group_size) + " must be positive for " + fname);
  const int64_t g = t.group_size;
  if (g > 0 && f != WeightFormat::kFP8Block128 && cols % g != 0)
    bad("cols " + std::to_string(cols) + " is not a multiple of the group size " +
        std::to_string(g) + " of " + fname);
  if (format_value_bits(f) == 4 && cols % 2 != 0)
    bad("cols " + std::to_string(cols) + " is odd, but " + fname + " packs two per byte");

  const auto groups = static_cast<std::size_t>(g > 0 ? experts * rows * (cols / g) : 0);
  const auto per_expert = static_cast<std::size_t>(experts);
  t.values.resize(static_cast<std::size_t>(experts * t.expert_value_bytes()));
  switch (f) {
    case WeightFormat::kFP8PerTensor:
      t.weight_scale.resize(per_expert);
      if (!q.dynamic_activations) t.input_scale.resize(per_expert);  // else per token
      break;
    case WeightFormat::kFP8Block128:
      t.scales.resize(
          static_cast<std::size_t>(experts * ((rows + 127) / 128) * ((cols + 127) / 128)));
      break;
    case WeightFormat::kInt8Group:
    case WeightFormat::kInt4Group:
      t.scales.resize(groups);
      if (q.zero_points) t.zeros.resize(groups);
      if (q.pre_quant_scale) t.pre_quant_scale.resize(static_cast<std::size_t>(experts * cols));
      break;
    case WeightFormat::kMXFP4:
    case WeightFormat::kMXFP8:
      t.scale_bytes.resize(groups);
      break;
    case WeightFormat::kNVFP4:
      t.scale_bytes.resize(groups);
      t.global_scale.resize(per_expert);
      break;
    default:
      break;
  }
  t.check_sizes("quantize");
  return t;
}

void fill_pre_quant_scale(QuantizedTensor& t, uint64_t seed, int64_t first_expert) {
  if (t.pre_quant_scale.empty()) return;
  for (int64_t e = 0; e < t.experts; ++e) {
    const uint64_t key = stream_key(seed, 0x5043u, static_cast<uint64_t>(first_expert + e));
    for (int64_t c = 0; c < t.cols; ++c)
      t.pre_quant_scale[e * t.cols + c] =
          static_cast<float>(0.5 + 1.5 * to_unit(stream_bits(key, static_cast<uint64_t>(c))));
  }
}

void quantize_expert(QuantizedTensor& t, int64_t e, const float* w_in, float act_absmax) {
  const int64_t rows = t.rows, cols = t.cols, n = rows * cols;
  uint8_t* v = t.values.data() + e * t.expert_value_bytes();
  const float* w = w_in;
  std::vector<float> smoothed;
  if (!t.pre_quant_scale.empty()) {
    // AWQ: the activations are multiplied by pre_quant_scale (types.hpp), so the stored
    // weights carry its inverse.
    smoothed.resize(static_cast<std::size_t>(n));
    const float* p = t.pre_quant_scale.data() + e * cols;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) smoothed[r * cols + c] = w_in[r * cols + c] / p[c];
    w = smoothed.data();
  }
  const int64_t g = format_scale_group(t.format, t.group_size);
  const int64_t groups = g > 0 ? cols / g : 0;
  switch (t.format) {
    case WeightFormat::kFP32:
      std::memcpy(v, w, static_cast<std::size_t>(n) * 4);
      return;
    case WeightFormat::kBF16:
    case WeightFormat::kFP16: {
      const bool bf = t.format == WeightFormat::kBF16;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = bf ? numeric::float_to_bf16(w[i]) : numeric::float_to_fp16_hd(w[i]);
        std::memcpy(v + 2 * i, &h, 2);
      }
      return;
    }
    case WeightFormat::kFP8PerTensor: {
      const float m = absmax(w, n);
      const float s = m > 0.0f ? m / 448.0f : 1.0f;
      for (int64_t i = 0; i < n; ++i) v[i] = float_to_e4m3_hd(w[i] / s);
      t.weight_scale[e] = s;
      if (!t.input_scale.empty()) t.input_scale[e] = act_absmax > 0.0f ? act_absmax / 448.0f : 1.0f;
      return;
    }
    case WeightFormat::kFP8Block128: {
      const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
      for (int64_t rb = 0; rb < br; ++rb)
        for (int64_t cb = 0; cb < bc; ++cb) {
          const int64_t r1 = std::min(rows, rb * 128 + 128), c1 = std::min(cols, cb * 128 + 128);
          float m = 0.0f;
          for (int64_t r = rb * 128; r < r1; ++r)
            m = std::max(m, absmax(w + r * cols + cb * 128, c1 - cb * 128));
          const float s = m > 0.0f ? m / 448.0f : 1.0f;
          for (int64_t r = rb * 128; r < r1; ++r)
            for (int64_t c = cb * 128; c < c1; ++c)
              v[r * cols + c] = float_to_e4m3_hd(w[r * cols + c] / s);
          t.scales[(e * br + rb) * bc + cb] = s;
        }
      return;
    }
    case WeightFormat::kMXFP8: {
      for (int64_t k = 0; k < rows * groups; ++k) {
        const uint8_t sb = float_to_e8m0_ceil_hd(absmax(w + k * 32, 32) / 448.0f);
        const float s = e8m0_to_float_hd(sb);
        for (int64_t c = 0; c < 32; ++c) v[k * 32 + c] = float_to_e4m3_hd(w[k * 32 + c] / s);
        t.scale_bytes[e * rows * groups + k] = sb;
      }
      return;
    }
    case WeightFormat::kInt8Group:
    case WeightFormat::kInt4Group: {
      const bool four = t.format == WeightFormat::kInt4Group;
      const bool zp = !t.zeros.empty();
      std::vector<int> codes(static_cast<std::size_t>(g));
      for (int64_t k = 0; k < rows * groups; ++k) {
        const int64_t idx = e * rows * groups + k;
        uint8_t zero = 0;
        t.scales[idx] = quantize_int_group(w + k * g, g, four ? 4 : 8, zp, codes.data(), &zero);
        if (zp) t.zeros[idx] = zero;
        if (four) {
          uint8_t* out = v + k * g / 2;
          for (int64_t j = 0; j < g / 2; ++j)
            out[j] = static_cast<uint8_t>((codes[2 * j] & 0xf) | ((codes[2 * j + 1] & 0xf) << 4));
        } else {
          for (int64_t c = 0; c < g; ++c) v[k * g + c] = static_cast<uint8_t>(codes[c] & 0xff);
        }
      }
      return;
    }
    case WeightFormat::kMXFP4: {
      for (int64_t k = 0; k < rows * groups; ++k) {
        const float* wg = w + k * 32;
        const uint8_t sb = float_to_e8m0_ceil_hd(absmax(wg, 32) / 6.0f);
        const float s = e8m0_to_float_hd(sb);
        for (int64_t j = 0; j < 16; ++j)
          v[k * 16 + j] = static_cast<uint8_t>(float_to_e2m1_hd(wg[2 * j] / s) |
                                               (float_to_e2m1_hd(wg[2 * j + 1] / s) << 4));
        t.scale_bytes[e * rows * groups + k] = sb;
      }
      return;
    }
    case WeightFormat::kNVFP4: {
      // The global scale maps the expert's absmax onto the largest e4m3 x e2m1 product
      // (ModelOpt's NVFP4QTensor.get_weights_scaling_factor_2: amax / (6 * 448)).
      const float m = absmax(w, n);
      const float gs = m > 0.0f ? m / (448.0f * 6.0f) : 1.0f;
      t.global_scale[e] = gs;
      for (int64_t k = 0; k < rows * groups; ++k) {
        const float* wg = w + k * 16;
        const uint8_t sb = float_to_e4m3_hd(absmax(wg, 16) / 6.0f / gs);
        const float s = e4m3_to_float_hd(sb) * gs;
        for (int64_t j = 0; j < 8; ++j) {
          const uint8_t lo = s > 0.0f ? float_to_e2m1_hd(wg[2 * j] / s) : 0;
          const uint8_t hi = s > 0.0f ? float_to_e2m1_hd(wg[2 * j + 1] / s) : 0;
          v[k * 8 + j] = static_cast<uint8_t>(lo | (hi << 4));
        }
        t.scale_bytes[e * rows * groups + k] = sb;
      }
      return;
    }
  }
}

}  // namespace detail

QuantizedTensor quantize(const WeightQuant& q, int64_t experts, int64_t rows, int64_t cols,
                         const float* w, float act_absmax, uint64_t seed) {
  QuantizedTensor t = detail::make_empty(q, experts, rows, cols);
  detail::fill_pre_quant_scale(t, seed, 0);
  detail::parallel_for(
      experts, [&](int64_t e) { detail::quantize_expert(t, e, w + e * rows * cols, act_absmax); });
  return t;
}

}  // namespace moekit::quant
