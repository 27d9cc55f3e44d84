// IntGroupedGemm's decode tactic (int_grouped_gemm.hpp): a CUDA-core grouped GEMV that streams
// the packed codes once for the few rows of each group. A block of 8 warps owns 32 weight rows
// of one group (an item); each warp takes 4 of them, one at a time, its lanes walking the row in
// 16-byte chunks (32 int4 or 16 int8 codes, always inside one scale group: groups are multiples
// of 32) two at a time, both loads in flight before either is converted. A chunk's codes become
// fp32 in registers (bit tricks, no int-to-float unit: 0x4B000000 | (code ^ sign) is 2^23 +
// the code biased), times the group's scale (plus its zero term), and are multiplied with the
// group's rows, NT (8 or 2) at a time (a group with more rows re-reads its weights, from L2),
// into fp32 sums that the warp adds up in a fixed tree (deterministic). The bias is added
// before the one rounding. Blocks are persistent over (non-empty group, row tile) items: every
// block compacts the non-empty groups from row_offsets itself, so empty experts cost nothing.
// Launched plainly (no programmatic dependent launch): it reads what the kernels before wrote.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_status.hpp"
#include "gemm/gemv_common.cuh"
#include "gemm/int_tactic.hpp"
#include "gemm/live_groups.cuh"
#include "pipeline/elem8.cuh"

namespace moekit::gemm::int_detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

struct GemvArgs {
  const int32_t* row_offsets;
  const uint8_t* w;     // [groups, n, k * bits / 8]
  const float* scales;  // [groups, k / group, n]
  const float* zeros;   // [groups, k / group, n] or null
  const float* bias;    // [groups, n] or null
  const void* a;        // [rows, k]
  void* d;              // [rows, n]
  int groups, n, k, group_size, row_tiles;
};

// The signed code of `kBits` bits at `shift` of `word` as an exact float: the biased code
// (code ^ sign bit, 0..2^bits - 1) in the mantissa of 2^23, minus 2^23 and the bias.
template <int kBits>
__device__ __forceinline__ float code_at(uint32_t word, int shift) {
  constexpr uint32_t mask = (1u << kBits) - 1u, sign = 1u << (kBits - 1);
  const uint32_t biased = ((word >> shift) & mask) ^ sign;
  return __int_as_float(static_cast<int>(0x4B000000u | biased)) - (8388608.0f + float(sign));
}

// Weights 8j .. 8j + 7 of one 16-byte chunk (element i of the chunk at bits [i * kBits,
// (i + 1) * kBits) of its little-endian words: element 2j in the low nibble for int4).
template <int kBits, bool kZero>
__device__ __forceinline__ void decode8(const uint4& v, int j, float s, float z, float (&w)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  constexpr int per_word = 32 / kBits;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int i = 8 * j + e;
    const float q = code_at<kBits>(words[i / per_word], (i % per_word) * kBits);
    w[e] = kZero ? fmaf(q, s, z) : q * s;
  }
}

// One weight row's dot products with N (1..NT) of its group's rows, added to acc[0, N):
// this lane's 16-byte chunks of the row, two loads in flight before either is converted. NT is a
// template argument so that every index of acc is static (registers, no local memory).
template <class T, int kBits, bool kZero, int N, int NT>
__device__ __forceinline__ void dot_rows(const uint4* wrow, const float* srow, const float* zrow,
                                         const T* rows, int64_t k, int64_t n, int group_size,
                                         int lane, float (&acc)[NT]) {
  constexpr int kVals = 128 / kBits;  // codes per 16-byte chunk
  constexpr int kVecs = kVals / 8;    // 16-byte vectors of activations per chunk
  const int64_t chunks = k / kVals;
  auto chunk = [&](const uint4& v, int64_t ch) {
    const int64_t k0 = ch * kVals;
    const int64_t gi = k0 / group_size;
    const float s = __ldg(srow + gi * n);
    const float z = kZero ? __ldg(zrow + gi * n) : 0.0f;
    // Eight weights at a time, each times the same 8 columns of every row.
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      float w[8];
      decode8<kBits, kZero>(v, j, s, z, w);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float xf[8];
        pipeline::unpack8<T>(__ldg(reinterpret_cast<const uint4*>(rows + int64_t(t) * k + k0) + j),
                             xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[t] = fmaf(w[e], xf[e], acc[t]);
      }
    }
  };
  for (int64_t ch0 = lane; ch0 < chunks; ch0 += 64) {
    const bool second = ch0 + 32 < chunks;
    const uint4 v0 = gemm::detail::load_stream(wrow + ch0);
    const uint4 v1 = second ? gemm::detail::load_stream(wrow + ch0 + 32) : make_uint4(0, 0, 0, 0);
    chunk(v0, ch0);
    if (second) chunk(v1, ch0 + 32);
  }
}

