// Public enumerations of moekit. Numeric ids are stable: they appear in reports, files and caches.
// Never renumber; append.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moekit {

// Element type of activations (input, output) and of dense tensors.
enum class DType : int {
  kFloat32 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
  kFloat8E4M3 = 4,  // OCP e4m3fn: bias 7, no inf, 0x7f/0xff are NaN, max 448
  kUInt8 = 5,
  kInt8 = 6,
  kInt32 = 7,
  kInt64 = 8,
};
std::size_t dtype_size(DType t);
const char* to_string(DType t);
std::optional<DType> dtype_from_string(std::string_view s);

// How expert weights are stored. Every projection W is logically [rows = out features,
// cols = in features] (PyTorch nn.Linear), one per expert, expert-major, row-major.
// `values` holds the packed elements; `scales` / `zeros` / per-expert scalars as listed.
// Each row starts on a byte boundary (4-bit formats need even cols). Scales along cols cover
// `group` consecutive columns (QuantizedTensor::group_size: 0 for bf16/fp16/fp32/fp8, 128 for
// kFP8Block128, 32/64/128 for the int formats, 32 for kMXFP4/kMXFP8, 16 for kNVFP4); except
// for kFP8Block128, cols must be a multiple of the group. Products are evaluated left to right
// in fp32 exactly as written below, so a kernel that wants bit-equal weights knows the order.
//
// kBF16, kFP16, kFP32: values are the elements, 2/2/4 bytes each, little endian. No scales.
// kFP8PerTensor (W8A8): values e4m3 bytes. weight_scale[e] fp32 (w = q * weight_scale[e]).
//   Activations are quantized with the static input_scale[e] fp32: q = sat_e4m3(x / input_scale)
//   (one scale per expert; checkpoints that store one per layer repeat it), x' = q * input_scale;
//   or, with WeightQuant::dynamic_activations (input_scale then empty), per token with the scale
//   max(amax of the row / 448, 1 / (448 * 512)), as vLLM's dynamic per-token FP8 does.
// kFP8Block128 (DeepSeek-V3): values e4m3 bytes; scales fp32 [E, ceil(rows/128), ceil(cols/128)]
//   (`weight_scale_inv`: w = q * scale of its 128x128 block; the last block row/column may be
//   partial). Activations are quantized dynamically per token per group of 128 columns (the last
//   group may be partial): s = max(amax, 1e-10) / 448 (the floor keeps an all-zero group
//   finite, as DeepSeek's kernels do), q = sat_e4m3(x / s), x' = q * s.
// kInt8Group (W8A16): values int8 (two's complement). scales fp32 [E, rows, cols/group].
//   Without zero points w = q * s; with zero points (uint8 [E, rows, cols/group]) the values
//   are uint8 and w = float(q - z) * s.
// kInt4Group (W4A16): two elements per byte, element 2j in the LOW nibble, 2j+1 in the high
//   nibble. Without zero points a nibble is signed two's complement (-8..7), w = q * s; with
//   zero points (uint8 [E, rows, cols/group], 0..15) nibbles are unsigned, w = float(q - z) * s.
//   For kInt8Group / kInt4Group an optional AWQ pre-quant (smoothing) scale pre_quant_scale
//   fp32 [E, cols] MULTIPLIES the activations before the matmul: y = W x', x' = the fp32
//   product x * pre_quant_scale rounded to act_dtype, as NVIDIA ModelOpt's exports mean it
//   (TensorRT-LLM tensorrt_llm/_torch/modules/linear.py, W4A16_AWQ_LinearMethod.apply:
//   input = input * module.pre_quant_scale, a bf16/fp16 product). The stored W carries the
//   inverse factor (W = w / pre_quant_scale per column), so that W (x * pre_quant_scale) = w x.
// kMXFP4 (gpt-oss): two e2m1 elements per byte, element 2j in the LOW nibble. scales e8m0
//   uint8 [E, rows, cols/32] (2^(s-127); 0xff is NaN). w = e2m1 * 2^(s-127). Activations stay
//   bf16/fp16.
// kNVFP4 (NVIDIA ModelOpt): two e2m1 elements per byte, element 2j in the LOW nibble. scales
//   e4m3 bytes [E, rows, cols/16] (ModelOpt's `weight_scale`); global_scale[e] fp32
//   (ModelOpt's `weight_scale_2`, amax / (6 * 448)): w = e2m1 * (e4m3_scale * global_scale[e])
//   (ModelOpt modelopt/torch/quantization/qtensor/nvfp4_tensor.py, NVFP4QTensor.dequantize:
//   per_block_scale = scale * double_scale, then unpacked values times it; the nibble order is
//   its quantize(): q[..., 1::2] << 4 | q[..., 0::2]). Weight-only: activations stay bf16/fp16
//   (W4A16), so a checkpoint's activation scale (`input_scale`, for W4A4) is checked (a finite
//   positive fp32 scalar) and not used.
// kMXFP8 (W8A8): values e4m3 bytes, scales e8m0 uint8 [E, rows, cols/32], w = q * 2^(s-127).
//   Activations are quantized dynamically per token per 32 columns: s = 2^ceil(log2(amax/448))
//   as e8m0 (float_to_e8m0_ceil of the fp32 quotient amax/448; an all-zero group gets 2^-127),
//   q = sat_e4m3(x / s), x' = q * s.
//
// e8m0 scales (kMXFP4, kMXFP8): 0xff is NaN in OCP MX. moekit refuses it: check_weights throws
// Error(kInvalidArgument) naming tensor, expert, row and group, and load_layer_weights throws
// Error(kBadFile) naming file and tensor, so no forward ever sees a NaN scale. e4m3 codes
// 0x7f / 0xff (fp8 weights, NVFP4 block scales) are not refused: they decode to NaN, and so do
// the weights they scale.
//
// What the reference (and every kernel) computes where the checkpoints' reference code leaves
// room:
//  - FC2's input: FC1's output (+bias) is rounded to act_dtype, the activation is computed in
//    fp32 from those rounded gate/up values and its result rounded to act_dtype once; that
//    rounded value is what W8A8 formats then quantize (DeepSeek-V3 inference/model.py,
//    Expert.forward: w2(silu(w1(x)) * w3(x)) with bf16 tensors, and kernel.py act_quant reads
//    that bf16 input and computes in fp32). PyTorch's eager bf16 also rounds silu(gate) before
//    the product; moekit does not (about one bf16 ulp of difference in FC2's input).
//  - sat_e4m3(v): v rounded to the nearest e4m3fn value, ties to even; |v| beyond 448 (after
//    rounding, infinities included) gives +-448, as PTX cvt.rn.satfinite.e4m3x2.f32 and vLLM's
//    clamp before the cast do; NaN gives NaN (0x7f). Subnormals (down to 2^-9) are kept.
enum class WeightFormat : int {
  kBF16 = 1,
  kFP16 = 2,
  kFP32 = 3,
  kFP8PerTensor = 4,
  kFP8Block128 = 5,
  kInt8Group = 6,
  kInt4Group = 7,
  kMXFP4 = 8,
  kNVFP4 = 9,
  kMXFP8 = 10,
};
const char* to_string(WeightFormat f);
std::optional<WeightFormat> weight_format_from_string(std::string_view s);
// Elements along `cols` that share one scale (0 = per tensor / none). `group` is the user's
// group size for the int formats and ignored otherwise.
int format_scale_group(WeightFormat f, int group);
// Block of rows sharing one scale (128 for kFP8Block128, 1 otherwise).
int format_row_block(WeightFormat f);
// Bits per stored value (4 or 8 or 16 or 32).
int format_value_bits(WeightFormat f);
bool format_quantizes_activations(WeightFormat f);  // W8A8 kinds

