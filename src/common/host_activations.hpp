// Activation tensors on the host read as fp32 and written back in their dtype (fp32, bf16,
// fp16): the CPU reference engine and the expert-parallel layer's combine.
#pragma once
#include "moekit/tensor.hpp"

namespace moekit {

// out[v.numel()] = v's elements as fp32. Throws Error(kInvalidArgument) naming the dtype when
// it is not an activation dtype.
void view_to_f32(const TensorView& v, float* out);
// v's elements = in[v.numel()] rounded to v's dtype (round to nearest even).
void f32_to_view(const float* in, const TensorView& v);

}  // namespace moekit