// dot_rows for a warp-uniform run-time count nt in 1..NT.
template <class T, int kBits, bool kZero, int NT, int N = 1>
__device__ __forceinline__ void dot_rows_for(int nt, const uint4* wrow, const float* srow,
                                             const float* zrow, const T* rows, int64_t k, int64_t n,
                                             int group_size, int lane, float (&acc)[NT]) {
  if constexpr (N < NT) {
    if (nt == N) {
      dot_rows<T, kBits, kZero, N>(wrow, srow, zrow, rows, k, n, group_size, lane, acc);
      return;
    }
    dot_rows_for<T, kBits, kZero, NT, N + 1>(nt, wrow, srow, zrow, rows, k, n, group_size, lane,
                                             acc);
  } else {
    dot_rows<T, kBits, kZero, NT>(wrow, srow, zrow, rows, k, n, group_size, lane, acc);
  }
}

// NT: the group's rows per pass over a weight row. Two blocks per SM hold the few rows of
// decode; eight rows' loads in flight want the registers of one.
template <class T, int kBits, bool kZero, int NT>
__global__ void __launch_bounds__(kThreads, NT > 4 ? 1 : 2) int_gemv_kernel(GemvArgs p) {
  extern __shared__ int s_active[];  // [groups]: non-empty groups, in order
  __shared__ int s_warp_live[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int live =
      gemm::detail::compact_live_groups<kWarps>(p.row_offsets, p.groups, s_active, s_warp_live);
  const int64_t n = p.n, k = p.k;
  const int64_t row_vecs = k * kBits / 128;  // 16-byte chunks per weight row
  const int64_t scale_groups = k / p.group_size;
  const T* act = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.d);
  const int64_t items = int64_t(live) * p.row_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int g = s_active[item / p.row_tiles];
    const int64_t tile_row0 = (item % p.row_tiles) * kRowsPerBlock;
    const int m0 = p.row_offsets[g];
    const int mg = p.row_offsets[g + 1] - m0;
    for (int i = 0; i < kRowsPerWarp; ++i) {
      // Neighbouring warps on neighbouring rows: their scale loads share lines.
      const int64_t row = tile_row0 + int64_t(i) * kWarps + warp;
      if (row >= n) break;
      const uint4* wrow = reinterpret_cast<const uint4*>(p.w) + (int64_t(g) * n + row) * row_vecs;
      const float* srow = p.scales + int64_t(g) * scale_groups * n + row;
      const float* zrow = kZero ? p.zeros + int64_t(g) * scale_groups * n + row : nullptr;
      const float b = p.bias != nullptr ? p.bias[int64_t(g) * n + row] : 0.0f;
      for (int c0 = 0; c0 < mg; c0 += NT) {
        const int nt = min(NT, mg - c0);
        const T* rows = act + int64_t(m0 + c0) * k;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
        dot_rows_for<T, kBits, kZero, NT>(nt, wrow, srow, zrow, rows, k, n, p.group_size, lane,
                                          acc);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float sum = acc[t];
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if (lane == t && t < nt)
            out[int64_t(m0 + c0 + t) * n + row] = pipeline::float_to_elem<T>(sum + b);
        }
      }
    }
  }
}

