// IntGroupedGemm's decode tactic (int_grouped_gemm.hpp): the streaming GEMV of stream_gemv.cuh
// over int codes. A lane's 16-byte chunk holds 32 int4 or 16 int8 codes, always inside one scale
// group (groups are multiples of 32); its codes become fp32 in registers by bit tricks (no
// int-to-float unit: 0x4B000000 | (code ^ sign) is 2^23 + the code biased), times the group's
// scale (plus its zero term).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_status.hpp"
#include "gemm/int_tactic.hpp"
#include "gemm/stream_gemv.cuh"

namespace moekit::gemm::int_detail {
namespace {

using gemm::detail::kStreamThreads;

struct GemvArgs {
  gemm::detail::StreamGemvArgs base;
  const uint8_t* w;     // [groups, n, k * bits / 8]
  const float* scales;  // [groups, k / group, n]
  const float* zeros;   // [groups, k / group, n] or null
  int group_size;
};

// The signed code of `kBits` bits at `shift` of `word` as an exact float: the biased code
// (code ^ sign bit, 0..2^bits - 1) in the mantissa of 2^23, minus 2^23 and the bias.
template <int kBits>
__device__ __forceinline__ float code_at(uint32_t word, int shift) {
  constexpr uint32_t mask = (1u << kBits) - 1u, sign = 1u << (kBits - 1);
  const uint32_t biased = ((word >> shift) & mask) ^ sign;
  return __int_as_float(static_cast<int>(0x4B000000u | biased)) - (8388608.0f + float(sign));
}

// One weight row of int codes (stream_gemv.cuh's row decoder): element i of a chunk at bits
// [i * kBits, (i + 1) * kBits) of its little-endian words (element 2j in the low nibble for
// int4); its group's scale and zero term at stride n in the transposed tables.
template <int kBits, bool kZero>
struct IntRow {
  static constexpr int kVals = 128 / kBits;
  struct Scale {
    float s, z;
  };
  const uint4* chunks;
  const float* srow;
  const float* zrow;
  int64_t n;
  int group_size;

  __device__ __forceinline__ Scale scale(int64_t ch) const {
    const int64_t gi = ch * kVals / group_size;
    return Scale{__ldg(srow + gi * n), kZero ? __ldg(zrow + gi * n) : 0.0f};
  }
  static __device__ __forceinline__ void decode8(const uint4& v, int j, const Scale& s,
                                                 float (&w)[8]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    constexpr int per_word = 32 / kBits;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = 8 * j + e;
      const float q = code_at<kBits>(words[i / per_word], (i % per_word) * kBits);
      w[e] = kZero ? fmaf(q, s.s, s.z) : q * s.s;
    }
  }
};

// NT: the group's rows per pass over a weight row. Two blocks per SM hold the few rows of
// decode; eight rows' loads in flight want the registers of one.
template <class T, int kBits, bool kZero, int NT>
__global__ void __launch_bounds__(kStreamThreads, NT > 4 ? 1 : 2) int_gemv_kernel(GemvArgs p) {
  extern __shared__ int s_active[];  // [groups]: non-empty groups, in order
  const int64_t n = p.base.n;
  const int64_t row_vecs = int64_t(p.base.k) * kBits / 128;  // 16-byte chunks per weight row
  const int64_t scale_groups = p.base.k / p.group_size;
  gemm::detail::stream_gemv<T, NT>(p.base, s_active, [&](int g, int64_t row) {
    const float* zrow = kZero ? p.zeros + int64_t(g) * scale_groups * n + row : nullptr;
    return IntRow<kBits, kZero>{
        reinterpret_cast<const uint4*>(p.w) + (int64_t(g) * n + row) * row_vecs,
        p.scales + int64_t(g) * scale_groups * n + row, zrow, n, p.group_size};
  });
}

template <class T, int kBits, bool kZero, int NT>
class IntGemvTactic final : public IntTactic {
 public:
  Status init(const IntGroupedShape& s, int device, int sm_count) override {
    (void)device;
    if (s.group_size % 32 != 0)
      return Status(ErrorCode::kUnsupported, "int tactic " + name() + ": the group size " +
                                                 std::to_string(s.group_size) +
                                                 " must be a multiple of 32 (the 16-byte chunks)");
    group_size_ = s.group_size;
    return grid_.init(reinterpret_cast<const void*>(int_gemv_kernel<T, kBits, kZero, NT>), name(),
                      s.groups, s.n, s.k, s.max_rows, sm_count);
  }

  Status run(const IntProblem& p, cudaStream_t stream) override {
    const int64_t grid = grid_.grid(p.rows_bound);
    if (grid <= 0) return {};
    const GemvArgs a{grid_.args(p.row_offsets, p.bias, p.a, p.d), p.w, p.scales,
                     kZero ? p.zeros : nullptr, group_size_};
    int_gemv_kernel<T, kBits, kZero, NT>
        <<<static_cast<unsigned>(grid), kStreamThreads, grid_.smem(), stream>>>(a);
    return cuda_status(cudaGetLastError(), grid_.what() + ": kernel launch");
  }

  std::size_t workspace_bytes() const override { return 0; }

  static std::string name() {
    return "sm90.int" + std::to_string(kBits) + ".gemv.n" + std::to_string(NT);
  }

 private:
  int group_size_ = 0;
  gemm::detail::StreamGemvGrid grid_;
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
