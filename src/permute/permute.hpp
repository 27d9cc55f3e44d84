// Routing, expert counts, offsets and the stable permutation of token-expert pairs, then the
// gather of hidden rows into expert order: all on the device, no host sync, no allocation.
// Pairs are ordered by (local expert, token, slot). C++17: CUDA translation units include this.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "moekit/status.hpp"
#include "moekit/types.hpp"
#include "routing/routing_device.hpp"

namespace moekit::permute {

inline constexpr int kMaxLocalExperts = 512;
// The multi-block path cuts tokens into at most this many chunks (one warp each, at least
// kMinChunkTokens tokens). Routing a token is a latency-bound chain in one warp, so the route
// kernel's time follows the tokens per warp: 1024 chunks took 47 us of a qwen3 forward at 16384
// tokens, 2048 30 us (ncu); 4096 keep ~31 warps per SM busy there, about all the routing
// kernels' registers allow. The chunk counts are scanned in segments of kChunksPerSegment
// chunks, one block per 32 experts and segment, so more chunks cost the scan no more rounds.
inline constexpr int kMaxChunks = 4096;
inline constexpr int kMinChunkTokens = 2;
inline constexpr int kChunksPerSegment = 256;
inline constexpr int kMaxSegments = kMaxChunks / kChunksPerSegment;
// At most this many tokens go through the single-block kernel (launch latency rules there).
inline constexpr int64_t kSingleBlockMaxTokens = 64;
// The single-block kernel also gathers when the gathered rows total at most this many bytes;
// above it a grid-wide gather kernel is faster than one SM copying.
inline constexpr int64_t kFusedGatherMaxBytes = 128 * 1024;
// No error recorded in Buffers::error_word.
inline constexpr unsigned long long kNoError = ~0ull;

struct Config {
  routing::DeviceRouting routing;  // method kExternal: the caller's ids are validated and used
  int first_expert = 0;            // global id of local expert 0 (EP); other ids are dropped
  int local_experts = 0;
  int64_t row_bytes = 0;  // bytes of one hidden row (H * element size), multiple of 16
  int64_t max_tokens = 0;
  int top_k() const { return routing.top_k; }
  // Rows of the permuted matrix at most: every token can send each of its distinct experts here.
  int64_t max_rows() const;
};

// Device arrays, sized for Config::max_tokens (T), top_k (k), local experts (L), max_rows (P).
struct Buffers {
  int32_t* topk_ids = nullptr;        // [T, k] global ids as routed (-1: a dropped caller id)
  float* topk_weights = nullptr;      // [T, k] routing weights (0 for a dropped slot)
  int32_t* slot_expert = nullptr;     // [T, k] local expert of the slot, -1 when not local
  int32_t* slot_rank = nullptr;       // [T, k] rank among the slots of its expert in its chunk
  int32_t* slot_row = nullptr;        // [T, k] permuted row of the slot, -1 when not local
  int32_t* chunk_counts = nullptr;    // [kMaxChunks, L] per-chunk counts, then the chunks'
                                      // bases within their segment
  int32_t* segment_totals = nullptr;  // [kMaxSegments, L] slots of each expert per segment
  int32_t* offsets = nullptr;         // [L + 1] first row of each local expert (GEMM row_offsets)
  int32_t* row_expert = nullptr;      // [P] local expert of each permuted row
  // [P] or null: the token of each permuted row, written by the multi-block path (where a run
  // without the gather needs it: the next GEMM reads the tokens' rows by it).
  int32_t* row_token = nullptr;
  void* permuted = nullptr;  // [P, H] hidden rows in expert order
  // First bad caller id since it was last reset to kNoError: (token * k + slot) << 32 | id.
  unsigned long long* error_word = nullptr;
  // [1] or null: the single-block kernel clears it before the next kernel can start and sets it
  // once the offsets are written (OffsetsFinal::kAtFlag).
  uint32_t* offsets_flag = nullptr;
  // [L + 2] or null: cleared by the single-block kernel (clears_expert_done) before the
  // offsets flag, for the chained FC1 -> FC2 GEMV to count each expert's finished FC1 work in
  // and hand out its items ([L]), and for the standalone GEMVs' item counters ([L], [L + 1]).
  int32_t* expert_done = nullptr;
};

// Element counts of each Buffers array for `c` (bytes = count * element size).
struct BufferCounts {
  int64_t per_slot = 0;  // topk_ids, topk_weights, slot_expert, slot_rank, slot_row
  int64_t chunk_counts = 0;
  int64_t segment_totals = 0;
  int64_t offsets = 0;
  int64_t rows = 0;  // row_expert
  int64_t permuted_bytes = 0;
};
BufferCounts buffer_counts(const Config& c);

struct Inputs {
  const void* hidden = nullptr;    // [tokens, H] (row_bytes each), 16-byte aligned
  const float* logits = nullptr;   // [tokens, E] (routing methods)
  const int32_t* ids = nullptr;    // [tokens, k] (kExternal)
  const float* weights = nullptr;  // [tokens, k] (kExternal)
  // false: no row is gathered into Buffers::permuted. The next GEMM reads the tokens' own rows:
  // on the single-block path (up to kSingleBlockMaxTokens tokens) by their slots
  // (gemm::TokenRows), on the multi-block path by Buffers::row_token, which it then requires
  // (gemm::GroupedGemm::GemmCall::row_source).
  bool gather = true;
};

enum class Path { kAuto, kSingleBlock, kMultiBlock };  // tests force one

// Checks `c` against the kernels' limits and loads every kernel run() may launch for it
// (shared-memory attributes included), so a first forward can be graph-captured.
Status prepare(const Config& c);

// Enqueues routing, counting, permutation and gather on `stream`.
Status run(const Config& c, const Buffers& b, int64_t tokens, const Inputs& in, cudaStream_t stream,
           Path path = Path::kAuto);

// When the offsets are final for the kernel after run()'s last one, so that the GEMM there may
// read them (and start on its weights) before its own PDL wait.
enum class OffsetsFinal {
  kAfterItsWait,  // nothing ran (0 tokens)
  kAtItsStart,    // run()'s last kernel waits for their writer before it lets the next start
  kAtFlag,        // run()'s last kernel writes them (single-block, gathering too): once
                  // Buffers::offsets_flag reads non-zero
};
// `gather`: Inputs::gather of the run.
OffsetsFinal offsets_final_for_next_kernel(const Config& c, int64_t tokens, Path path = Path::kAuto,
                                           bool gather = true);

// Whether run() takes the single-block path for `tokens` (else the multi-block one).
bool single_block_path(int64_t tokens, Path path = Path::kAuto);

// Whether run() clears Buffers::expert_done (the single-block kernel does; the multi-block
// kernels leave it alone).
bool clears_expert_done(int64_t tokens, Path path = Path::kAuto);

// The routing weights on the experts' input (RouterWeightPlacement::kInput, Llama-4), after a
// run() that gathered (Inputs::gather): every slot with a row here has that row of
// Buffers::permuted multiplied by its weight (fp32 products, rounded to `elem` to nearest even,
// as the reference rounds them) and its weight set to 1, so that the finalize adds the experts'
// outputs with weight 1. Slots whose row is -1 (other ranks' experts, dropped caller ids) are
// left as they are. Launched with programmatic dependent launch, it reads nothing before
// run()'s kernels have ended; the kernel after it may start early but must not read the rows
// or the weights before its own PDL wait. Row offsets are then final when that kernel starts
// (OffsetsFinal::kAtItsStart). elem: kBFloat16 or kFloat16 (else kUnsupported).
Status apply_weights_to_rows(const Config& c, const Buffers& b, int64_t tokens, DType elem,
                             cudaStream_t stream);
// Loads its kernel for `elem` (before any graph capture).
Status prepare_apply_weights_to_rows(DType elem);

// The AWQ pre-quant scale of an int group layer (WeightQuant::pre_quant_scale: it multiplies the
// activations, include/moekit/types.hpp) on rows in expert order: each row r < offsets[L] of
// `rows` (elem [max_rows, cols], 16-byte aligned) becomes round(float(row) * scales[row_expert[r],
// :]) (fp32 products rounded to `elem` to nearest even), as quant::prepare_activations rounds
// them for the reference. The int engine runs it on the gathered rows (FC1's input, after the
// routing weights on the input) and on the activation's output (FC2's input). Launched with
// programmatic dependent launch: it reads nothing before the previous kernel has ended; the next
// kernel must not read the rows before its own wait. elem kBFloat16 or kFloat16 and cols a
// multiple of 8, else kUnsupported.
struct ColumnScales {
  const int32_t* offsets = nullptr;     // [L + 1]: rows [0, offsets[L]) are scaled
  const int32_t* row_expert = nullptr;  // [max_rows]
  const float* scales = nullptr;        // [L, cols]
  int local_experts = 0;
  int64_t cols = 0;
  DType elem = DType::kBFloat16;
};
Status apply_column_scales(const ColumnScales& c, void* rows, int64_t max_rows,
                           cudaStream_t stream);
// Loads its kernel for `c.elem` (before any graph capture).
Status prepare_apply_column_scales(const ColumnScales& c);

// MXFP8's activations (W8A8: include/moekit/types.hpp, kMXFP8) on rows in expert order: each row
// r < offsets[L] of `rows` (elem [max_rows, cols], 16-byte aligned), per 32 columns, becomes
// q * s, s = 2^ceil(log2(amax / 448)) (e8m0) and q = e4m3(x / s) (nearest even, saturated), as
// quant::prepare_activations rounds them for the reference (the same numeric:: conversions, IEEE
// division); q * s is exact in bf16. The MX engine runs it for kMXFP8 on the gathered rows (FC1's
// input) and on the activation's output (FC2's input), so that its bf16 GEMMs compute the
// reference's W8A8 products. Launched with programmatic dependent launch, as
// apply_column_scales. elem kBFloat16 or kFloat16 and cols a multiple of 32, else kUnsupported.
struct Mxfp8Rows {
  const int32_t* offsets = nullptr;  // [L + 1]: rows [0, offsets[L]) are rounded
  int local_experts = 0;
  int64_t cols = 0;
  DType elem = DType::kBFloat16;
};
Status round_rows_to_mxfp8(const Mxfp8Rows& c, void* rows, int64_t max_rows, cudaStream_t stream);
// Loads its kernel for `c.elem` (before any graph capture).
Status prepare_round_rows_to_mxfp8(const Mxfp8Rows& c);

// The FP8 engines' gather, after a run() without it (Inputs::gather false): every slot with a
// row here gets that row, the caller's bf16 hidden row of its token, quantized to e4m3 with one
// fp32 scale per 128 columns (pipeline/fp8_quantize.cuh: dynamic, or the slot's expert's static
// scale) at QuantizedRows::values / scales. With weight_on_input the row is first multiplied by
// the slot's weight and rounded to bf16 (as apply_weights_to_rows does), and the weight set to 1.
// Launched with programmatic dependent launch like apply_weights_to_rows. Hidden (row_bytes / 2)
// a multiple of 128, else kUnsupported.
struct QuantizedRows {
  void* values = nullptr;               // e4m3 [max_rows, H]
  float* scales = nullptr;              // [max_rows, H / 128]
  const float* static_scale = nullptr;  // [local experts] or null (dynamic)
  // Dynamic (no static scale): one scale per row, pipeline::token_scale of its amax, written for
  // each of its groups (WeightQuant::dynamic_activations); else one per 128 columns.
  bool per_token = false;
  bool weight_on_input = false;
};
Status gather_quantized(const Config& c, const Buffers& b, int64_t tokens, const void* hidden,
                        const QuantizedRows& out, cudaStream_t stream);
// Loads its kernel (before any graph capture).
Status prepare_gather_quantized();
// Turns an error word into a status naming token, slot and value (ok for kNoError).
Status decode_error(unsigned long long word, int experts, int top_k);

}  // namespace moekit::permute