template <class T, int kBits, bool kZero, int NT>
class IntGemvTactic final : public IntTactic {
 public:
  Status init(const IntGroupedShape& s, int device, int sm_count) override {
    what_ = "int tactic " + name() + " (groups " + std::to_string(s.groups) + ", n " +
            std::to_string(s.n) + ", k " + std::to_string(s.k) + ")";
    if (s.group_size % 32 != 0)
      return Status(ErrorCode::kUnsupported,
                    what_ + ": the group size must be a multiple of 32 (the 16-byte chunks)");
    shape_ = s;
    smem_ = sizeof(int) * static_cast<std::size_t>(s.groups);
    const auto kernel = int_gemv_kernel<T, kBits, kZero, NT>;
    cudaFuncAttributes attr{};
    Status st = cuda_status(cudaFuncGetAttributes(&attr, kernel), what_ + ": loading the kernel");
    if (!st.ok()) return st;
    int per_sm = 0;
    st =
        cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_),
                    what_ + ": occupancy");
    if (!st.ok()) return st;
    (void)device;
    resident_ = static_cast<int64_t>(std::max(per_sm, 1)) * sm_count;
    row_tiles_ = static_cast<int>((s.n + kRowsPerBlock - 1) / kRowsPerBlock);
    return {};
  }

  Status run(const IntProblem& p, cudaStream_t stream) override {
    // At most min(groups, rows) groups have rows; one block per item up to what fits at once.
    int64_t live = std::min<int64_t>(shape_.groups, shape_.max_rows);
    if (p.rows_bound > 0) live = std::min(live, p.rows_bound);
    const int64_t grid = std::min(live * row_tiles_, resident_);
    if (grid <= 0) return {};
    GemvArgs a{};
    a.row_offsets = p.row_offsets;
    a.w = p.w;
    a.scales = p.scales;
    a.zeros = kZero ? p.zeros : nullptr;
    a.bias = p.bias;
    a.a = p.a;
    a.d = p.d;
    a.groups = shape_.groups;
    a.n = static_cast<int>(shape_.n);
    a.k = static_cast<int>(shape_.k);
    a.group_size = shape_.group_size;
    a.row_tiles = row_tiles_;
    int_gemv_kernel<T, kBits, kZero, NT>
        <<<static_cast<unsigned>(grid), kThreads, smem_, stream>>>(a);
    return cuda_status(cudaGetLastError(), what_ + ": kernel launch");
  }

  std::size_t workspace_bytes() const override { return 0; }

  static std::string name() {
    return "sm90.int" + std::to_string(kBits) + ".gemv.n" + std::to_string(NT);
  }

 private:
  IntGroupedShape shape_;
  std::size_t smem_ = 0;
  int64_t resident_ = 0;
  int row_tiles_ = 0;
  std::string what_;
};

template <class T, int kBits, bool kZero, int NT>
IntTacticEntry gemv_entry() {
  using Tactic = IntGemvTactic<T, kBits, kZero, NT>;
  return IntTacticEntry{Tactic::name(), true, false,
                        []() -> std::unique_ptr<IntTactic> { return std::make_unique<Tactic>(); }};
}

// The GEMVs of one (element type, width, zero points): 8 rows per pass, and (not in the
// one-tactic build) 2 for the one or two rows per expert of decode.
template <class T, int kBits, bool kZero>
std::vector<IntTacticEntry> gemv_list() {
  std::vector<IntTacticEntry> v = {gemv_entry<T, kBits, kZero, 8>()};
#if !defined(MOEKIT_ONE_TACTIC)
  v.push_back(gemv_entry<T, kBits, kZero, 2>());
#endif
  return v;
}

template <class T, int kBits>
std::vector<IntTacticEntry> gemv_for_zero(bool zero_points) {
  return zero_points ? gemv_list<T, kBits, true>() : gemv_list<T, kBits, false>();
}

template <class T>
std::vector<IntTacticEntry> gemv_for_bits(int bits, bool zero_points) {
  return bits == 4 ? gemv_for_zero<T, 4>(zero_points) : gemv_for_zero<T, 8>(zero_points);
}

}  // namespace

std::vector<IntTacticEntry> sm90_int_gemv_tactics(const IntGroupedShape& s) {
  return s.elem == DType::kFloat16 ? gemv_for_bits<__half>(s.bits, s.zero_points)
                                   : gemv_for_bits<__nv_bfloat16>(s.bits, s.zero_points);
}

}  // namespace moekit::gemm::int_detail
