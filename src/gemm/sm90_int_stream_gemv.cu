// IntGroupedGemm's tactic for groups of 32 columns (`sm90.int4.stream.n8`, `sm90.int8.stream.n8`):
// the CUDA-core streaming GEMV of stream_gemv.cuh (the microscaling formats' decode tactic) with
// an int row decoder, at every row count. The tensor-core GEMV (sm90_int_gemv.cu) sums 64-wide
// k spans and CUTLASS's mixed-input mainloop reloads scales per 64-deep k tile, so neither can
// apply a scale per 32 columns; this one decodes each weight as q' * s + zero_term in fp32 (the
// engine's layout, pipeline/sm90_int_layout.hpp: signed codes, the group's scale and zero term
// from the transposed [k / group, n] arrays), exact for any group that is a multiple of the
// 16-byte chunk (32 int4 or 16 int8 codes). It streams an expert's codes once per 8 of its rows,
// so past a few rows per expert it re-reads them: a correct path for group 32, not a fast one.
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

struct StreamArgs {
  gemm::detail::StreamGemvArgs base;
  const uint8_t* w;     // [groups, n, k * bits / 8]
  const float* scales;  // [groups, k / group, n]
  const float* zeros;   // [groups, k / group, n] or null
  int group_size;
};

// One weight row (stream_gemv.cuh's row decoder): its 16-byte chunks of signed codes (int4:
// element 2j in the low nibble), each inside one group, whose scale and zero term sit `n` floats
// apart from the next group's.
template <int kBits, bool kZero>
struct IntRow {
  static constexpr int kVals = 128 / kBits;  // 32 int4 or 16 int8 codes per chunk
  const uint4* chunks;
  const float* scales;  // this row's entry of group 0
  const float* zeros;
  int64_t n;
  int chunks_per_group;
  struct Scale {
    float s, z;
  };
  __device__ __forceinline__ Scale scale(int64_t ch) const {
    const int64_t at = (ch / chunks_per_group) * n;
    return Scale{__ldg(scales + at), kZero ? __ldg(zeros + at) : 0.0f};
  }
  static __device__ __forceinline__ void decode8(const uint4& v, int j, const Scale& s,
                                                 float (&w)[8]) {
    if constexpr (kBits == 4) {
      const uint32_t word = gemm::detail::word_of(v, j);  // codes 8j .. 8j + 7
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int q = static_cast<int>((word >> (4 * i)) & 0xfu);
        w[i] = fmaf(static_cast<float>((q ^ 8) - 8), s.s, s.z);  // sign-extended nibble
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t word = gemm::detail::word_of(v, 2 * j + h);
#pragma unroll
        for (int b = 0; b < 4; ++b)
          w[4 * h + b] = fmaf(static_cast<float>(static_cast<int8_t>(word >> (8 * b))), s.s, s.z);
      }
    }
  }
};

template <class T, int kBits, bool kZero, int NT>
__global__ void __launch_bounds__(gemm::detail::kStreamThreads, NT > 4 ? 1 : 2)
    int_stream_gemv_kernel(StreamArgs p) {
  extern __shared__ int s_active[];  // [groups]: non-empty groups, in order
  const int64_t n = p.base.n, k = p.base.k;
  const int64_t row_vecs = k * kBits / 128;  // 16-byte chunks a row
  const int64_t kg = k / p.group_size;
  const int chunks_per_group = p.group_size / IntRow<kBits, kZero>::kVals;
  gemm::detail::stream_gemv<T, NT>(p.base, s_active, [&](int g, int64_t row) {
    const int64_t at = int64_t(g) * kg * n + row;  // group 0's scale of this row
    return IntRow<kBits, kZero>{
        reinterpret_cast<const uint4*>(p.w) + (int64_t(g) * n + row) * row_vecs, p.scales + at,
        kZero ? p.zeros + at : nullptr, n, chunks_per_group};
  });
}

template <class T, int kBits, bool kZero, int NT>
class IntStreamTactic final : public IntTactic {
 public:
  Status init(const IntGroupedShape& s, int /*device*/, int sm_count) override {
    if (s.group_size % IntRow<kBits, kZero>::kVals != 0)
      return Status(ErrorCode::kUnsupported,
                    name() + ": group size " + std::to_string(s.group_size) +
                        " is not a multiple of the " + std::to_string(IntRow<kBits, kZero>::kVals) +
                        " codes of a 16-byte chunk");
    group_size_ = s.group_size;
    return grid_.init(reinterpret_cast<const void*>(int_stream_gemv_kernel<T, kBits, kZero, NT>),
                      name(), s.groups, s.n, s.k, s.max_rows, sm_count);
  }

  Status run(const IntProblem& p, cudaStream_t stream) override {
    const int64_t grid = grid_.grid(p.rows_bound);
    if (grid <= 0) return {};
    const StreamArgs a{grid_.args(p.row_offsets, p.bias, p.a, p.d), p.w, p.scales,
                       kZero ? p.zeros : nullptr, group_size_};
    int_stream_gemv_kernel<T, kBits, kZero, NT>
        <<<static_cast<unsigned>(grid), gemm::detail::kStreamThreads, grid_.smem(), stream>>>(a);
    return cuda_status(cudaGetLastError(), grid_.what() + ": kernel launch");
  }

  std::size_t workspace_bytes() const override { return 0; }

  static std::string name() {
    return std::string("sm90.int") + std::to_string(kBits) + ".stream.n" + std::to_string(NT);
  }

 private:
  int group_size_ = 0;
  gemm::detail::StreamGemvGrid grid_;
};

template <class T, int kBits, bool kZero>
std::vector<IntTacticEntry> stream_list() {
  using Tactic = IntStreamTactic<T, kBits, kZero, 8>;
  return {IntTacticEntry{Tactic::name(), true, false, []() -> std::unique_ptr<IntTactic> {
                           return std::make_unique<Tactic>();
                         }}};
}

template <class T>
std::vector<IntTacticEntry> stream_for(int bits, bool zero_points) {
  if (bits == 4) return zero_points ? stream_list<T, 4, true>() : stream_list<T, 4, false>();
  return zero_points ? stream_list<T, 8, true>() : stream_list<T, 8, false>();
}

}  // namespace

std::vector<IntTacticEntry> sm90_int_stream_tactics(const IntGroupedShape& s) {
  return s.elem == DType::kFloat16 ? stream_for<__half>(s.bits, s.zero_points)
                                   : stream_for<__nv_bfloat16>(s.bits, s.zero_points);
}

}  // namespace moekit::gemm::int_detail
