// Fp8GroupedGemm (fp8_grouped_gemm.hpp): CUTLASS 4.2's Hopper ptr-array grouped GEMM with
// blockwise-scaled fp32 accumulation (KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
// the lineage of CUTLASS's example 68), e4m3 x e4m3 -> bf16.
//
// Normal tactics: A = activations [M_g, k] with scales per row and 128 columns (granularity
// 1 x 128), B = weights [n, k] with scales per 128 x 128 block; D row-major. Swap-AB tactics
// (decode): A = weights (granularity 128 x 128), B = the few activation rows (1 x 128), D^T
// column-major, which is D row-major. Both scale arrays are K-major: the activations' [rows,
// k / 128] and the checkpoint's [n / 128, k / 128] as they are, so a group's scales start at
// its first row (block row) and no repack is needed.
//
// Graph safety as in sm90_grouped.cuh: problem shapes only in device memory (host shapes
// nullptr: can_implement then checks nothing per group), arguments built once on arrays whose
// addresses never change; run() only launches.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
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
#include "gemm/fp8_grouped_gemm.hpp"
#include "gemm/fp8_tactic.hpp"

namespace moekit::gemm {
namespace {

using namespace cute;
using fp8_detail::Fp8Problem;
using fp8_detail::Fp8Tactic;
using fp8_detail::Fp8TacticEntry;

constexpr int kBlock = static_cast<int>(Fp8GroupedGemm::kBlock);

// One kernel configuration: tile, cluster, swap-AB, schedule. Its name is its identity.
// Cooperative: two warp groups share a tile. Ping-pong: each warp group owns a 64-row tile, and
// one's promotion of a k block's sums (times the blocks' scales) and epilogue overlap the other's
// MMAs; two 64x128 fp32 sums a thread (the running one and the k block's) fit its registers.
template <int M, int N, bool SwapAB, class OutElement = cutlass::bfloat16_t, bool Pingpong = false>
struct Fp8Cfg {
  static_assert(!Pingpong || (M == 64 && !SwapAB), "ping-pong: normal 64-row tiles");
  static constexpr bool kSwapAB = SwapAB;
  static constexpr bool kPingpong = Pingpong;
  using ElementD = OutElement;
  static constexpr bool kFp32Out = std::is_same_v<OutElement, float>;
  using Tile = Shape<Int<M>, Int<N>, Int<kBlock>>;
  using Cluster = Shape<_1, _1, _1>;
  static std::string name() {
    return std::string("sm90.fp8.") +
           (SwapAB     ? "swapab."
            : Pingpong ? "pingpong."
                       : "coop.") +
           std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(kBlock) + ".c1x1" +
           (kFp32Out ? ".f32" : "");
  }
};

template <class Cfg>
struct Fp8Kernel {
  using Element = cutlass::float_e4m3_t;
  using ElementD = typename Cfg::ElementD;
  using LayoutA = cutlass::layout::RowMajor;     // K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // [n, k] read as [k, n]: K-major
  using LayoutD =
      std::conditional_t<Cfg::kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlign = 16;  // e4m3 elements in a 16-byte TMA row
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));  // 16-byte rows
  // Granularity (M, N, K): the weights' 128 x 128 blocks and the activations' 1 x 128 groups.
  using ScaleConfig =
      std::conditional_t<Cfg::kSwapAB,
                         cutlass::detail::Sm90BlockwiseScaleConfig<
                             kBlock, 1, kBlock, cute::GMMA::Major::K, cute::GMMA::Major::K>,
                         cutlass::detail::Sm90BlockwiseScaleConfig<
                             1, kBlock, kBlock, cute::GMMA::Major::K, cute::GMMA::Major::K>>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile,
      typename Cfg::Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
      std::conditional_t<Cfg::kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlign, Element, cute::tuple<LayoutB*, LayoutSFB*>, kAlign,
      float, typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      std::conditional_t<
          Cfg::kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>>::CollectiveOp;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(sizeof(typename Kernel::SharedStorage) <= 232448, "shared memory over 227 KB");
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using UnderShape = typename ProblemShape::UnderlyingProblemShape;
};

// The per-group arrays one tactic's kernel reads; written on the device by its problem kernel.
template <class K>
struct GroupArrays {
  typename K::UnderShape* shapes;
  const typename K::Element** ptr_a;
  const typename K::Element** ptr_b;
  const float** ptr_sfa;
  const float** ptr_sfb;
  typename K::ElementD** ptr_d;
  typename K::LayoutSFA* layout_sfa;
  typename K::LayoutSFB* layout_sfb;
};

