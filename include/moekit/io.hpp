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
  // name + suffix, [ceil(out/128), ceil(in/128)], fp32 (bf16 / fp16 read and widened).
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
MoeWeights load_layer_weights(const std::vector<std::string>& files, const ModelFamily& family,
                              int layer, const MoeSpec& spec);

// The tensors `family` stores for layer `layer`, from the FULL weights of an unsharded spec
// (tp_size = ep_size = 1, else Error(kInvalidArgument)). Metadata entries go to `metadata`.
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
