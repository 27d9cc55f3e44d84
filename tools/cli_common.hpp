// Pieces shared by the `moekit` subcommands: building a spec from options, random inputs,
// running a layer where its implementation wants the data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_trace.hpp"
#include "moekit/io.hpp"
#include "moekit/layer.hpp"
#include "moekit/spec.hpp"
#include "tune/rank_tactics.hpp"
#include "tune/routing_profile.hpp"

namespace moekit::cli {

// Host copies of one forward's inputs. hidden is stored in the spec's act dtype (raw bytes).
struct HostInputs {
  int64_t tokens = 0;
  std::vector<uint8_t> hidden;       // [T, H] act dtype
  std::vector<float> router_logits;  // [T, E] (empty for external routing)
  std::vector<int32_t> topk_ids;     // [T, k] (external routing only)
  std::vector<float> topk_weights;   // [T, k]
};

// Command-line numbers, refused with a sentence naming the flag and the text: an integer
// (written plainly or as an exact 1e6-style number) of at least `min`, or a finite float.
int64_t parse_integer(const std::string& flag, const std::string& text, int64_t min);
// The same, for a value that must also fit an int.
int parse_int(const std::string& flag, const std::string& text, int min);
float parse_real(const std::string& flag, const std::string& text);
// The whole file; Error(kIo) names it when it cannot be read.
std::string read_text_file(const std::string& path);

// Host memory the CLI is about to allocate, refused (Error kInvalidArgument, naming `what`, the
// size and the machine's memory) where it exceeds this machine's physical memory: an absurd size
// is a sentence, not an attempt that the OS kills.
void check_host_bytes(int64_t bytes, const std::string& what);
// Host bytes of the inputs (and the output) of a forward of `tokens` tokens, and of the spec's
// weights in its format (drawn or loaded), in 64-bit arithmetic (the spec is valid, so no
// product overflows).
int64_t forward_host_bytes(const MoeSpec& spec, int64_t tokens);
int64_t weight_host_bytes(const MoeSpec& spec);
// Bytes of one local expert's FC1 and FC2 in the spec's weight format, scales included
// (expert_matrix_bytes): what a forward must read for each expert it hits.
int64_t local_expert_bytes(const MoeSpec& spec);

// The resolver's choice for `backend`, or Error(kUnsupported) with its reason in one line: run
// and bench refuse before building any weight.
Resolution resolve_or_refuse(const MoeSpec& spec, const std::string& backend);

HostInputs random_inputs(const MoeSpec& spec, int64_t tokens, uint64_t seed);

// Inputs from a tensors file: 'hidden' [T, H] (any float dtype, rounded to the act dtype) and
// 'router_logits' [T, E], or 'topk_ids' [T, k] int32 + 'topk_weights' [T, k] for external routing.
// Error(kBadFile) names the file and the tensor that is missing or of the wrong shape.
HostInputs inputs_from_tensors(const MoeSpec& spec, const std::vector<NamedTensor>& tensors,
                               const std::string& file);
// The output as tensor 'output' [T, H] in the spec's act dtype.
NamedTensor output_tensor(const MoeSpec& spec, const std::vector<float>& output, int64_t tokens);

// Random weights for the benchmark, never zeros: bf16/fp16 drawn fast (multithreaded, uniform
// with the variance of N(0, 1/fan_in)); every other format by quant::make_random_weights
// (normal, then quantized with scales from the data; parallel over the experts).
MoeWeights bench_random_weights(const MoeSpec& spec, uint64_t seed);

struct RunResult {
  std::vector<float> output;  // [T, H] as fp32
  double milliseconds = 0;    // one forward, after a warm-up
};

// Runs one forward on the host (host implementations) or the device.
RunResult run_layer(MoeLayer& layer, const HostInputs& in);

// The device half of run_layer (cli_cuda.cpp; a build without CUDA throws kUnsupported).
RunResult run_layer_on_device(MoeLayer& layer, const HostInputs& in);

struct BenchRow {
  std::string preset;
  int64_t tokens = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  int reps = 0;
  int64_t experts_hit = 0;
  double bytes = 0, flops = 0;
  ForwardTrace trace;  // replays 0: not traced
};
struct Floors {
  double copy_bytes_per_s = 0;  // device-to-device copy, read + write bytes counted
  double read_bytes_per_s = 0;  // read-only stream of 2 GiB (plain 16-byte loads): bytes floor
  double gemm_flops_per_s = 0;  // dense BF16 GEMM 8192^3 through cuBLAS
  // Dense FP8 GEMM 8192^3 through cuBLASLt: e4m3 x e4m3 -> bf16, fp32 compute, unit per-tensor
  // scales, fast accumulation (the machine's FP8 rate, the FLOP floor of the FP8 formats).
  double fp8_gemm_flops_per_s = 0;
  // A graph of one empty kernel, replayed and timed as the bench's rows (L2 flush before each):
  // the part of every row that launching the graph takes, whatever runs in it.
  double launch_us = 0;
  std::string gpu_name;
};
// How the benchmark empties the 60 MiB L2 before each replay, so weights come from HBM:
//   kRead  reads 256 MiB (the L2 is left holding clean lines, as after an attention layer that
//          streamed its KV cache and weights);
//   kWrite writes 256 MiB (the L2 is left full of dirty lines, whose write-back then competes
//          with the MoE's own reads: up to 60 MiB of extra traffic, a visible share at decode);
//   kNone  keeps whatever the previous replay left (weights of small layers stay cached).
enum class L2Flush { kRead, kWrite, kNone };
Floors measure_floors(L2Flush flush);
// The GEMM rate that bounds a forward of `f`'s weights from below: the FP8 rate for the formats
// whose GEMMs multiply e4m3 by e4m3 (fp8, fp8_block128), else the BF16 rate (mxfp8 included: its
// activations are rounded through e4m3 but multiplied in bf16). `name` gets "FP8" or "BF16".
double gemm_floor_rate(const Floors& floors, WeightFormat f, const char** name);
// "read", "write" or "none"; Error(kInvalidArgument) names any other value.
L2Flush parse_l2_flush(const std::string& text);
const char* to_string(L2Flush f);
// Times graph replays of layer.forward (L2 flushed before each) and fills median/p10/p90;
// then, with trace_replays > 0, that many more replays of a fresh capture under KernelTracer
// fill row.trace (kept apart so that the timed replays run without CUPTI).
// `budget_us`: replays go on past the first 30 until they add up to this much time (500 at
// most).
inline constexpr double kBenchBudgetUs = 1.5e6;
void bench_layer_on_device(MoeLayer& layer, const HostInputs& in, L2Flush flush, BenchRow& row,
                           int trace_replays = 0, double budget_us = kBenchBudgetUs);

// Replaces the routing inputs of `in` with ones that follow `profile`
// (tune::draw_zipf_routing; uniform: random_inputs' are kept).
void apply_routing_profile(HostInputs& in, const MoeSpec& spec, const tune::RoutingProfile& profile,
                           uint64_t seed);

// Times one forward of `in` per entry of `choices` (MoeLayer::set_tactics before each capture)
// as bench does (graph replays, each after an L2 flush), the replays of all choices interleaved
// round by round, so that the clocks' drift over the run falls on every choice alike: at least
// 30 rounds, more until each choice's replays add up to `budget_us` (500 at most). Medians in
// the order of `choices`; the layer's tactics are cleared after. Needs a CUDA device.
std::vector<double> time_choices_on_device(MoeLayer& layer, const HostInputs& in, L2Flush flush,
                                           const std::vector<TacticChoices>& choices,
                                           double budget_us);

// The tuner's measuring step: each tactic the layer's engine built for `gemm`
// (MoeLayer::tactics) forced at `bucket` tokens (the other GEMM keeps its pick), the forwards
// timed together (time_choices_on_device), ranked by tune::rank_tactics against the engine's
// own pick (MoeLayer::builtin_tactic).
using tune::TacticTime;
std::vector<TacticTime> time_tactics(MoeLayer& layer, Gemm gemm, int64_t bucket,
                                     const HostInputs& in, L2Flush flush, double budget_us);

}  // namespace moekit::cli