// One thread per group: its problem shape, operand, scale and output pointers, scale layouts.
template <class K, bool kSwapAB>
__global__ void write_fp8_problems(Fp8Problem p, GroupArrays<K> arr) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.groups) return;
  const int64_t row0 = p.row_offsets[g];
  const int m = max(p.row_offsets[g + 1] - p.row_offsets[g], 0);
  const int64_t kb = p.k / kBlock;
  const auto* act = reinterpret_cast<const typename K::Element*>(p.a + row0 * p.k);
  const float* act_s = p.a_scales + row0 * kb;
  const auto* w = reinterpret_cast<const typename K::Element*>(p.w + int64_t(g) * p.n * p.k);
  const float* w_s = p.w_scales + int64_t(g) * (p.n / kBlock) * kb;
  if constexpr (kSwapAB) {
    arr.shapes[g] = typename K::UnderShape{p.n, m, p.k};
    arr.ptr_a[g] = w;
    arr.ptr_sfa[g] = w_s;
    arr.ptr_b[g] = act;
    arr.ptr_sfb[g] = act_s;
    arr.layout_sfa[g] = K::ScaleConfig::tile_atom_to_shape_SFA(make_shape(p.n, m, p.k, 1));
    arr.layout_sfb[g] = K::ScaleConfig::tile_atom_to_shape_SFB(make_shape(p.n, m, p.k, 1));
  } else {
    arr.shapes[g] = typename K::UnderShape{m, p.n, p.k};
    arr.ptr_a[g] = act;
    arr.ptr_sfa[g] = act_s;
    arr.ptr_b[g] = w;
    arr.ptr_sfb[g] = w_s;
    arr.layout_sfa[g] = K::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, p.n, p.k, 1));
    arr.layout_sfb[g] = K::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, p.n, p.k, 1));
  }
  arr.ptr_d[g] = reinterpret_cast<typename K::ElementD*>(p.d) + row0 * p.n;
}

template <class Cfg>
class Fp8CutlassTactic final : public Fp8Tactic {
  using K = Fp8Kernel<Cfg>;

 public:
  Status init(const Fp8GroupedShape& s, int device, int sm_count) override {
    c_.name = "fp8 tactic " + Cfg::name() + " (groups " + std::to_string(s.groups) + ", n " +
              std::to_string(s.n) + ", k " + std::to_string(s.k) + ")";
    const int g = s.groups, n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    // The per-group arrays and the strides, which do not depend on M_g (packed, K-major
    // operands; D's leading dimension is n).
    const std::size_t o_shapes = c_.arena.take(sizeof(typename K::UnderShape) * g);
    const std::size_t o_ptrs = c_.arena.take(sizeof(void*) * 5 * g);
    const std::size_t o_lsfa = c_.arena.take(sizeof(typename K::LayoutSFA) * g);
    const std::size_t o_lsfb = c_.arena.take(sizeof(typename K::LayoutSFB) * g);
    const std::size_t o_sa = c_.arena.take(sizeof(typename K::StrideA) * g);
    const std::size_t o_sb = c_.arena.take(sizeof(typename K::StrideB) * g);
    const std::size_t o_sd = c_.arena.take(sizeof(typename K::StrideD) * g);
    typename K::StrideA sa;
    typename K::StrideB sb;
    typename K::StrideD sd;
    if constexpr (Cfg::kSwapAB) {
      sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, k, 1});  // weights [n, k]
      sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, {1, k, 1});  // rows, ld k
      sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, 1, 1});  // D^T, ld n
    } else {
      sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, {1, k, 1});
      sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, {n, k, 1});
      sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, {1, n, 1});
    }
    Status st = c_.arena.allocate(c_.name);
    if (st.ok()) st = c_.arena.fill(o_sa, sa, g, c_.name);
    if (st.ok()) st = c_.arena.fill(o_sb, sb, g, c_.name);
    if (st.ok()) st = c_.arena.fill(o_sd, sd, g, c_.name);
    if (st.ok()) st = c_.load(reinterpret_cast<const void*>(write_fp8_problems<K, Cfg::kSwapAB>));
    if (!st.ok()) return st;
    arrays_.shapes = reinterpret_cast<typename K::UnderShape*>(c_.arena.at(o_shapes));
    // Five pointer arrays of `g` entries each, one after the other.
    auto ptr_array = [&](int i) {
      return static_cast<void*>(c_.arena.at(o_ptrs + sizeof(void*) * g * i));
    };
    arrays_.ptr_a = static_cast<const typename K::Element**>(ptr_array(0));
    arrays_.ptr_b = static_cast<const typename K::Element**>(ptr_array(1));
    arrays_.ptr_sfa = static_cast<const float**>(ptr_array(2));
    arrays_.ptr_sfb = static_cast<const float**>(ptr_array(3));
    arrays_.ptr_d = static_cast<typename K::ElementD**>(ptr_array(4));
    arrays_.layout_sfa = reinterpret_cast<typename K::LayoutSFA*>(c_.arena.at(o_lsfa));
    arrays_.layout_sfb = reinterpret_cast<typename K::LayoutSFB*>(c_.arena.at(o_lsfb));

    typename K::Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape.num_groups = g;
    args.problem_shape.problem_shapes = arrays_.shapes;
    args.problem_shape.host_problem_shapes = nullptr;
    args.mainloop.ptr_A = arrays_.ptr_a;
    args.mainloop.dA = reinterpret_cast<typename K::StrideA*>(c_.arena.at(o_sa));
    args.mainloop.ptr_B = arrays_.ptr_b;
    args.mainloop.dB = reinterpret_cast<typename K::StrideB*>(c_.arena.at(o_sb));
    args.mainloop.ptr_SFA = arrays_.ptr_sfa;
    args.mainloop.layout_SFA = arrays_.layout_sfa;
    args.mainloop.ptr_SFB = arrays_.ptr_sfb;
    args.mainloop.layout_SFB = arrays_.layout_sfb;
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

  Status run(const Fp8Problem& p, cudaStream_t stream) override {
    const int threads = 128, blocks = (p.groups + threads - 1) / threads;
    write_fp8_problems<K, Cfg::kSwapAB><<<blocks, threads, 0, stream>>>(p, arrays_);
    return c_.run(stream);
  }

  std::size_t workspace_bytes() const override { return c_.workspace_bytes(); }

 private:
  moekit::gemm::detail::CutlassGrouped<typename K::Gemm> c_;
  GroupArrays<K> arrays_{};
};

