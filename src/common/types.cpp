// Names and properties of the public enumerations (types.hpp).
#include <string>

#include "moekit/status.hpp"
#include "moekit/types.hpp"

namespace moekit {
namespace {

// Names compare case-insensitively, with '-' and '_' equal, so "FP8-Block128" is found too.
std::string normalize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c == '-') c = '_';
  }
  return out;
}

template <class E>
struct Alias {
  const char* name;
  E value;
};

template <class E, std::size_t N>
std::optional<E> lookup(const Alias<E> (&table)[N], std::string_view s) {
  const std::string n = normalize(s);
  for (const auto& a : table)
    if (n == a.name) return a.value;
  return std::nullopt;
}

[[noreturn]] void bad_enum(const char* type, int v) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(type) + " value " + std::to_string(v) + " is not a known " + type);
}

}  // namespace

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat16:
      return 2;
    case DType::kFloat8E4M3:
      return 1;
    case DType::kUInt8:
      return 1;
    case DType::kInt8:
      return 1;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  bad_enum("DType", static_cast<int>(t));
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kFloat8E4M3:
      return "fp8_e4m3";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

std::optional<DType> dtype_from_string(std::string_view s) {
  static const Alias<DType> kNames[] = {
      {"fp32", DType::kFloat32},
      {"float32", DType::kFloat32},
      {"f32", DType::kFloat32},
      {"float", DType::kFloat32},
      {"bf16", DType::kBFloat16},
      {"bfloat16", DType::kBFloat16},
      {"fp16", DType::kFloat16},
      {"float16", DType::kFloat16},
      {"f16", DType::kFloat16},
      {"half", DType::kFloat16},
      {"fp8_e4m3", DType::kFloat8E4M3},
      {"fp8", DType::kFloat8E4M3},
      {"e4m3", DType::kFloat8E4M3},
      {"float8_e4m3fn", DType::kFloat8E4M3},
      {"f8_e4m3", DType::kFloat8E4M3},
      {"uint8", DType::kUInt8},
      {"u8", DType::kUInt8},
      {"int8", DType::kInt8},
      {"i8", DType::kInt8},
      {"int32", DType::kInt32},
      {"i32", DType::kInt32},
      {"int64", DType::kInt64},
      {"i64", DType::kInt64},
  };
  return lookup(kNames, s);
}

const char* to_string(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kFP16:
      return "fp16";
    case WeightFormat::kFP32:
      return "fp32";
    case WeightFormat::kFP8PerTensor:
      return "fp8";
    case WeightFormat::kFP8Block128:
      return "fp8_block128";
    case WeightFormat::kInt8Group:
      return "int8_group";
    case WeightFormat::kInt4Group:
      return "int4_group";
    case WeightFormat::kMXFP4:
      return "mxfp4";
    case WeightFormat::kNVFP4:
      return "nvfp4";
    case WeightFormat::kMXFP8:
      return "mxfp8";
  }
  return "unknown";
}

std::optional<WeightFormat> weight_format_from_string(std::string_view s) {
  static const Alias<WeightFormat> kNames[] = {
      {"bf16", WeightFormat::kBF16},
      {"bfloat16", WeightFormat::kBF16},
      {"fp16", WeightFormat::kFP16},
      {"float16", WeightFormat::kFP16},
      {"half", WeightFormat::kFP16},
      {"fp32", WeightFormat::kFP32},
      {"float32", WeightFormat::kFP32},
      {"fp8", WeightFormat::kFP8PerTensor},
      {"fp8_per_tensor", WeightFormat::kFP8PerTensor},
      {"fp8_tensor", WeightFormat::kFP8PerTensor},
      {"w8a8_fp8", WeightFormat::kFP8PerTensor},
      {"fp8_block128", WeightFormat::kFP8Block128},
      {"fp8_block", WeightFormat::kFP8Block128},
      {"fp8_block_128", WeightFormat::kFP8Block128},
      {"fp8block128", WeightFormat::kFP8Block128},
      {"int8_group", WeightFormat::kInt8Group},
      {"int8", WeightFormat::kInt8Group},
      {"w8a16", WeightFormat::kInt8Group},
      {"int4_group", WeightFormat::kInt4Group},
      {"int4", WeightFormat::kInt4Group},
      {"w4a16", WeightFormat::kInt4Group},
      {"mxfp4", WeightFormat::kMXFP4},
      {"nvfp4", WeightFormat::kNVFP4},
      {"mxfp8", WeightFormat::kMXFP8},
  };
  return lookup(kNames, s);
}

int format_scale_group(WeightFormat f, int group) {
  switch (f) {
    case WeightFormat::kBF16:
    case WeightFormat::kFP16:
    case WeightFormat::kFP32:
    case WeightFormat::kFP8PerTensor:
      return 0;
    case WeightFormat::kFP8Block128:
      return 128;
    case WeightFormat::kInt8Group:
    case WeightFormat::kInt4Group:
      return group;
    case WeightFormat::kMXFP4:
      return 32;
    case WeightFormat::kNVFP4:
      return 16;
    case WeightFormat::kMXFP8:
      return 32;
  }
  bad_enum("WeightFormat", static_cast<int>(f));
}

int format_row_block(WeightFormat f) {
  if (f == WeightFormat::kFP8Block128) return 128;
  (void)format_value_bits(f);  // rejects unknown values
  return 1;
}

int format_value_bits(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16:
    case WeightFormat::kFP16:
      return 16;
    case WeightFormat::kFP32:
      return 32;
    case WeightFormat::kFP8PerTensor:
    case WeightFormat::kFP8Block128:
    case WeightFormat::kInt8Group:
    case WeightFormat::kMXFP8:
      return 8;
    case WeightFormat::kInt4Group:
    case WeightFormat::kMXFP4:
    case WeightFormat::kNVFP4:
      return 4;
  }
  bad_enum("WeightFormat", static_cast<int>(f));
}

