// Weight and tensor files: plain named tensors (the inputs and outputs of `moekit run`), and one
// MoE layer's experts read from / written to safetensors files laid out as real checkpoints are,
// chosen by a model-family description rather than names spelled at call sites.
//
// Every malformed file (truncated, header length past the end or over 100 MB, bad JSON, JSON nested
// deeper than 64 levels, a tensor name or key that appears twice, a shape of more than 64
// dimensions or whose size overflows int64, offsets outside the data, reversed, overlapping or not
// matching shape x dtype, a dtype or shape that does not match the description, a missing tensor)
// is Error(kBadFile) whose message names the file and the tensor. The OS refusing to read or write,
// a missing file, and a path that is not a regular file (a FIFO, a device, a folder: refused
// without reading or blocking) are Error(kIo).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/spec.hpp"
#include "moekit/types.hpp"
#include "moekit/weights.hpp"

namespace moekit {

// ---- Plain named tensors -----------------------------------------------------------------------

// A dense tensor with its name, owning its little-endian bytes (row-major, contiguous).
struct NamedTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  // Error(kInvalidArgument) for a negative extent or a shape whose byte size overflows int64.
  int64_t numel() const;
};

// Copies numel(shape) * dtype_size(dtype) bytes from `data`. Error(kInvalidArgument) for a
// negative extent or a shape whose byte size overflows int64 (as for the functions below).
NamedTensor make_named_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                              const void* data);
// Rounds `values` (numel(shape) of them) to dtype bf16 / fp16 / fp32, nearest even.
NamedTensor named_tensor_from_floats(std::string name, DType dtype, std::vector<int64_t> shape,
                                     const float* values);
// The elements of a bf16 / fp16 / fp32 tensor as fp32 (Error(kInvalidArgument) for others).
std::vector<float> named_tensor_to_floats(const NamedTensor& t);

// Names of the tensors in `file`, sorted.
std::vector<std::string> list_tensors(const std::string& file);
// One tensor; Error(kBadFile) naming file and tensor when absent or of a dtype moekit has no
// DType for (e.g. F64).
NamedTensor read_tensor(const std::string& file, const std::string& name);
// Every tensor of `file`, sorted by name.
std::vector<NamedTensor> read_tensors(const std::string& file);
// Writes `tensors` (any order; written sorted by name) with optional string metadata. The file is
// replaced atomically: written to a new temporary file in its folder (created exclusively, never
// through an existing file or symlink) and renamed onto `file`, so a failure leaves `file` as it
// was and no temporary behind. `file` may be one that read_tensors() read: reading copies it all.
void write_tensors(const std::string& file, const std::vector<NamedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata = {});
// The string metadata (`__metadata__`) of `file`.
std::map<std::string, std::string> read_metadata(const std::string& file);

// ---- Model families ----------------------------------------------------------------------------

// How a family stores one layer's experts.
enum class ExpertStorage : int {
  // One 2-D tensor per expert and projection, [out, in] (nn.Linear): Mixtral, Qwen3-MoE,
  // DeepSeek-V3. Dense formats, or fp8 block-128 (F8_E4M3) with a scale tensor named weight
  // name + suffix, [ceil(out/128), ceil(in/128)], fp32 (bf16 / fp16 read and widened), or
  // ModelOpt's NVFP4 (below), or int4_group / int8_group as AWQ or GPTQ packs them (read only:
  // see "AWQ and GPTQ checkpoints").
  kPerExpert = 1,
  // One tensor per projection for all experts (gpt-oss, Llama-4). Dense formats are stored
  // in-features first, as torch.bmm reads them: gate_up [E, H, fc1 rows], down [E, I, H].
  // MXFP4 is stored out-features first: blocks [E, rows, cols/32, 16] uint8 (two e2m1 per byte,
  // low nibble first) and scales [E, rows, cols/32] uint8 (e8m0; F8_E8M0 also read). MXFP8 the
  // same with blocks [E, rows, cols/32, 32]. No other quantized format.
  kFused = 2,
  // moekit's own layout: the QuantizedTensor buffers as they are in memory (any format), fc1
  // already fused; metadata records the format and the gate/up layout. Written by moekit.
  kNative = 3,
};

// A model family: the names (with "{L}" = layer, "{e}" = expert) and layouts of its tensors.
// Plain data: copy one and change a name to read a checkpoint that differs slightly.
struct ModelFamily {
  std::string name;  // "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4", "moekit"
  std::string description;
  ExpertStorage storage = ExpertStorage::kPerExpert;
  std::vector<WeightFormat> formats;  // weight formats its files can hold

  // kPerExpert
  // e.g. "model.layers.{L}.mlp.experts.{e}.gate_proj.weight"
  std::string gate_proj, up_proj, down_proj;
  std::string block_scale_suffix;  // "_scale_inv": fp8 block scales = weight name + this
  // kNVFP4 per-expert files use NVIDIA ModelOpt's names beside each `...weight`: weight_scale
  // (e4m3 block scales), weight_scale_2 (fp32 global scale, gate and up equal) and, optional,
  // input_scale (W4A4's activation scale: checked, not used).

