#include "common/host_activations.hpp"

#include <algorithm>
#include <string>

#include "common/numeric.hpp"
#include "moekit/status.hpp"

namespace moekit {

void view_to_f32(const TensorView& v, float* out) {
  const int64_t n = v.numel();
  switch (v.dtype) {
    case DType::kFloat32:
      std::copy_n(v.as<const float>(), n, out);
      return;
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) out[i] = numeric::bf16_to_float(v.as<const uint16_t>()[i]);
      return;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) out[i] = numeric::fp16_to_float(v.as<const uint16_t>()[i]);
      return;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("cannot read activations of dtype ") + to_string(v.dtype) + ".");
  }
}

void f32_to_view(const float* in, const TensorView& v) {
  const int64_t n = v.numel();
  switch (v.dtype) {
    case DType::kFloat32:
      std::copy_n(in, n, v.as<float>());
      return;
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) v.as<uint16_t>()[i] = numeric::float_to_bf16(in[i]);
      return;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) v.as<uint16_t>()[i] = numeric::float_to_fp16(in[i]);
      return;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("cannot write activations of dtype ") + to_string(v.dtype) + ".");
  }
}

}  // namespace moekit