template <class Cfg>
Fp8TacticEntry entry() {
  return Fp8TacticEntry{Cfg::name(), Cfg::kFp32Out, []() -> std::unique_ptr<Fp8Tactic> {
                          return std::make_unique<Fp8CutlassTactic<Cfg>>();
                        }};
}

// The tactic list: a swap-AB tile for the few rows per expert of decode, the 128 x 128 tile for
// prefill; each with a bf16 and an fp32 D. Beside them the ping-pong 64 x 128 tile for ~32 rows
// per expert (pick_tactic; not in MOEKIT_ONE_TACTIC builds).
std::vector<Fp8TacticEntry> fp8_tactics() {
  std::vector<Fp8TacticEntry> v = {entry<Fp8Cfg<128, 128, false>>(), entry<Fp8Cfg<128, 32, true>>(),
                                   entry<Fp8Cfg<128, 128, false, float>>(),
                                   entry<Fp8Cfg<128, 32, true, float>>()};
#if !defined(MOEKIT_ONE_TACTIC)
  v.push_back(entry<Fp8Cfg<64, 128, false, cutlass::bfloat16_t, true>>());
  v.push_back(entry<Fp8Cfg<64, 128, false, float, true>>());
#endif
  for (Fp8TacticEntry& e : fp8_detail::sm90_fp8_gemv_tactics()) v.push_back(std::move(e));
  return v;
}

}  // namespace

struct Fp8GroupedGemm::State {
  Fp8GroupedShape shape;
  int device = 0;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<Fp8Tactic>> tactics;
};

Status Fp8GroupedGemm::validate(const Fp8GroupedShape& s) {
  if (s.groups < 1)
    return Status(ErrorCode::kInvalidArgument,
                  "fp8 grouped GEMM groups " + std::to_string(s.groups) + " must be at least 1");
  if (s.n < 1 || s.n > INT_MAX || s.k < 1 || s.k > INT_MAX)
    return Status(ErrorCode::kInvalidArgument, "fp8 grouped GEMM n " + std::to_string(s.n) +
                                                   " and k " + std::to_string(s.k) +
                                                   " must be in [1, 2^31)");
  if (s.max_rows < 0 || s.max_rows > INT_MAX)
    return Status(
        ErrorCode::kInvalidArgument,
        "fp8 grouped GEMM max_rows " + std::to_string(s.max_rows) + " must be in [0, 2^31)");
  if (s.n % kBlock != 0 || s.k % kBlock != 0)
    return Status(ErrorCode::kUnsupported, "fp8 grouped GEMM n " + std::to_string(s.n) + " and k " +
                                               std::to_string(s.k) +
                                               " must be multiples of the 128-wide scale blocks");
  return {};
}