// The gated (or not) activation between FC1 and FC2.
enum class ActivationKind : int {
  kSwiGLU = 1,         // silu(gate) * up
  kSwiGLUClamped = 2,  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
                       //   out = g * sigmoid(alpha * g) * (u + beta); defaults alpha 1, beta 0
  kGeGLUTanh = 3,      // gelu_tanh(gate) * up
  kGeGLUErf = 4,       // gelu_erf(gate) * up
  kSiLU = 5,           // non-gated: FC1 has `intermediate` rows
  kGeLUTanh = 6,
  kGeLUErf = 7,
  kReLU2 = 8,  // relu(x)^2
  kIdentity = 9,
};
const char* to_string(ActivationKind a);
std::optional<ActivationKind> activation_from_string(std::string_view s);
bool activation_is_gated(ActivationKind a);

// Where gate and up sit in the fused FC1 weight [2I, H] of a gated activation.
enum class GateUpLayout : int {
  kHalves = 1,       // rows [0, I) are gate, rows [I, 2I) are up (vLLM w13: w1 then w3)
  kInterleaved = 2,  // row 2i is gate i, row 2i+1 is up i (gpt-oss gate_up_proj)
};
const char* to_string(GateUpLayout l);
std::optional<GateUpLayout> gate_up_layout_from_string(std::string_view s);

