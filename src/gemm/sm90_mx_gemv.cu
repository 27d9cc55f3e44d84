// MxGroupedGemm's decode tactic (mx_grouped_gemm.hpp): the streaming GEMV of stream_gemv.cuh over
// microscaling weights. A lane's 16-byte chunk holds 32 e2m1 values (one MXFP4 block, two NVFP4
// blocks) or 16 e4m3 values (half an MXFP8 block); the chunk's scale bytes (one, two, or one
// shared with the neighbouring lane) are read beside it, neighbouring lanes on neighbouring
// bytes of the row-major scale rows. Every weight is decoded in fp32 as
// quant::dequantize_expert decodes it, bit-equal: the value exactly (e2m1 by bit tricks through
// fp16, e4m3 by the sm_89+ conversion to fp16, both exact), the scale exactly (e8m0 by
// numeric::e8m0_to_float_hd, 0xff NaN as there; NVFP4's e4m3 block scale times the fp32 global
// scale, one rounding as there), and their one fp32 product.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_status.hpp"
#include "common/numeric.hpp"
#include "gemm/mx_tactic.hpp"
#include "gemm/stream_gemv.cuh"

namespace moekit::gemm::mx_detail {
namespace {

using gemm::detail::kStreamThreads;

struct MxArgs {
  gemm::detail::StreamGemvArgs base;
  const uint8_t* w;            // [groups, n, k * bits / 8]
  const uint8_t* scales;       // [groups, n, k / block]
  const float* global_scales;  // [groups] (kNVFP4) or null
};

// e2m1 codes p and p + 4 of `word` (element i in nibble i) as fp32, exactly: the three magnitude
// bits moved to fp16's bits 9..11 (the exponent's low two bits and the mantissa's top bit) and
// the sign to bit 15 make the e2m1 value times 2^-14 (e2m1's zero exponent lands on fp16's
// subnormals: 0.5 is 2^-15 there), which one packed multiply by 2^14 makes the value itself.
__device__ __forceinline__ float2 e2m1_pair(uint32_t word, int p) {
  const uint32_t a = word >> (4 * p);
  const uint32_t bits = ((a & 0x00070007u) << 9) | ((a & 0x00080008u) << 12);
  __half2 h;
  memcpy(&h, &bits, 4);
  return __half22float2(__hmul2(h, __floats2half2_rn(16384.0f, 16384.0f)));
}

// The 8 e2m1 weights of one 32-bit word, each times the fp32 scale s (quant::dequantize_expert's
// kE2M1[q] * s).
__device__ __forceinline__ void e2m1_word(uint32_t word, float s, float (&w)[8]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float2 f = e2m1_pair(word, p);
    w[p] = f.x * s;
    w[p + 4] = f.y * s;
  }
}

// Two e4m3 bytes (the low one first) as fp32, exactly (e4m3 -> fp16 is exact, NaN stays NaN).
__device__ __forceinline__ float2 e4m3_pair(uint32_t two) {
  const __half2_raw r =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  __half2 h;
  memcpy(&h, &r, 4);
  return __half22float2(h);
}

// One weight row of a microscaling format (stream_gemv.cuh's row decoder): its chunks, its
// scale bytes and (NVFP4) its expert's global scale.
struct MxRowBase {
  const uint4* chunks;
  const uint8_t* srow;
  float global;
};
template <WeightFormat F>
struct MxRow;

template <>
struct MxRow<WeightFormat::kMXFP4> : MxRowBase {
  static constexpr int kVals = 32;  // one block
  using Scale = float;
  __device__ __forceinline__ Scale scale(int64_t ch) const {
    return numeric::e8m0_to_float_hd(__ldg(srow + ch));
  }
  static __device__ __forceinline__ void decode8(const uint4& v, int j, const Scale& s,
                                                 float (&w)[8]) {
    e2m1_word(gemm::detail::word_of(v, j), s, w);
  }
};

template <>
struct MxRow<WeightFormat::kNVFP4> : MxRowBase {
  static constexpr int kVals = 32;  // two blocks of 16
  struct Scale {
    float first, second;
  };
  // The two blocks' e4m3 scales (srow is 2-byte aligned: k / 16 is even), each times the global
  // scale (dequantize_expert's e4m3[sb] * gs: ModelOpt's NVFP4QTensor.dequantize, per_block_scale =
  // scale * double_scale).
  __device__ __forceinline__ Scale scale(int64_t ch) const {
    const float2 s = e4m3_pair(__ldg(reinterpret_cast<const unsigned short*>(srow) + ch));
    return Scale{s.x * global, s.y * global};
  }
  static __device__ __forceinline__ void decode8(const uint4& v, int j, const Scale& s,
                                                 float (&w)[8]) {
    e2m1_word(gemm::detail::word_of(v, j), j < 2 ? s.first : s.second, w);
  }
};

template <>
struct MxRow<WeightFormat::kMXFP8> : MxRowBase {
  static constexpr int kVals = 16;  // half a block
  using Scale = float;
  __device__ __forceinline__ Scale scale(int64_t ch) const {
    return numeric::e8m0_to_float_hd(__ldg(srow + (ch >> 1)));
  }
  static __device__ __forceinline__ void decode8(const uint4& v, int j, const Scale& s,
                                                 float (&w)[8]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = gemm::detail::word_of(v, 2 * j + h);
      const float2 lo = e4m3_pair(word), hi = e4m3_pair(word >> 16);
      w[4 * h] = lo.x * s;
      w[4 * h + 1] = lo.y * s;
      w[4 * h + 2] = hi.x * s;
      w[4 * h + 3] = hi.y * s;
    }
  }
};

