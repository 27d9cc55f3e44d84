// The CUTLASS half of IntGroupedGemm (int_grouped_gemm.hpp): CUTLASS 4.2's Hopper mixed-input
// ptr-array grouped GEMM (KernelPtrArrayTmaWarpSpecializedCooperative with a (codes, scale)
// tuple operand: CollectiveMma of sm90_mma_array_tma_gmma_rs_warpspecialized_mixed_input.hpp,
// as CUTLASS's example 69 builds it) in its scale-only mode (ConversionMode::ConvertAndScale),
// int4 / int8 codes x bf16 / fp16 activations, fp32 accumulators.
//
// The converted operand must be the mainloop's A and K-major, so the weights [n, k] are A
// (RowMajor), the group's rows [m, k] are B (ColumnMajor: K-major), the problem is (n, m, k)
// and D^T [n, m] column-major is D [m, n] row-major. The scales are fp32 and MN-major, [k /
// group, n] per group (CUTLASS's StrideScale (1, n)): the mainloop converts each code to fp32,
// multiplies by its scale and rounds the product to the activation type for wgmma. Its scale
// tile is reloaded once per 64-deep k tile, so the group (chunk_size) is a multiple of 64; that
// is checked here (IntGroupedGemm::validate), since CUTLASS's own check needs host shapes.
//
// Graph safety as in sm90_grouped.cuh: problem shapes only in device memory (host shapes
// nullptr), arguments built once on arrays whose addresses never change; run() only launches.
// Included by the four sm90_<act>_<int4|int8>_group.cu translation units, one instantiation set
// each.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "common/cuda_status.hpp"
#include "gemm/cutlass_setup.cuh"
#include "gemm/int_tactic.hpp"

namespace moekit::gemm::int_detail::mixed {

using namespace cute;

// The k tile: the smallest the mainloop takes (four 16-deep wgmma k blocks of 16-bit operands).
constexpr int kTileK = 64;

// One kernel configuration: activation type, code type, D type, the tile's token extent.
template <class Act, class Code, class OutElement, int TileN>
struct MixedCfg {
  using ElementAct = Act;
  using ElementCode = Code;
  using ElementD = OutElement;
  static constexpr int kBits = cutlass::sizeof_bits<Code>::value;
  static constexpr bool kFp32Out = std::is_same_v<OutElement, float>;
  using Tile = Shape<_128, Int<TileN>, Int<kTileK>>;
  using Cluster = Shape<_1, _1, _1>;
  static std::string name() {
    return "sm90.int" + std::to_string(kBits) + ".coop.128x" + std::to_string(TileN) + "x" +
           std::to_string(kTileK) + ".c1x1";
  }
};

template <class Cfg>
struct MixedKernel {
  using ElementCode = typename Cfg::ElementCode;
  using ElementAct = typename Cfg::ElementAct;
  using ElementScale = float;
  using ElementD = typename Cfg::ElementD;
  using LayoutA = cutlass::layout::RowMajor;     // the weights [n, k]: K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // the rows [m, k] read as [k, m]: K-major
  using LayoutD = cutlass::layout::ColumnMajor;  // D^T [n, m]: D [m, n] row-major
  static constexpr int kAlignA = 128 / cutlass::sizeof_bits<ElementCode>::value;  // 16-byte rows
  static constexpr int kAlignB = 128 / cutlass::sizeof_bits<ElementAct>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile,
      typename Cfg::Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementCode, ElementScale>,
      LayoutA*, kAlignA, ElementAct, LayoutB*, kAlignB, float, typename Cfg::Tile,
      typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  static_assert(Mainloop::KernelConversionMode == cutlass::detail::ConversionMode::ConvertAndScale,
                "the scale-only mode");
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(sizeof(typename Kernel::SharedStorage) <= 232448, "shared memory over 227 KB");
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideS = typename Mainloop::StrideScale;
  using StrideD = typename Kernel::InternalStrideD;
  using UnderShape = typename ProblemShape::UnderlyingProblemShape;
};

// The per-group arrays one tactic's kernel reads; written on the device by its problem kernel.
template <class K>
struct MixedArrays {
  typename K::UnderShape* shapes;
  const typename K::ElementCode** ptr_w;
  const typename K::ElementAct** ptr_a;
  const float** ptr_s;
  typename K::ElementD** ptr_d;
};

struct MixedProblemArgs {
  const int32_t* row_offsets;
  int groups, n, k, scale_groups;  // scale_groups: k / group_size
  int64_t row_bytes;               // bytes of one weight row: k * bits / 8
  const uint8_t* w;
  const char* a;
  int64_t a_row_bytes;
  const float* scales;
  char* d;
  int64_t d_row_bytes;
};

// One thread per group: its problem shape (n, m, k) and operand, scale and output pointers.
template <class K>
__global__ void write_mixed_problems(MixedProblemArgs p, MixedArrays<K> arr) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.groups) return;
  const int64_t row0 = p.row_offsets[g];
  const int m = max(p.row_offsets[g + 1] - p.row_offsets[g], 0);
  arr.shapes[g] = typename K::UnderShape{p.n, m, p.k};
  arr.ptr_w[g] =
      reinterpret_cast<const typename K::ElementCode*>(p.w + int64_t(g) * p.n * p.row_bytes);
  arr.ptr_a[g] = reinterpret_cast<const typename K::ElementAct*>(p.a + row0 * p.a_row_bytes);
  arr.ptr_s[g] = p.scales + int64_t(g) * p.scale_groups * p.n;
  arr.ptr_d[g] = reinterpret_cast<typename K::ElementD*>(p.d + row0 * p.d_row_bytes);
}