Fp8GroupedGemm::Fp8GroupedGemm(const Fp8GroupedShape& shape, int device)
    : state_(std::make_unique<State>()) {
  throw_if_error(validate(shape));
  state_->shape = shape;
  state_->device = device;
  DeviceGuard guard(device);
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "querying the device");
  if (prop.major != 9 || prop.minor != 0)
    throw Error(ErrorCode::kUnsupported, "the fp8 grouped GEMM needs sm_90 (Hopper), device " +
                                             std::to_string(device) + " is sm_" +
                                             std::to_string(prop.major * 10 + prop.minor));
  for (auto& e : fp8_tactics()) {
    if (e.fp32_out != shape.fp32_out) continue;
    std::unique_ptr<Fp8Tactic> t = e.make();
    throw_if_error(t->init(shape, device, prop.multiProcessorCount));
    state_->names.push_back(e.name);
    state_->tactics.push_back(std::move(t));
  }
  check_cuda(cudaDeviceSynchronize(), "finishing the fp8 grouped GEMM's set-up");
}

Fp8GroupedGemm::~Fp8GroupedGemm() = default;

std::vector<std::string> Fp8GroupedGemm::tactics() const { return state_->names; }

std::string Fp8GroupedGemm::pick_tactic(double rows_per_group_hint) const {
  // The BF16 engine's bands, confirmed for FP8 by `moekit tune` (H100, 2026-12-07,
  // bench/results/2026-12-07-h100-ec428f1-tests-tune.md, softmax_topk routing): up to ~24 rows per
  // expert the swap-AB tile (weights as M, 32 rows as N) reads each weight once; around 32 rows
  // the 64-row ping-pong tile wastes least (qwen3 T=512, 32 rows: the forward 318.5 -> 292.6 us
  // with it on both GEMMs; deepseek's FC1 at 32 rows too); from 64 rows the 128 x 128 tile,
  // except qwen3's small FC2 (ping-pong to 64 rows, within 1%). Builds with one tactic per
  // family lack the ping-pong tile: the swap-AB one stands in up to 48 rows.
  const double h = std::isfinite(rows_per_group_hint) ? std::max(rows_per_group_hint, 0.0) : 0.0;
  // Up to one row per expert the TMA GEMV streams the weights of the hit experts once, as the
  // BF16 engine's does (sm90_fp8_gemv_tma.cu).
  const std::vector<const char*> wanted =
      h <= 1.0    ? std::vector<const char*>{"sm90.fp8.gemv.", "sm90.fp8.swapab."}
      : h <= 24.0 ? std::vector<const char*>{"sm90.fp8.swapab."}
      : h <= 48.0 ? std::vector<const char*>{"sm90.fp8.pingpong.", "sm90.fp8.swapab."}
                  : std::vector<const char*>{"sm90.fp8.coop."};
  for (const char* prefix : wanted)
    for (const std::string& name : state_->names)
      if (name.rfind(prefix, 0) == 0) return name;
  return state_->names.front();
}

Status Fp8GroupedGemm::run(const Call& c, const int32_t* row_offsets, cudaStream_t stream) {
  const std::string tactic = c.tactic.empty() ? pick_tactic(c.rows_per_group_hint) : c.tactic;
  const auto it = std::find(state_->names.begin(), state_->names.end(), tactic);
  if (it == state_->names.end())
    return Status(ErrorCode::kNotFound, "fp8 grouped GEMM tactic \"" + tactic + "\" is not built");
  const std::pair<const void*, const char*> ptrs[] = {
      {c.a, "A"},           {c.a_scales, "A's scales"},
      {c.w, "the weights"}, {c.w_scales, "the weight scales"},
      {c.d, "D"},           {row_offsets, "row_offsets"}};
  for (const auto& [p, what] : ptrs)
    if (p == nullptr)
      return Status(ErrorCode::kInvalidArgument,
                    std::string("fp8 grouped GEMM: ") + what + " is null");
  for (const void* p : {c.a, c.w, static_cast<const void*>(c.d)})
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      return Status(ErrorCode::kInvalidArgument,
                    "fp8 grouped GEMM: an operand is not 16-byte aligned (TMA rows)");
  if (state_->shape.max_rows == 0) return {};
  Fp8Problem p{};
  p.row_offsets = row_offsets;
  p.groups = state_->shape.groups;
  p.n = static_cast<int>(state_->shape.n);
  p.k = static_cast<int>(state_->shape.k);
  p.a = static_cast<const uint8_t*>(c.a);
  p.a_scales = c.a_scales;
  p.w = static_cast<const uint8_t*>(c.w);
  p.w_scales = c.w_scales;
  p.d = static_cast<char*>(c.d);
  return state_->tactics[static_cast<std::size_t>(it - state_->names.begin())]->run(p, stream);
}

std::size_t Fp8GroupedGemm::workspace_bytes() const {
  std::size_t b = 0;
  for (const auto& t : state_->tactics) b += t->workspace_bytes();
  return b;
}

const Fp8GroupedShape& Fp8GroupedGemm::shape() const { return state_->shape; }

}  // namespace moekit::gemm