constexpr int format_bits(WeightFormat f) { return f == WeightFormat::kMXFP8 ? 8 : 4; }
constexpr int format_block(WeightFormat f) { return f == WeightFormat::kNVFP4 ? 16 : 32; }

// NT: the group's rows per pass over a weight row (as sm90_int_gemv.cu).
template <class T, WeightFormat F, int NT>
__global__ void __launch_bounds__(kStreamThreads, NT > 4 ? 1 : 2) mx_gemv_kernel(MxArgs p) {
  extern __shared__ int s_active[];  // [groups]: non-empty groups, in order
  const int64_t n = p.base.n;
  const int64_t row_vecs = int64_t(p.base.k) * format_bits(F) / 128;  // 16-byte chunks
  const int64_t row_scales = p.base.k / format_block(F);
  gemm::detail::stream_gemv<T, NT>(p.base, s_active, [&](int g, int64_t row) {
    const int64_t at = int64_t(g) * n + row;
    return MxRow<F>{{reinterpret_cast<const uint4*>(p.w) + at * row_vecs,
                     p.scales + at * row_scales,
                     F == WeightFormat::kNVFP4 ? __ldg(p.global_scales + g) : 1.0f}};
  });
}

template <class T, WeightFormat F, int NT>
class MxGemvTactic final : public MxTactic {
 public:
  Status init(const MxGroupedShape& s, int sm_count) override {
    return grid_.init(reinterpret_cast<const void*>(mx_gemv_kernel<T, F, NT>), name(), s.groups,
                      s.n, s.k, s.max_rows, sm_count);
  }

  Status run(const MxProblem& p, cudaStream_t stream) override {
    const int64_t grid = grid_.grid(p.rows_bound);
    if (grid <= 0) return {};
    const MxArgs a{grid_.args(p.row_offsets, p.bias, p.a, p.d), p.w, p.scales,
                   F == WeightFormat::kNVFP4 ? p.global_scales : nullptr};
    mx_gemv_kernel<T, F, NT>
        <<<static_cast<unsigned>(grid), kStreamThreads, grid_.smem(), stream>>>(a);
    return cuda_status(cudaGetLastError(), grid_.what() + ": kernel launch");
  }

  static std::string name() {
    return std::string("sm90.") + to_string(F) + ".gemv.n" + std::to_string(NT);
  }

 private:
  gemm::detail::StreamGemvGrid grid_;
};

template <class T, WeightFormat F, int NT>
MxTacticEntry gemv_entry() {
  using Tactic = MxGemvTactic<T, F, NT>;
  return MxTacticEntry{Tactic::name(),
                       []() -> std::unique_ptr<MxTactic> { return std::make_unique<Tactic>(); }};
}

// 8 rows per pass, and (not in the one-tactic build) 2 for the one or two rows per expert of
// decode.
template <class T, WeightFormat F>
std::vector<MxTacticEntry> gemv_list() {
  std::vector<MxTacticEntry> v = {gemv_entry<T, F, 8>()};
#if !defined(MOEKIT_ONE_TACTIC)
  v.push_back(gemv_entry<T, F, 2>());
#endif
  return v;
}

template <class T>
std::vector<MxTacticEntry> gemv_for_format(WeightFormat f) {
  switch (f) {
    case WeightFormat::kMXFP4:
      return gemv_list<T, WeightFormat::kMXFP4>();
    case WeightFormat::kNVFP4:
      return gemv_list<T, WeightFormat::kNVFP4>();
    case WeightFormat::kMXFP8:
      return gemv_list<T, WeightFormat::kMXFP8>();
    default:
      return {};
  }
}

}  // namespace

std::vector<MxTacticEntry> sm90_mx_gemv_tactics(const MxGroupedShape& s) {
  return s.elem == DType::kFloat16 ? gemv_for_format<__half>(s.format)
                                   : gemv_for_format<__nv_bfloat16>(s.format);
}

}  // namespace moekit::gemm::mx_detail