template <class Cfg>
class MixedTactic final : public IntTactic {
  using K = MixedKernel<Cfg>;

 public:
  Status init(const IntGroupedShape& s, int device, int sm_count) override {
    c_.name = "int tactic " + Cfg::name() + (Cfg::kFp32Out ? " (fp32 D" : " (") + ", groups " +
              std::to_string(s.groups) + ", n " + std::to_string(s.n) + ", k " +
              std::to_string(s.k) + ", group " + std::to_string(s.group_size) + ")";
    if (s.group_size % kTileK != 0)
      return Status(ErrorCode::kUnsupported,
                    c_.name + ": the group size must be a multiple of the 64-deep k tile");
    shape_ = s;
    const int g = s.groups, n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    // The per-group arrays and the strides, which do not depend on a group's rows (packed,
    // K-major operands; D's and the scales' leading dimension is n).
    const std::size_t o_shapes = c_.arena.take(sizeof(typename K::UnderShape) * g);
    const std::size_t o_ptrs = c_.arena.take(sizeof(void*) * 4 * g);
    const std::size_t o_sa = c_.arena.take(sizeof(typename K::StrideA) * g);
    const std::size_t o_sb = c_.arena.take(sizeof(typename K::StrideB) * g);
    const std::size_t o_ss = c_.arena.take(sizeof(typename K::StrideS) * g);
    const std::size_t o_sd = c_.arena.take(sizeof(typename K::StrideD) * g);
    Status st = c_.arena.allocate(c_.name);
    if (st.ok())
      st = c_.arena.fill(o_sa, cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, k, 1}),
                         g, c_.name);
    if (st.ok())
      st = c_.arena.fill(o_sb, cutlass::make_cute_packed_stride(typename K::StrideB{}, {1, k, 1}),
                         g, c_.name);
    if (st.ok())
      st = c_.arena.fill(
          o_ss, cutlass::make_cute_packed_stride(typename K::StrideS{}, {n, k / s.group_size, 1}),
          g, c_.name);
    if (st.ok())
      st = c_.arena.fill(o_sd, cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, 1, 1}),
                         g, c_.name);
    if (st.ok()) st = c_.load(reinterpret_cast<const void*>(write_mixed_problems<K>));
    if (!st.ok()) return st;
    arrays_.shapes = reinterpret_cast<typename K::UnderShape*>(c_.arena.at(o_shapes));
    // Four arrays of g pointers, one after the other.
    auto ptr_array = [&](int i) {
      return static_cast<void*>(c_.arena.at(o_ptrs + sizeof(void*) * g * i));
    };
    arrays_.ptr_w = static_cast<const typename K::ElementCode**>(ptr_array(0));
    arrays_.ptr_a = static_cast<const typename K::ElementAct**>(ptr_array(1));
    arrays_.ptr_s = static_cast<const float**>(ptr_array(2));
    arrays_.ptr_d = static_cast<typename K::ElementD**>(ptr_array(3));

    typename K::Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape.num_groups = g;
    args.problem_shape.problem_shapes = arrays_.shapes;
    args.problem_shape.host_problem_shapes = nullptr;
    args.mainloop.ptr_A = arrays_.ptr_w;
    args.mainloop.dA = reinterpret_cast<typename K::StrideA*>(c_.arena.at(o_sa));
    args.mainloop.ptr_B = arrays_.ptr_a;
    args.mainloop.dB = reinterpret_cast<typename K::StrideB*>(c_.arena.at(o_sb));
    args.mainloop.ptr_S = arrays_.ptr_s;
    args.mainloop.dS = reinterpret_cast<typename K::StrideS*>(c_.arena.at(o_ss));
    args.mainloop.chunk_size = s.group_size;
    args.mainloop.ptr_Z = nullptr;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = arrays_.ptr_d;
    args.epilogue.dD = reinterpret_cast<typename K::StrideD*>(c_.arena.at(o_sd));
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sm_count;
    return c_.initialize(args);
  }

  Status run(const IntProblem& p, cudaStream_t stream) override {
    MixedProblemArgs a{};
    a.row_offsets = p.row_offsets;
    a.groups = shape_.groups;
    a.n = static_cast<int>(shape_.n);
    a.k = static_cast<int>(shape_.k);
    a.scale_groups = static_cast<int>(shape_.k / shape_.group_size);
    a.row_bytes = shape_.k * Cfg::kBits / 8;
    a.w = p.w;
    a.a = static_cast<const char*>(p.a);
    a.a_row_bytes = shape_.k * static_cast<int64_t>(sizeof(typename K::ElementAct));
    a.scales = p.scales;
    a.d = static_cast<char*>(p.d);
    a.d_row_bytes = shape_.n * static_cast<int64_t>(sizeof(typename K::ElementD));
    const int threads = 128, blocks = (a.groups + threads - 1) / threads;
    write_mixed_problems<K><<<blocks, threads, 0, stream>>>(a, arrays_);
    return c_.run(stream);
  }

  std::size_t workspace_bytes() const override { return c_.workspace_bytes(); }

 private:
  moekit::gemm::detail::CutlassGrouped<typename K::Gemm> c_;
  MixedArrays<K> arrays_{};
  IntGroupedShape shape_;
};

template <class Cfg>
IntTacticEntry mixed_entry() {
  return IntTacticEntry{Cfg::name(), false, Cfg::kFp32Out, []() -> std::unique_ptr<IntTactic> {
                          return std::make_unique<MixedTactic<Cfg>>();
                        }};
}

// The tactic list of one (activation type, code type): the 128 x 64 tile (one tactic per
// family), and the 128 x 128 one for long prefill; each with a D of the activation type (no
// zero points, no bias) and an fp32 one (IntGroupedGemm's staging).
template <class Act, class Code>
std::vector<IntTacticEntry> mixed_tactics() {
  std::vector<IntTacticEntry> v = {mixed_entry<MixedCfg<Act, Code, Act, 64>>(),
                                   mixed_entry<MixedCfg<Act, Code, float, 64>>()};
#if !defined(MOEKIT_ONE_TACTIC)
  v.push_back(mixed_entry<MixedCfg<Act, Code, Act, 128>>());
  v.push_back(mixed_entry<MixedCfg<Act, Code, float, 128>>());
#endif
  return v;
}

}  // namespace moekit::gemm::int_detail::mixed