// How a token's experts and their weights come from its router logits [E]. Every method selects
// the experts with the largest selection score, ties to the LOWER expert id (DeepSeek-V3's groups:
// the lower group id), and writes the slots in that order; a NaN logit counts as -inf (chosen
// last, weight 0). routed_scaling_factor multiplies the weights of every computed method. The
// model code each follows (transformers' files under src/transformers/models/):
enum class RoutingMethod : int {
  // softmax over all E logits, the top-k of it, not renormalized: Qwen2-MoE and OLMoE with
  // norm_topk_prob false (Qwen2MoeSparseMoeBlock.forward in qwen2_moe/modeling_qwen2_moe.py,
  // OlmoeSparseMoeBlock.forward in olmoe/modeling_olmoe.py; Qwen1.5-MoE-A2.7B, OLMoE-1B-7B).
  kSoftmaxTopK = 1,
  // the top-k logits, softmax over those k: gpt-oss (MLPBlock.forward in gpt_oss/torch/model.py);
  // equal to softmax-then-renormalized-top-k, hence Mixtral (MixtralSparseMoeBlock.forward in
  // mixtral/modeling_mixtral.py) and Qwen3-MoE (Qwen3MoeSparseMoeBlock.forward in
  // qwen3_moe/modeling_qwen3_moe.py, norm_topk_prob true).
  kTopKSoftmax = 2,
  // sigmoid scores, the correction bias added for selection only, the topk_group groups with the
  // best top-2 sums, top-k within them, the plain scores renormalized (sum + 1e-20) when
  // `renormalize`, times routed_scaling_factor: DeepSeek-V3 (Gate.forward in the model authors'
  // inference/model.py; MoEGate.forward, noaux_tc, in the checkpoint's modeling_deepseek.py).
  kDeepSeekV3 = 3,
  // the top-k logits, each slot's weight the sigmoid of its own logit, not renormalized (any
  // k): Llama-4 (Llama4Router.forward in llama4/modeling_llama4.py). Llama-4 applies it to the
  // experts' input (RouterWeightPlacement::kInput, which the preset sets).
  kLlama4 = 4,
  kExternal = 5,  // caller passes ids and weights (used as given: no scaling factor)
};
const char* to_string(RoutingMethod r);
std::optional<RoutingMethod> routing_from_string(std::string_view s);

// Where a token's routing weight multiplies: the expert's output (the common case: the weighted
// sum over the k experts' outputs) or the expert's input (Llama-4: Hugging Face's
// Llama4TextMoe.forward computes routed_in = hidden_states * router_scores before the experts;
// vLLM passes apply_router_weight_on_input=True). With a non-linear activation the two differ.
// kInput: slot s of a token reads x_s = round_to_act_dtype(float(x) * w_s) (the fp32 weight
// times the row in fp32, rounded once to nearest even; Hugging Face rounds the sigmoid score to
// bf16 and multiplies in bf16, at most one bf16 ulp of x_s away), and the token's output is the
// plain sum of its slots' expert outputs (biases included), weight 1 each. With top_k above 1
// each selected expert gets the row scaled by its own weight, as in Hugging Face's code, where
// every expert gets the row times its score and the unselected ones score sigmoid(-inf) = 0.
enum class RouterWeightPlacement : int {
  kOutput = 1,
  kInput = 2,
};
const char* to_string(RouterWeightPlacement p);
std::optional<RouterWeightPlacement> router_weight_placement_from_string(std::string_view s);

}  // namespace moekit