bool format_quantizes_activations(WeightFormat f) {
  return f == WeightFormat::kFP8PerTensor || f == WeightFormat::kFP8Block128 ||
         f == WeightFormat::kMXFP8;
}

const char* to_string(ActivationKind a) {
  switch (a) {
    case ActivationKind::kSwiGLU:
      return "swiglu";
    case ActivationKind::kSwiGLUClamped:
      return "swiglu_clamped";
    case ActivationKind::kGeGLUTanh:
      return "geglu_tanh";
    case ActivationKind::kGeGLUErf:
      return "geglu_erf";
    case ActivationKind::kSiLU:
      return "silu";
    case ActivationKind::kGeLUTanh:
      return "gelu_tanh";
    case ActivationKind::kGeLUErf:
      return "gelu_erf";
    case ActivationKind::kReLU2:
      return "relu2";
    case ActivationKind::kIdentity:
      return "identity";
  }
  return "unknown";
}

std::optional<ActivationKind> activation_from_string(std::string_view s) {
  static const Alias<ActivationKind> kNames[] = {
      {"swiglu", ActivationKind::kSwiGLU},
      {"silu_and_mul", ActivationKind::kSwiGLU},
      {"swiglu_clamped", ActivationKind::kSwiGLUClamped},
      {"swigluoai", ActivationKind::kSwiGLUClamped},
      {"swiglu_oai", ActivationKind::kSwiGLUClamped},
      {"geglu_tanh", ActivationKind::kGeGLUTanh},
      {"gelu_tanh_and_mul", ActivationKind::kGeGLUTanh},
      {"geglu_erf", ActivationKind::kGeGLUErf},
      {"gelu_and_mul", ActivationKind::kGeGLUErf},
      {"silu", ActivationKind::kSiLU},
      {"swish", ActivationKind::kSiLU},
      {"gelu_tanh", ActivationKind::kGeLUTanh},
      {"gelu_pytorch_tanh", ActivationKind::kGeLUTanh},
      {"gelu_erf", ActivationKind::kGeLUErf},
      {"gelu", ActivationKind::kGeLUErf},
      {"relu2", ActivationKind::kReLU2},
      {"relu_squared", ActivationKind::kReLU2},
      {"squared_relu", ActivationKind::kReLU2},
      {"identity", ActivationKind::kIdentity},
      {"none", ActivationKind::kIdentity},
      {"linear", ActivationKind::kIdentity},
  };
  return lookup(kNames, s);
}

bool activation_is_gated(ActivationKind a) {
  return a == ActivationKind::kSwiGLU || a == ActivationKind::kSwiGLUClamped ||
         a == ActivationKind::kGeGLUTanh || a == ActivationKind::kGeGLUErf;
}

const char* to_string(GateUpLayout l) {
  switch (l) {
    case GateUpLayout::kHalves:
      return "halves";
    case GateUpLayout::kInterleaved:
      return "interleaved";
  }
  return "unknown";
}

std::optional<GateUpLayout> gate_up_layout_from_string(std::string_view s) {
  static const Alias<GateUpLayout> kNames[] = {
      {"halves", GateUpLayout::kHalves},          {"halved", GateUpLayout::kHalves},
      {"concat", GateUpLayout::kHalves},          {"interleaved", GateUpLayout::kInterleaved},
      {"interleave", GateUpLayout::kInterleaved},
  };
  return lookup(kNames, s);
}

const char* to_string(RouterWeightPlacement p) {
  switch (p) {
    case RouterWeightPlacement::kOutput:
      return "output";
    case RouterWeightPlacement::kInput:
      return "input";
  }
  return "unknown";
}

std::optional<RouterWeightPlacement> router_weight_placement_from_string(std::string_view s) {
  static const Alias<RouterWeightPlacement> kNames[] = {
      {"output", RouterWeightPlacement::kOutput},
      {"on_output", RouterWeightPlacement::kOutput},
      {"input", RouterWeightPlacement::kInput},
      {"on_input", RouterWeightPlacement::kInput},
  };
  return lookup(kNames, s);
}

const char* to_string(RoutingMethod r) {
  switch (r) {
    case RoutingMethod::kSoftmaxTopK:
      return "softmax_topk";
    case RoutingMethod::kTopKSoftmax:
      return "topk_softmax";
    case RoutingMethod::kDeepSeekV3:
      return "deepseek_v3";
    case RoutingMethod::kLlama4:
      return "llama4";
    case RoutingMethod::kExternal:
      return "external";
  }
  return "unknown";
}

std::optional<RoutingMethod> routing_from_string(std::string_view s) {
  static const Alias<RoutingMethod> kNames[] = {
      {"softmax_topk", RoutingMethod::kSoftmaxTopK}, {"mixtral", RoutingMethod::kSoftmaxTopK},
      {"topk_softmax", RoutingMethod::kTopKSoftmax}, {"renormalize", RoutingMethod::kTopKSoftmax},
      {"deepseek_v3", RoutingMethod::kDeepSeekV3},   {"deepseekv3", RoutingMethod::kDeepSeekV3},
      {"deepseek", RoutingMethod::kDeepSeekV3},      {"llama4", RoutingMethod::kLlama4},
      {"llama_4", RoutingMethod::kLlama4},           {"external", RoutingMethod::kExternal},
      {"custom", RoutingMethod::kExternal},
  };
  return lookup(kNames, s);
}

}  // namespace moekit
