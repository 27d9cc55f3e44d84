// Decoding of every WeightFormat and the activation rounding the W8A8 / AWQ kernels apply
// (layouts and formulas: include/moekit/types.hpp).
#include "quant/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/numeric.hpp"
#include "moekit/status.hpp"
#include "quant/quant_internal.hpp"

namespace moekit::quant {
namespace detail {

const float* e4m3_table() {
  static const auto table = [] {
    std::vector<float> t(256);
    for (int v = 0; v < 256; ++v) t[v] = numeric::e4m3_to_float(static_cast<uint8_t>(v));
    return t;
  }();
  return table.data();
}

}  // namespace detail

namespace {

using numeric::e4m3_to_float;
using numeric::e8m0_to_float;

// Decodes one row of packed nibbles through a 16-entry table (one per scale group).
// e2m1 value of every nibble.
constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline void decode_nibbles(const uint8_t* v, int64_t n_bytes, const float* lut, float* out) {
  for (int64_t j = 0; j < n_bytes; ++j) {
    out[2 * j] = lut[v[j] & 0xf];
    out[2 * j + 1] = lut[v[j] >> 4];
  }
}

void check_expert(const QuantizedTensor& t, int64_t e, const char* fn) {
  if (e < 0 || e >= t.experts)
    throw Error(ErrorCode::kInvalidArgument, std::string(fn) + ": expert " + std::to_string(e) +
                                                 " is outside [0, " + std::to_string(t.experts) +
                                                 ")");
}

}  // namespace

void dequantize_expert(const QuantizedTensor& t, int64_t e, float* out) {
  t.check_sizes("dequantize_expert");
  check_expert(t, e, "dequantize_expert");
  const int64_t rows = t.rows, cols = t.cols, n = rows * cols;
  const uint8_t* v = t.values.data() + e * t.expert_value_bytes();
  const float* e4m3 = detail::e4m3_table();
  const int64_t g = format_scale_group(t.format, t.group_size);
  const int64_t groups = g > 0 ? cols / g : 0;  // per row, for the per-row-group formats
  float lut[16];
  switch (t.format) {
    case WeightFormat::kFP32:
      std::memcpy(out, v, static_cast<std::size_t>(n) * 4);
      return;
    case WeightFormat::kBF16: {
      auto one = [&](int64_t i) {
        const uint32_t h =
            static_cast<uint32_t>(v[2 * i]) | (static_cast<uint32_t>(v[2 * i + 1]) << 8);
        out[i] = numeric::bits_to_float(h << 16);
      };
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)  // fixed trip count: the compiler vectorizes it at -O2
        for (int64_t j = 0; j < 16; ++j) one(i + j);
      for (; i < n; ++i) one(i);
      return;
    }
    case WeightFormat::kFP16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, v + 2 * i, 2);
        out[i] = numeric::fp16_to_float_hd(h);
      }
      return;
    case WeightFormat::kFP8PerTensor: {
      const float s = t.weight_scale[e];
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3[v[i]] * s;
      return;
    }
    case WeightFormat::kFP8Block128: {
      const int64_t bc = (cols + 127) / 128;
      const float* sc = t.scales.data() + e * ((rows + 127) / 128) * bc;
      for (int64_t r = 0; r < rows; ++r) {
        const float* srow = sc + (r / 128) * bc;
        for (int64_t c0 = 0; c0 < cols; c0 += 128) {
          const float s = srow[c0 / 128];
          const int64_t c1 = std::min(cols, c0 + 128);
          for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = e4m3[v[r * cols + c]] * s;
        }
      }
      return;
    }
    case WeightFormat::kMXFP8: {
      const uint8_t* sb = t.scale_bytes.data() + e * rows * groups;
      for (int64_t k = 0; k < rows * groups; ++k) {
        const float s = e8m0_to_float(sb[k]);
        for (int64_t c = 0; c < 32; ++c) out[k * 32 + c] = e4m3[v[k * 32 + c]] * s;
      }
      return;
    }
    case WeightFormat::kInt8Group: {
      const float* sc = t.scales.data() + e * rows * groups;
      const uint8_t* z = t.zeros.empty() ? nullptr : t.zeros.data() + e * rows * groups;
      for (int64_t k = 0; k < rows * groups; ++k) {
        const float s = sc[k];
        const uint8_t* q = v + k * g;
        float* o = out + k * g;
        if (z) {
          const int zp = z[k];
          for (int64_t c = 0; c < g; ++c)
            o[c] = static_cast<float>(static_cast<int>(q[c]) - zp) * s;
        } else {
          for (int64_t c = 0; c < g; ++c) o[c] = static_cast<float>(static_cast<int8_t>(q[c])) * s;
        }
      }
      return;
    }
    case WeightFormat::kInt4Group: {
      const float* sc = t.scales.data() + e * rows * groups;
      const uint8_t* z = t.zeros.empty() ? nullptr : t.zeros.data() + e * rows * groups;
      for (int64_t k = 0; k < rows * groups; ++k) {
        const float s = sc[k];
        if (z) {
          const int zp = z[k];
          for (int q = 0; q < 16; ++q) lut[q] = static_cast<float>(q - zp) * s;
        } else {
          for (int q = 0; q < 16; ++q) lut[q] = static_cast<float>((q ^ 8) - 8) * s;
        }
        decode_nibbles(v + k * g / 2, g / 2, lut, out + k * g);
      }
      return;
    }
    case WeightFormat::kMXFP4: {
      const uint8_t* sb = t.scale_bytes.data() + e * rows * groups;
      for (int64_t k = 0; k < rows * groups; ++k) {
        const float s = e8m0_to_float(sb[k]);
        for (int q = 0; q < 16; ++q) lut[q] = kE2M1[q] * s;
        decode_nibbles(v + k * 16, 16, lut, out + k * 32);
      }
      return;
    }
    case WeightFormat::kNVFP4: {
      const uint8_t* sb = t.scale_bytes.data() + e * rows * groups;
      const float gs = t.global_scale[e];
      for (int64_t k = 0; k < rows * groups; ++k) {
        // The block's scale first, then the element (ModelOpt's NVFP4QTensor.dequantize).
        const float s = e4m3[sb[k]] * gs;
        for (int q = 0; q < 16; ++q) lut[q] = kE2M1[q] * s;
        decode_nibbles(v + k * 8, 8, lut, out + k * 16);
      }
      return;
    }
  }
  throw Error(ErrorCode::kInternal, "dequantize_expert: unhandled weight format");
}