  // kFused (and kNative: fused_gate_up / fused_down are name prefixes there)
  std::string fused_gate_up, fused_down;  // dense tensors / prefix of the MXFP4 pair
  std::string blocks_suffix = "_blocks", scales_suffix = "_scales";  // MXFP4 pair
  GateUpLayout fused_layout = GateUpLayout::kHalves;  // gate/up order inside the fused FC1

  // Biases (empty name = the family has none). Stored in bias_dtype; loading accepts bf16, fp16
  // or fp32 and converts to fp32; saving rounds to bias_dtype.
  std::string gate_up_bias, down_bias;  // [E, fc1 rows] in fused_layout order, [E, H]
  DType bias_dtype = DType::kBFloat16;

  // Router (not part of MoeWeights; named here so tools can find it), and the DeepSeek-V3
  // selection bias [E] fp32 that goes to MoeWeights::routing_bias.
  std::string router_weight, router_bias, correction_bias;
};

// mixtral, qwen3_moe, deepseek_v3, gpt_oss, llama4, moekit.
const std::vector<ModelFamily>& model_families();
// Error(kNotFound) listing the known names.
const ModelFamily& find_model_family(std::string_view name);
// A name template with {L} and {e} filled in.
std::string expand_tensor_name(std::string_view pattern, int layer, int64_t expert = 0);

// ---- AWQ and GPTQ checkpoints ------------------------------------------------------------------
//
// int4_group / int8_group weights of a kPerExpert family (mixtral, qwen3_moe, deepseek_v3) are read
// from the tensors AutoAWQ's GEMM layout or GPTQ's layout write beside each projection in place
// of its `weight` (the projection's prefix, e.g. "...experts.3.w1."), and unpacked into moekit's
// canonical layout (include/moekit/types.hpp). Out features N = rows, in features K = cols:
//  - AWQ (AutoAWQ awq/modules/linear/gemm.py, WQLinear_GEMM; awq/utils/packing_utils.py):
//    qweight I32 [K, N/8], eight 4-bit values of consecutive out features per word in AWQ's
//    order (nibble i holds out feature 8c + AWQ_ORDER[i], AWQ_ORDER = 0 2 4 6 1 3 5 7); qzeros
//    I32 [K/group, N/8] packed the same; scales [K/group, N]; w = (q - z) * s. 4-bit only.
//  - GPTQ (AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, QuantLinear.pack):
//    qweight I32 [K * bits/32, N], 32/bits values of consecutive in features per word, lowest
//    bits first; qzeros I32 [K/group, N * bits/32] packed along N the same way; scales
//    [K/group, N]; optional g_idx I32 [K]. bits 4 or 8. The "gptq" checkpoint format stores each
//    zero point minus one (AutoGPTQ's `zeros -= 1`; readers add one back), "gptq_v2" (GPTQModel)
//    stores it as is; w = (q - z) * s.
// Scales may be F16 (as both write them), BF16 or F32, and are widened to fp32 exactly. A
// `pre_quant_scale` [K] (F32, BF16 or F16) beside a projection is an AWQ smoothing scale that
// multiplies the activations (ModelOpt's and TensorRT-LLM's name and meaning): it is loaded when
// the spec has weights.pre_quant_scale (gate and up must then hold the same one, since they share
// FC1's) and refused (kFormatMismatch) otherwise, never dropped.
// With weights.zero_points the zero points are kept (0..2^bits-1); without, every zero point must
// be the midpoint 2^(bits-1) (GPTQ's sym = true) and the values become signed q - 2^(bits-1), the
// same weights; an asymmetric file then is Error(kFormatMismatch) naming tensor, expert and group.
// A g_idx whose entry k is not k / group (GPTQ's desc_act = true act-order reorders the groups)
// is Error(kUnsupported): moekit's groups are contiguous columns. The config's sym and desc_act
// are not consulted; the zero points and g_idx themselves are checked.
// Errors beyond load_layer_weights' own: the config (before any tensor is read) kBadFile when
// none is found beside the files or its group size does not divide a projection's in features
// (the tensor named), kInvalidArgument for a given config without quant_method, kUnsupported for
// another quant_method, bits other than 4 / 8 (AWQ: 4), group size -1 or other than 32 / 64 /
// 128, AWQ version other than gemm (gemv, gemv_fast, marlin pack otherwise), GPTQ format other
// than gptq / gptq_v2 (marlin, bitblas), kFormatMismatch for bits or group size other than the
// spec's; the tensors (file and tensor named) kBadFile for one missing or of another dtype or
// shape (qzeros included) and a stored zero point that reads past 2^bits - 1 (the gptq format's
// stored 2^bits - 1), kUnsupported for an act-order g_idx and gate and up pre-quant scales that
// differ, kFormatMismatch for an asymmetric zero point without weights.zero_points and a tensor
// beside a projection that is not read (a g_idx beside AWQ packs, a bias, a pre_quant_scale).
//
// What a checkpoint's quantization config says about how its int weights are packed.
struct QuantizationConfig {
  std::string source;        // the file it was read from; "" when none held one
  std::string quant_method;  // "awq", "gptq" or another quantizer's name; "" when none
  int bits = 0;              // 0: not stated
  int group_size = 0;        // 0: not stated; -1: one group per row
  // AWQ's "version" (gemm, gemv, gemv_fast, marlin) or GPTQ's "checkpoint_format" (gptq,
  // gptq_v2, marlin, bitblas; "marlin" too for AutoGPTQ's is_marlin_format), lower case; ""
  // when not stated, which means gemm for AWQ and gptq (zero points stored minus one) for GPTQ.
  std::string format;
};

// The quantization config of the checkpoint in `folder` (a file's path: its folder): the
// `quantization_config` object of config.json (transformers' AwqConfig / GPTQConfig and what
// AutoAWQ, AutoGPTQ and GPTQModel write there), else quantize_config.json (AutoGPTQ, GPTQModel;
// quant_method gptq unless it says otherwise), else quant_config.json (AutoAWQ: w_bit,
// q_group_size, version; quant_method awq). quant_method "" when none of them holds one.
// Error(kBadFile) naming the file (and the key) when a file is not a JSON object (the same checks
// as a checkpoint index) or a key has the wrong type; Error(kIo) when one cannot be read.
QuantizationConfig read_quantization_config(const std::string& folder);

// ---- Loading and saving one layer ------------------------------------------------------------

// Reads layer `layer`'s experts for `spec` from the checkpoint shards `files` (a tensor may be in
// any of them; each file is mapped, only the needed bytes are read).
// Loads the LOCAL shard for spec's TP/EP rank: local experts [first, first + E/ep) only, and the
// local intermediate slice [off, off + I/tp) of FC1's gate and up rows and of FC2's columns, in
// moekit's canonical layout (FC1 = gate and up fused as spec.gate_up_layout says; biases fp32,
// fc2_bias and routing_bias whole). The result equals shard_weights(spec, <full set>) and passes
// check_weights(spec, .).
// Errors: kInvalidSpec (spec invalid), kUnsupported (the family cannot hold spec's format,
// activation, biases or gate/up layout; NVFP4 gate and up with different global scales), kBadFile
// (missing tensor, dtype or shape other than described: file, tensor, expected and found are named;
// an e8m0 NaN scale 0xff of a local expert), kFormatMismatch (a kNative file of another format, or
// a tensor of this layer's experts that the spec's options do not read: zero points, an AWQ scale,
// another format's scales, a bias or correction bias the spec lacks; file and tensor are named).
//
// int4_group / int8_group on a kPerExpert family are AWQ or GPTQ checkpoints (below): this form
// reads their quantization config with read_quantization_config() from the folder of files[0],
// and only for those formats, so other checkpoints never need one.
MoeWeights load_layer_weights(const std::vector<std::string>& files, const ModelFamily& family,
                              int layer, const MoeSpec& spec);
// The same with the quantization config given (for files whose folder lacks it).
MoeWeights load_layer_weights(const std::vector<std::string>& files, const ModelFamily& family,
                              int layer, const MoeSpec& spec, const QuantizationConfig& quant);

// The tensors `family` stores for layer `layer`, from the FULL weights of an unsharded spec
// (tp_size = ep_size = 1, else Error(kInvalidArgument)). Metadata entries go to `metadata`.
// int4_group / int8_group go to the moekit family only: a kPerExpert family's AWQ / GPTQ packs
// are read, not written (Error(kUnsupported)).
std::vector<NamedTensor> layer_weight_tensors(
    const ModelFamily& family, int layer, const MoeSpec& spec, const MoeWeights& weights,
    std::map<std::string, std::string>* metadata = nullptr);
// Writes layer_weight_tensors(...) to `file`.
void save_layer_weights(const std::string& file, const ModelFamily& family, int layer,
                        const MoeSpec& spec, const MoeWeights& weights);

// The safetensors files of a checkpoint: `path` itself when it is a file, every *.safetensors
// of a folder (sorted), or the files a *.safetensors.index.json names (its weight_map).
// An index is checked as a downloaded file must be: Error(kBadFile) naming the index and the
// weight_map entry for a shard name that is absolute or holds "..", a shard that is missing or not
// a regular file or that resolves (through symlinks) outside the index's folder, and for an
// index that is not JSON, nests deeper than 64 levels or repeats a key in one object.
std::vector<std::string> checkpoint_files(const std::string& path);

}  // namespace moekit