void prepare_activations(const QuantizedTensor& t, int64_t e, float* x, int64_t rows,
                         DType act_dtype) {
  check_expert(t, e, "prepare_activations");
  if (rows < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "prepare_activations: rows " + std::to_string(rows) + " is negative");
  const int64_t cols = t.cols;
  switch (t.format) {
    case WeightFormat::kInt8Group:
    case WeightFormat::kInt4Group: {
      if (t.pre_quant_scale.empty()) return;
      if (static_cast<int64_t>(t.pre_quant_scale.size()) < (e + 1) * cols)
        throw Error(ErrorCode::kInvalidArgument, "prepare_activations: pre_quant_scale has " +
                                                     std::to_string(t.pre_quant_scale.size()) +
                                                     " elements, too few for expert " +
                                                     std::to_string(e));
      // ModelOpt's AWQ scale multiplies the activations, a product in the activation type
      // (TensorRT-LLM tensorrt_llm/_torch/modules/linear.py, W4A16_AWQ_LinearMethod.apply).
      const float* p = t.pre_quant_scale.data() + e * cols;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          x[r * cols + c] = round_to(act_dtype, x[r * cols + c] * p[c]);
      return;
    }
    case WeightFormat::kFP8PerTensor: {
      if (t.input_scale.empty()) {
        // Dynamic per token (WeightQuant::dynamic_activations): one scale per row, amax / 448 but
        // at least 1 / (448 * 512), as vLLM's per-token FP8 quantization floors it
        // (vllm/model_executor/layers/quantization/input_quant_fp8.py, _FP8_MIN_SCALING_FACTOR),
        // so an all-zero row gets codes 0.
        for (int64_t r = 0; r < rows; ++r) {
          float* xr = x + r * cols;
          float amax = 0.0f;
          for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(xr[c]));
          const float s = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
          for (int64_t c = 0; c < cols; ++c) xr[c] = numeric::round_through_e4m3_hd(xr[c], s);
        }
        return;
      }
      if (static_cast<int64_t>(t.input_scale.size()) <= e)
        throw Error(
            ErrorCode::kInvalidArgument,
            "prepare_activations: input_scale has no entry for expert " + std::to_string(e));
      const float s = t.input_scale[e];
      for (int64_t i = 0; i < rows * cols; ++i) x[i] = numeric::round_through_e4m3_hd(x[i], s);
      return;
    }
    case WeightFormat::kFP8Block128:
    case WeightFormat::kMXFP8: {
      const bool mx = t.format == WeightFormat::kMXFP8;
      const int64_t g = mx ? 32 : 128;
      for (int64_t r = 0; r < rows; ++r) {
        float* xr = x + r * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += g) {
          const int64_t c1 = std::min(cols, c0 + g);
          float amax = 0.0f;
          for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(xr[c]));
          const float s =
              mx ? numeric::mxfp8_activation_scale_hd(amax) : std::max(amax, 1e-10f) / 448.0f;
          for (int64_t c = c0; c < c1; ++c) xr[c] = numeric::round_through_e4m3_hd(xr[c], s);
        }
      }
      return;
    }
    default:
      return;
  }
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::kFloat32:
      return x;
    case DType::kBFloat16:
      return numeric::bf16_to_float(numeric::float_to_bf16(x));
    case DType::kFloat16:
      return numeric::fp16_to_float_hd(numeric::float_to_fp16_hd(x));
    case DType::kFloat8E4M3:
      return e4m3_to_float(numeric::float_to_e4m3_hd(x));
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("round_to: ") + to_string(t) + " is not a floating-point type");
  }
}

}  // namespace moekit::quant
