// Over 800 lines: one fixture's cases over every grouped GEMM tactic, epilogue and sanitizer run.
// Every grouped GEMM tactic against a CPU fp32 GEMM on fresh random data, outputs poisoned
// (NaN bits) before each run: uneven groups with empty ones, all rows in one group, last tiles
// of at most and just over half a tile, decode-like single rows, no rows at all; shapes of real
// presets and small ones with ragged tails; the fused FC1 activation epilogue; CUDA graph capture
// of the very first run, replayed on new contents, equals eager.
// GPU tests skip where there is no sm_90 device; the shape checks run everywhere.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gemm/grouped_gemm.hpp"
#include "gemm/tactic.hpp"
#include "moekit/status.hpp"
#include "support/gemm_problem.hpp"
#include "support/gpu.hpp"

namespace moekit::gemm {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

constexpr uint16_t kPoison = 0xffff;  // NaN in bf16 and fp16

const char* elem_name(Elem e) { return e == Elem::kBF16 ? "bf16" : "fp16"; }

using Problem = GemmProblem;

// The fp32 reference from the element-rounded inputs.
void compute_reference(Problem& p) {
  std::vector<float> a(p.a_bits.size()), w(p.w_bits.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = from_bits(dtype_of(p.elem), p.a_bits[i]);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = from_bits(dtype_of(p.elem), p.w_bits[i]);
  const int64_t n = p.n, k = p.k;
  p.ref.assign(static_cast<std::size_t>(p.rows * n), 0.f);
  for (int g = 0; g < p.groups; ++g) {
    for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r) {
      const float* ar = a.data() + r * k;
      for (int64_t i = 0; i < n; ++i) {
        const float* wr = w.data() + (int64_t(g) * n + i) * k;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // k % 8 == 0; independent sums for speed
        for (int64_t kk = 0; kk < k; kk += 8)
          for (int j = 0; j < 8; ++j) acc[j] += ar[kk + j] * wr[kk + j];
        p.ref[r * n + i] =
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      }
    }
  }
}

Problem make_problem(Elem elem, int64_t n, int64_t k, const std::vector<int>& counts,
                     std::mt19937& rng, int64_t extra_rows = 3) {
  Problem p = make_gemm_inputs(elem, n, k, counts, rng, extra_rows);
  compute_reference(p);
  return p;
}

// Device copies of a problem's inputs and an output buffer.
struct DeviceProblem {
  DeviceBuffer a, w, d, offsets;
  explicit DeviceProblem(const Problem& p)
      : a(to_device(p.a_bits)),
        w(to_device(p.w_bits)),
        d(static_cast<std::size_t>(p.max_rows * p.n) * 2),
        offsets(to_device(p.offsets)) {}
  std::vector<uint16_t> download() const { return to_host<uint16_t>(d.ptr, d.bytes / 2); }
};

// Relative error per non-empty group below 1e-2, every output written, nothing past the rows.
void expect_matches(const Problem& p, const std::vector<uint16_t>& out) {
  for (int g = 0; g < p.groups; ++g) {
    double diff = 0, norm = 0;
    int64_t unwritten = 0;
    for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r)
      for (int64_t i = 0; i < p.n; ++i) {
        const float v = from_bits(dtype_of(p.elem), out[r * p.n + i]);
        const float ref = p.ref[r * p.n + i];
        if (!std::isfinite(v)) {
          ++unwritten;
          continue;
        }
        diff += double(v - ref) * double(v - ref);
        norm += double(ref) * double(ref);
      }
    if (p.offsets[g + 1] == p.offsets[g]) continue;
    EXPECT_EQ(unwritten, 0) << "group " << g << " has unwritten (NaN) outputs";
    EXPECT_LT(std::sqrt(diff / std::max(norm, 1e-30)), 1e-2)
        << "group " << g << " rows " << p.offsets[g + 1] - p.offsets[g];
  }
  int64_t stray = 0;
  for (int64_t idx = p.rows * p.n; idx < p.max_rows * p.n; ++idx) stray += out[idx] != kPoison;
  EXPECT_EQ(stray, 0) << "outputs written past row " << p.rows;
}

// Poisons the output, runs `tactic`, waits, and returns the output (empty after a failure,
// which is reported).
std::vector<uint16_t> run_poisoned(GroupedGemm& gemm, DeviceProblem& dp, const Problem& p,
                                   const std::string& tactic, cudaStream_t stream) {
  dp.d.poison();
  const Status s =
      gemm.run(dp.a.ptr, dp.w.ptr, dp.d.ptr, static_cast<const int32_t*>(dp.offsets.ptr),
               double(p.rows) / p.groups, stream, tactic);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok() || cudaStreamSynchronize(stream) != cudaSuccess) return {};
  return dp.download();
}

// Runs a gathering tactic (GemmCall::row_source): the problem's rows shuffled into a token
// matrix, read back by index. The indices of the rows past the last group are poisoned with
// INT_MAX: a read of one would fault (and show under memcheck).
std::vector<uint16_t> run_gathered(GroupedGemm& gemm, DeviceProblem& dp, const Problem& p,
                                   const std::string& tactic, std::mt19937& rng,
                                   cudaStream_t stream) {
  std::vector<int32_t> perm(static_cast<std::size_t>(p.rows));
  for (int64_t r = 0; r < p.rows; ++r) perm[r] = static_cast<int32_t>(r);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint16_t> tokens(static_cast<std::size_t>(std::max<int64_t>(p.rows, 1) * p.k));
  std::vector<int32_t> source(static_cast<std::size_t>(p.max_rows), INT32_MAX);
  for (int64_t r = 0; r < p.rows; ++r) {
    std::copy_n(p.a_bits.begin() + r * p.k, p.k, tokens.begin() + int64_t(perm[r]) * p.k);
    source[r] = perm[r];
  }
  DeviceBuffer x = to_device(tokens);
  DeviceBuffer src = to_device(source);
  dp.d.poison();
  GroupedGemm::GemmCall call{&gemm, x.ptr, dp.w.ptr, dp.d.ptr, tactic};
  call.row_source = src.as<int32_t>();
  const auto* offsets = static_cast<const int32_t*>(dp.offsets.ptr);
  Status s = GroupedGemm::write_problems(&call, 1, offsets, stream);
  if (s.ok()) s = gemm.launch(call, offsets, stream);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok() || cudaStreamSynchronize(stream) != cudaSuccess) return {};
  return dp.download();
}

struct Distribution {
  const char* name;
  std::vector<int> counts;
};

std::vector<Distribution> distributions(std::mt19937& rng) {
  // Decode: 16 experts, 8 of them hit by 1-3 rows, the rest empty.
  std::vector<int> decode(16, 0);
  std::vector<int> ids(16);
  for (int i = 0; i < 16; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_int_distribution<int> rows(1, 3);
  for (int i = 0; i < 8; ++i) decode[ids[i]] = rows(rng);
  return {
      {"uneven", {37, 0, 1, 130, 0, 9, 17}},  // crosses every token tile, empties inside
      {"all_in_one", {0, 0, 203, 0, 0}},
      // Last 128-row tiles of 64, 65, 64, 1 and 1 rows: at most and just over one warp group's
      // rows of the cooperative tiles, whose TMA fills the rest with zeros.
      {"tile_edges", {64, 65, 0, 192, 129, 1}},
      {"decode", decode},
      {"all_empty", {0, 0, 0, 0}},
  };
}

using ShapeParam = std::tuple<Elem, int64_t, int64_t>;  // elem, n, k

class GroupedGemmTactics : public GpuTest, public ::testing::WithParamInterface<ShapeParam> {};

TEST_P(GroupedGemmTactics, EveryTacticMatchesCpuReference) {
  const auto [elem, full_n, full_k] = GetParam();
  // Under the sanitizers the qwen3 shapes shrink 4x each way: the same tiles, k blocks and
  // tails run, in a fraction of the instrumented time (2-2.5 min each under racecheck).
  const bool shrink = sanitizer_run() && full_n >= 1024;
  const int64_t n = shrink ? full_n / 4 : full_n, k = shrink ? full_k / 4 : full_k;
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e01));
  const std::vector<std::string> tactics = tactic_names(elem);
  ASSERT_FALSE(tactics.empty());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const auto& dist : distributions(rng)) {
    SCOPED_TRACE(std::string("distribution ") + dist.name);
    const Problem p = make_problem(elem, n, k, dist.counts, rng);
    DeviceProblem dp(p);
    GroupedGemm gemm(GroupedShape{elem, p.groups, n, k, p.max_rows}, 0);
    for (const auto& tactic : tactics) {
      SCOPED_TRACE("tactic " + tactic);
      const std::vector<uint16_t> out = run_poisoned(gemm, dp, p, tactic, stream);
      ASSERT_FALSE(out.empty());
      expect_matches(p, out);
    }
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GroupedGemmTactics,
    ::testing::Values(ShapeParam{Elem::kBF16, 1536, 2048},  // qwen3-30b-a3b FC1 (2 x 768, 2048)
                      ShapeParam{Elem::kBF16, 2048, 768},   // qwen3-30b-a3b FC2
                      ShapeParam{Elem::kFP16, 1536, 2048}, ShapeParam{Elem::kFP16, 2048, 768},
                      ShapeParam{Elem::kBF16, 64, 64}, ShapeParam{Elem::kFP16, 64, 64},
                      ShapeParam{Elem::kBF16, 200, 40},  // ragged n and k tails
                      ShapeParam{Elem::kFP16, 200, 40}),
    [](const ::testing::TestParamInfo<ShapeParam>& info) {
      return std::string(elem_name(std::get<0>(info.param))) + "_n" +
             std::to_string(std::get<1>(info.param)) + "_k" +
             std::to_string(std::get<2>(info.param));
    });

// FC1 with the fused epilogue: bias + gated activation on the accumulators, output [rows, n/2],
// against activation_math.hpp applied to the fp32 reference (rows in the blocked gate/up
// order). Every kind, with and without bias; ragged n (13 x 16) and k tails; every "+act"
// kernel (the staged write-back of the cooperative tiles, the direct stores of the others, the
// GEMV's reduction, the pairs reading their rows by index), and the store kernels of the same
// object still store FC1's raw output.
class GroupedGemmActivation : public GpuTest {};

// The "+act" kernels' expected output, [rows, n / 2], from the fp32 reference (rows in the
// blocked gate/up order); `bias` [groups, n] or empty.
Problem gated_reference(const Problem& p, const activation::Params& act,
                        const std::vector<float>& bias) {
  const int64_t n = p.n, half = n / 2;
  Problem want = p;
  want.n = half;
  want.ref.assign(static_cast<std::size_t>(p.rows * half), 0.f);
  for (int g = 0; g < p.groups; ++g)
    for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r)
      for (int64_t j = 0; j < half; ++j) {
        const int64_t gr = activation::blocked_gate_row(j);
        const int64_t ur = activation::blocked_up_row(j);
        const float gate = p.ref[r * n + gr] + (bias.empty() ? 0.f : bias[g * n + gr]);
        const float up = p.ref[r * n + ur] + (bias.empty() ? 0.f : bias[g * n + ur]);
        want.ref[r * half + j] = activation::apply_gated(act, gate, up);
      }
  return want;
}

TEST_F(GroupedGemmActivation, EveryTacticAppliesBiasAndGatedActivation) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e05));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct KindCase {
    activation::Kind kind;
    float limit = INFINITY, alpha = 1.0f, beta = 0.0f;
  };
  const std::vector<KindCase> kinds = {{activation::Kind::kSwiGLU},
                                       {activation::Kind::kSwiGLUClamped, 1.5f, 1.702f, 1.0f},
                                       {activation::Kind::kGeGLUTanh},
                                       {activation::Kind::kGeGLUErf}};
  // Under the sanitizers the qwen3 shape shrinks 4x each way, as in GroupedGemmTactics (150-205
  // s under memcheck, initcheck and synccheck; past 8 minutes under racecheck, H100 2026-12-07).
  const std::pair<int64_t, int64_t> qwen3 = sanitizer_run()
                                                ? std::pair<int64_t, int64_t>{384, 512}
                                                : std::pair<int64_t, int64_t>{1536, 2048};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (Elem elem : {Elem::kBF16, Elem::kFP16})
    for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{qwen3, {208, 40}})
      for (const auto& dist : distributions(rng)) {
        if (dist.counts.size() == 4) continue;  // all_empty: covered by the store test
        // Under the sanitizers (racecheck: past 8 minutes, H100 2026-12-07) two distributions,
        // the tiles' and the GEMVs', and each kind once, with or without a bias in turn: every
        // kernel and epilogue still runs, each on fewer data.
        const std::string dist_name = dist.name;
        if (sanitizer_run() && dist_name != "uneven" && dist_name != "decode") continue;
        SCOPED_TRACE(std::string(elem_name(elem)) + " n " + std::to_string(n) + " k " +
                     std::to_string(k) + " distribution " + dist.name);
        const Problem p = make_problem(elem, n, k, dist.counts, rng);
        DeviceProblem dp(p);
        const int64_t half = n / 2;
        for (std::size_t kind_index = 0; kind_index < kinds.size(); ++kind_index)
          for (bool with_bias : {false, true}) {
            const KindCase& kc = kinds[kind_index];
            if (sanitizer_run() && with_bias != (kind_index % 2 == 1)) continue;
            SCOPED_TRACE("kind " + std::to_string(int(kc.kind)) + (with_bias ? " bias" : ""));
            std::vector<float> bias(with_bias ? p.groups * n : 0);
            for (auto& b : bias) b = normal(rng);
            DeviceBuffer d_bias = to_device(bias);
            EpilogueActivation act;
            act.params.kind = kc.kind;
            act.params.limit = kc.limit;
            act.params.alpha = kc.alpha;
            act.params.beta = kc.beta;
            act.bias = with_bias ? d_bias.as<float>() : nullptr;
            GroupedGemm gemm(GroupedShape{elem, p.groups, n, k, p.max_rows}, 0, act);
            const Problem want = gated_reference(p, act.params, bias);
            int fused = 0;
            int gathering = 0;
            for (const auto& tactic : gemm.tactics()) {
              SCOPED_TRACE("tactic " + tactic);
              const bool gathers = tactic.find(".gather") != std::string::npos;
              gathering += gathers;
              std::vector<uint16_t> out = gathers ? run_gathered(gemm, dp, p, tactic, rng, stream)
                                                  : run_poisoned(gemm, dp, p, tactic, stream);
              ASSERT_FALSE(out.empty());
              const bool act_name = tactic.size() > 4 && tactic.substr(tactic.size() - 4) == "+act";
              EXPECT_EQ(gemm.applies_activation(tactic), act_name);
              // Only the GEMVs read row_offsets themselves (and so the offsets flag).
              EXPECT_EQ(gemm.reads_row_offsets(tactic), tactic.rfind("sm90.gemv.", 0) == 0);
              if (!gemm.applies_activation(tactic)) {  // stores FC1's raw output
                if (!with_bias) expect_matches(p, out);
                continue;
              }
              ++fused;
              out.resize(static_cast<std::size_t>(p.max_rows * half));
              expect_matches(want, out);
            }
            EXPECT_EQ(fused - gathering, static_cast<int>(tactic_names(elem).size()))
                << "every tactic has a +act kernel";
            // The prefill pairs read their rows by index too (the engine's FC1 past the
            // single-block permute, where n <= GroupedGemm::kMaxGatheringWidth), each width.
            const auto names = tactic_names(elem);
            EXPECT_EQ(gathering, std::count_if(names.begin(), names.end(), [](const auto& t) {
                        return t.find(".pairs") != std::string::npos;
                      }));
            EXPECT_EQ(gemm.gathering_tactic("sm90.coop.128x256x64.c2x1.dyn.pairs+act"),
                      "sm90.coop.128x256x64.c2x1.dyn.pairs.gather+act");
          }
      }
  cudaStreamDestroy(stream);
}

// Capture the first run a fresh object ever makes, replay it on new row counts and new
// activations (same buffers), and compare bit for bit with eager runs of another object.
class GroupedGemmGraph : public GpuTest {};

TEST_F(GroupedGemmGraph, ReplayOfFirstCapturedRunEqualsEager) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e03));
  const Elem elem = Elem::kBF16;
  const int64_t n = 256, k = 512;
  const Problem first = make_problem(elem, n, k, {5, 0, 40, 1, 0, 70, 2, 0}, rng);
  // Same groups and max_rows, other counts and other activations.
  Problem second = make_problem(elem, n, k, {0, 90, 3, 0, 11, 0, 1, 12}, rng, first.max_rows - 117);
  ASSERT_EQ(second.max_rows, first.max_rows);
  second.w_bits = first.w_bits;  // the weights stay
  compute_reference(second);

  for (const auto& tactic : tactic_names(elem)) {
    SCOPED_TRACE("tactic " + tactic);
    DeviceProblem dp(first);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    GroupedGemm captured(GroupedShape{elem, first.groups, n, k, first.max_rows}, 0);
    dp.d.poison();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const Status s = captured.run(dp.a.ptr, dp.w.ptr, dp.d.ptr,
                                  static_cast<const int32_t*>(dp.offsets.ptr), 8.0, stream, tactic);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(s.ok()) << s.message();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<uint16_t> replay1 = dp.download();
    expect_matches(first, replay1);

    GroupedGemm eager(GroupedShape{elem, first.groups, n, k, first.max_rows}, 0);
    dp.d.poison();
    ASSERT_TRUE(eager
                    .run(dp.a.ptr, dp.w.ptr, dp.d.ptr, static_cast<const int32_t*>(dp.offsets.ptr),
                         8.0, stream, tactic)
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(dp.download() == replay1) << "eager differs from the first replay";

    // New contents in the same buffers: the graph must read them, not what it saw at capture.
    upload(dp.a, second.a_bits);
    upload(dp.offsets, second.offsets);
    dp.d.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<uint16_t> replay2 = dp.download();
    expect_matches(second, replay2);
    dp.d.poison();
    ASSERT_TRUE(eager
                    .run(dp.a.ptr, dp.w.ptr, dp.d.ptr, static_cast<const int32_t*>(dp.offsets.ptr),
                         8.0, stream, tactic)
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(dp.download() == replay2) << "eager differs from the second replay";

    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// FC1 and FC2 of a layer: one write_problems() for both, then launch() each; on two objects
// with different shapes, every tactic pair the heuristic may pick at these hints.
class GroupedGemmTwoCalls : public GpuTest {};

TEST_F(GroupedGemmTwoCalls, OneProblemWriteServesBothGemms) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e07));
  const Elem elem = Elem::kBF16;
  const std::vector<int> counts = {37, 0, 1, 130, 0, 9, 17};
  const Problem p1 = make_problem(elem, 256, 128, counts, rng);
  const Problem p2 = make_problem(elem, 128, 256, counts, rng);
  DeviceProblem d1(p1), d2(p2);
  GroupedGemm g1(GroupedShape{elem, p1.groups, p1.n, p1.k, p1.max_rows}, 0);
  GroupedGemm g2(GroupedShape{elem, p2.groups, p2.n, p2.k, p2.max_rows}, 0);
  for (double hint : {0.1, 5.0, 40.0, 100.0}) {
    SCOPED_TRACE("hint " + std::to_string(hint));
    using Call = GroupedGemm::GemmCall;
    const Call calls[2] = {Call{&g1, d1.a.ptr, d1.w.ptr, d1.d.ptr, g1.pick_tactic(hint)},
                           Call{&g2, d2.a.ptr, d2.w.ptr, d2.d.ptr, g2.pick_tactic(hint)}};
    d1.d.poison();
    d2.d.poison();
    const auto* offsets = static_cast<const int32_t*>(d1.offsets.ptr);
    ASSERT_TRUE(GroupedGemm::write_problems(calls, 2, offsets, nullptr).ok());
    ASSERT_TRUE(g1.launch(calls[0], offsets, nullptr).ok());
    ASSERT_TRUE(g2.launch(calls[1], offsets, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_matches(p1, d1.download());
    expect_matches(p2, d2.download());
  }
}

class GroupedGemmRun : public GpuTest {};

// row_source goes with the gathering tactics only, both ways, and names the tactic.
TEST_F(GroupedGemmRun, RowSourceGoesWithTheGatheringTacticsOnly) {
  EpilogueActivation act;
  act.params.kind = activation::Kind::kSwiGLU;
  GroupedGemm gemm(GroupedShape{Elem::kBF16, 4, 256, 128, 64}, 0, act);
  const std::string plain = "sm90.coop.128x256x64.c2x1.dyn.pairs+act";
  const std::string gathering = gemm.gathering_tactic(plain);
  ASSERT_FALSE(gathering.empty());
  EXPECT_EQ(gemm.gathering_tactic(gathering), "");
  EXPECT_EQ(gemm.gathering_tactic("sm90.coop.128x128x64.c1x1+act"), "");
  EXPECT_EQ(gemm.gathering_tactic("sm90.coop.128x256x64.c2x1.dyn.pairs"), "");
  // Past kMaxGatheringWidth the gathered matrix pays (mixtral's FC1).
  GroupedGemm wide(GroupedShape{Elem::kBF16, 4, GroupedGemm::kMaxGatheringWidth + 256, 128, 64}, 0,
                   act);
  EXPECT_EQ(wide.gathering_tactic(plain), "");
  // Nor where a source row's offset in 16-byte units may pass 32 bits: the rows stay gathered.
  GroupedGemm deep(GroupedShape{Elem::kBF16, 4, 256, 7168, 1 << 23}, 0, act);
  EXPECT_EQ(deep.gathering_tactic(plain), "");
  DeviceBuffer buf(1 << 16);
  ASSERT_EQ(cudaMemset(buf.ptr, 0, buf.bytes), cudaSuccess);
  const auto* offsets = static_cast<const int32_t*>(buf.ptr);
  using Call = GroupedGemm::GemmCall;
  Call without{&gemm, buf.ptr, buf.ptr, buf.ptr, gathering};
  Status s = GroupedGemm::write_problems(&without, 1, offsets, nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find(gathering), std::string::npos) << s.message();
  Call with{&gemm, buf.ptr, buf.ptr, buf.ptr, plain};
  with.row_source = static_cast<const int32_t*>(buf.ptr);
  s = gemm.launch(with, offsets, nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row_source"), std::string::npos) << s.message();
}

TEST_F(GroupedGemmRun, HeuristicPicksBuiltTacticsAndUnknownNamesAreNotFound) {
  for (Elem elem : {Elem::kBF16, Elem::kFP16}) {
    const std::vector<std::string> names = tactic_names(elem);
    GroupedGemm gemm(GroupedShape{elem, 4, 64, 64, 32}, 0);
    for (double hint : {0.0, 0.06, 1.0, 5.0, 13.0, 30.0, 100.0, 1000.0, 1e6, -1.0, std::nan("")}) {
      const std::string t = gemm.pick_tactic(hint);
      EXPECT_NE(std::find(names.begin(), names.end(), t), names.end()) << t << " for " << hint;
    }
    DeviceBuffer buf(1 << 16);
    const Status s = gemm.run(buf.ptr, buf.ptr, buf.ptr, static_cast<const int32_t*>(buf.ptr), 1,
                              nullptr, "sm90.coop.1x1x1.c9x9");
    EXPECT_EQ(s.code(), ErrorCode::kNotFound);
    EXPECT_NE(s.message().find("sm90.coop.1x1x1.c9x9"), std::string::npos);
    const Status misaligned =
        gemm.run(static_cast<char*>(buf.ptr) + 2, buf.ptr, buf.ptr,
                 static_cast<const int32_t*>(buf.ptr), 1, nullptr, names.front());
    EXPECT_EQ(misaligned.code(), ErrorCode::kInvalidArgument);
    EXPECT_GT(gemm.workspace_bytes(), 0u);
  }
  // max_rows 0: nothing to compute, nothing launched, still ok.
  GroupedGemm empty(GroupedShape{Elem::kBF16, 3, 64, 64, 0}, 0);
  DeviceBuffer offsets(16);
  ASSERT_EQ(cudaMemset(offsets.ptr, 0, 16), cudaSuccess);
  for (const auto& t : tactic_names(Elem::kBF16))
    EXPECT_TRUE(empty
                    .run(nullptr, offsets.ptr, nullptr, static_cast<const int32_t*>(offsets.ptr), 0,
                         nullptr, t)
                    .ok())
        << t;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The dynamic tile order (sm90_dynamic_scheduler.cuh) starts afresh every run: its counters are
// cleared by the last block of the run before, after a run where most blocks return at once
// (fewer tiles than SMs) as after one where they draw tiles. Small enough for the sanitizers
// (scripts/device.sh runs every GPU test under compute-sanitizer's four tools).
class GroupedGemmSanitizer : public GpuTest {};

// The bf16 tactics whose names contain `part` (".dyn", ".pairs").
std::vector<std::string> bf16_tactics_with(const std::string& part) {
  std::vector<std::string> out;
  for (const auto& t : tactic_names(Elem::kBF16))
    if (t.find(part) != std::string::npos) out.push_back(t);
  return out;
}

TEST_F(GroupedGemmSanitizer, DynamicTileOrderStartsAfreshEveryRun) {
  const std::vector<std::string> dynamic = bf16_tactics_with(".dyn");
  if (dynamic.empty()) GTEST_SKIP() << "no dynamic-order tactic in this build";
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0xd15c));
  const int64_t n = 2048, k = 256;
  std::vector<int> few(8, 0), many(8, 300);  // 8 tiles; 192 tiles (300 rows: 3 x 128-row tiles)
  few[3] = 5;
  const Problem pf = make_problem(Elem::kBF16, n, k, few, rng);
  const Problem pm = make_problem(Elem::kBF16, n, k, many, rng);
  DeviceProblem df(pf), dm(pm);
  GroupedGemm gemm(GroupedShape{Elem::kBF16, 8, n, k, pm.max_rows}, 0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const auto& tactic : dynamic)
    for (int round = 0; round < 3; ++round)
      for (const bool big : {false, true}) {
        SCOPED_TRACE(tactic + (big ? " 192 tiles" : " 8 tiles") + ", round " +
                     std::to_string(round));
        const Problem& p = big ? pm : pf;
        const std::vector<uint16_t> out = run_poisoned(gemm, big ? dm : df, p, tactic, stream);
        ASSERT_FALSE(out.empty());
        expect_matches(p, out);
      }
  cudaStreamDestroy(stream);
}

// Runs each tactic twice on p (poisoned output, checked against the CPU reference).
void expect_each_matches_twice(const std::vector<std::string>& tactics, const Problem& p) {
  DeviceProblem dp(p);
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const auto& tactic : tactics)
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(tactic + ", round " + std::to_string(round));
      const std::vector<uint16_t> out = run_poisoned(gemm, dp, p, tactic, stream);
      ASSERT_FALSE(out.empty());
      expect_matches(p, out);
    }
  cudaStreamDestroy(stream);
}

// Every gathering pair tactic (each tile width built) with SwiGLU (FC1 reading its rows by
// index), twice on `p` against the host's gated reference; false where this build has none.
bool expect_gathering_pairs_match_twice(const Problem& p, std::mt19937& rng) {
  EpilogueActivation act;
  act.params.kind = activation::Kind::kSwiGLU;
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0, act);
  std::vector<std::string> tactics;
  for (const auto& t : bf16_tactics_with(".pairs"))
    if (t.find('+') == std::string::npos && t.find(".gather") == std::string::npos) {
      const std::string gathering = gemm.gathering_tactic(t + "+act");
      if (!gathering.empty()) tactics.push_back(gathering);
    }
  if (tactics.empty()) return false;
  const Problem want = gated_reference(p, act.params, {});
  DeviceProblem dp(p);
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamCreate failed";
    return true;
  }
  for (const auto& tactic : tactics)
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(tactic + ", round " + std::to_string(round));
      std::vector<uint16_t> out = run_gathered(gemm, dp, p, tactic, rng, stream);
      if (out.empty()) {  // a failed launch or a fault in the kernel (run_gathered's sync)
        ADD_FAILURE() << "no output";
        break;
      }
      out.resize(static_cast<std::size_t>(p.max_rows * want.n));
      expect_matches(want, out);
    }
  cudaStreamDestroy(stream);
  return true;
}

// The 2x1 pair tiles under the sanitizers: pairs, singles and the empty tiles beside a single
// in an odd last column pair (7 column tiles): weights multicast between the blocks of a
// cluster, and loaded alone.
TEST_F(GroupedGemmSanitizer, ClusterPairsSinglesAndEmptyTiles) {
  const std::vector<std::string> pairs = bf16_tactics_with(".pairs");
  if (pairs.empty()) GTEST_SKIP() << "no pair-tile tactic in this build";
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x9a15));
  const int64_t n = 1792, k = 128;
  const std::vector<int> rows = {0, 1, 129, 256, 300, 64};  // row tiles 0, 1, 2, 2, 3, 1
  const Problem p = make_problem(Elem::kBF16, n, k, rows, rng);
  expect_each_matches_twice(pairs, p);
}

// The pairs reading A's rows by index (cp.async into the swizzled stages, arriving on the
// stage's barrier beside the weights' TMA): pairs, singles, an empty tile, last tiles of 1 and
// 44 rows, and a ragged k (200: the last k block's chunks past k are zeros).
TEST_F(GroupedGemmSanitizer, PairsGatherTheirRowsByIndex) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6a7e));
  const int64_t n = 768, k = 200;  // 3 column tiles: a single's second column is empty
  const Problem p = make_problem(Elem::kBF16, n, k, {0, 1, 129, 256, 300, 64}, rng);
  if (!expect_gathering_pairs_match_twice(p, rng)) GTEST_SKIP() << "no gathering tactic here";
}

// One k block per unit, which bounds the leader's lead over its partner the least, and ~18
// units per cluster (66 clusters on an H200), so each cluster's mailbox (16 slots) wraps: a slot
// overwritten before its partner read it would trap or hang here. Nearly every unit changes
// group, so the load warp rewrites its tensormaps at nearly every tile (racecheck found the pair
// load's missing warp sync this way).
TEST_F(GroupedGemmSanitizer, ClusterPairMailboxWrapsAtOneKBlockPerUnit) {
  const std::vector<std::string> pairs = bf16_tactics_with(".pairs");
  if (pairs.empty()) GTEST_SKIP() << "no pair-tile tactic in this build";
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x3a11));
  const int64_t n = 4096, k = 64;
  // 16 column tiles: 140 one-row experts of 8 single units each, 4 of 300 rows (3 row tiles: 16
  // pair units and 8 single units): 1216 units.
  std::vector<int> rows(144, 1);
  for (size_t e = 0; e < rows.size(); e += 36) rows[e] = 300;
  // CUTLASS's own tile order beside them: the same group change at nearly every tile.
  std::vector<std::string> tactics = pairs;
  tactics.push_back("sm90.coop.128x128x64.c1x1");
  const Problem p = make_problem(Elem::kBF16, n, k, rows, rng);
  expect_each_matches_twice(tactics, p);
}

// Idle halves over many stages: most tiles end at or before row 64 (tails of 1, 20 and 64
// rows, with and without full tiles before them), so their second warp group waits for and
// releases 32 stages a tile without MMAs; 65 and 192 rows keep both busy. An idle group's warps
// meet before each release: a warp that fell a ring behind hung the forward (H200, 2026-12-02).
TEST_F(GroupedGemmRun, PairIdleHalvesOverManyStages) {
  const std::vector<std::string> pairs = bf16_tactics_with(".pairs");
  if (pairs.empty()) GTEST_SKIP() << "no pair-tile tactic in this build";
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x1d1e));
  const int64_t n = 512, k = 2048;  // 2 column tiles: every single unit fills both blocks
  const int cycle[] = {20, 64, 1, 150, 65, 192};
  std::vector<int> rows(132);
  for (std::size_t e = 0; e < rows.size(); ++e) rows[e] = cycle[e % 6];
  const Problem p = make_problem(Elem::kBF16, n, k, rows, rng);
  expect_each_matches_twice(pairs, p);
  expect_gathering_pairs_match_twice(p, rng);  // where this build has the gathering tactic
}

// The last column tile with 64 (n 320) or 128 (n 384) of its 256 columns in the group (80 or 144
// of the 240-wide tile's) runs whole MMAs on the weights' zero-filled rows past n, with idle
// halves beside it. The pairs' staged store (Sm90PairStoreEpilogue) drops the columns past n: at
// n 320 its second 128-column pass lies wholly past n.
TEST_F(GroupedGemmRun, PairNarrowColumnTiles) {
  const std::vector<std::string> pairs = bf16_tactics_with(".pairs");
  if (pairs.empty()) GTEST_SKIP() << "no pair-tile tactic in this build";
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x7a11));
  for (int64_t n : {320, 384}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const Problem p = make_problem(Elem::kBF16, n, 512, {20, 64, 1, 150, 65, 192, 0, 300}, rng);
    expect_each_matches_twice(pairs, p);
    expect_gathering_pairs_match_twice(p, rng);
  }
}

// Between 1 and 4 rows per expert the TMA GEMV is picked only for small experts (an expert's
// matrix up to 8 MB: qwen3's FC1 and FC2), where it measured faster than swap-AB (H200,
// 2026-11-30); gpt-oss's experts keep swap-AB, and so does qwen3 past 4 rows.
TEST_F(GroupedGemmRun, PickTakesTheGemvForSmallExpertsUpToFourRows) {
  const GroupedGemm qwen3_fc1(GroupedShape{Elem::kBF16, 128, 1536, 2048, 512}, 0);
  const GroupedGemm qwen3_fc2(GroupedShape{Elem::kBF16, 128, 2048, 768, 512}, 0);
  const GroupedGemm gpt_oss_fc1(GroupedShape{Elem::kBF16, 128, 5760, 2880, 256}, 0);
  for (double h : {2.0, 4.0}) {
    EXPECT_EQ(qwen3_fc1.pick_tactic(h), "sm90.gemv.tma64") << h;
    EXPECT_EQ(qwen3_fc2.pick_tactic(h), "sm90.gemv.tma64") << h;
    EXPECT_NE(gpt_oss_fc1.pick_tactic(h).find("swapab"), std::string::npos) << h;
  }
  EXPECT_NE(qwen3_fc1.pick_tactic(8.0).find("swapab"), std::string::npos);
}

// The 2-per-SM TMA GEMV (.s12) where blocks take over 3 items per SM (deepseek at T=1: FC1 3.8,
// FC2 6.7), or where its items are long (k > 2400) and it takes them in no more waves (gpt-oss's
// FC2 at T=1, 1.3); chained, where an expert's FC1 + FC2 pass 24 MB (gpt-oss at T=8), the same
// variant for both GEMMs. tma64 for short items (qwen3 at T=1, also chained at T=8), where .s12
// would add a wave (gpt-oss's FC1 at T=1, 2.7), under one item per SM (mixtral's FC2, 0.9);
// swap-AB for deepseek's FC1 at T=8 (~1.7 GB), unless chained (H200, 2026-12-01). Chained at one
// token only where FC1 has over 3 items per SM: deepseek (3.9) and mixtral (6.8), not gpt-oss (2.7)
// or qwen3 (1.5).
TEST_F(GroupedGemmRun, PickTakesTheTwoPerSmGemvWhereItMeasuredFaster) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  if (sms != 132)
    GTEST_SKIP() << "the wave counts assume 132 SMs (an H100/H200 SXM); this has " << sms;
  const GroupedGemm deepseek_fc1(GroupedShape{Elem::kBF16, 256, 4096, 7168, 64}, 0);
  const GroupedGemm deepseek_fc2(GroupedShape{Elem::kBF16, 256, 7168, 2048, 64}, 0);
  const GroupedGemm gpt_oss_fc1(GroupedShape{Elem::kBF16, 128, 5760, 2880, 64}, 0);
  const GroupedGemm gpt_oss_fc2(GroupedShape{Elem::kBF16, 128, 2880, 2880, 64}, 0);
  const GroupedGemm mixtral_fc2(GroupedShape{Elem::kBF16, 8, 4096, 14336, 64}, 0);
  const GroupedGemm qwen3_fc1(GroupedShape{Elem::kBF16, 128, 1536, 2048, 64}, 0);
  const GroupedGemm qwen3_fc2(GroupedShape{Elem::kBF16, 128, 2048, 768, 64}, 0);
  EXPECT_EQ(deepseek_fc1.pick_tactic(8.0 / 256), "sm90.gemv.tma64.s12");
  EXPECT_EQ(deepseek_fc2.pick_tactic(8.0 / 256), "sm90.gemv.tma64.s12");
  EXPECT_EQ(gpt_oss_fc2.pick_tactic(4.0 / 128), "sm90.gemv.tma64.s12");
  EXPECT_EQ(gpt_oss_fc1.pick_tactic(4.0 / 128), "sm90.gemv.tma64");
  for (const GroupedGemm* g : {&gpt_oss_fc1, &gpt_oss_fc2})
    EXPECT_EQ(g->pick_tactic(32.0 / 128, true), "sm90.gemv.tma64.s12");
  for (const GroupedGemm* g : {&qwen3_fc1, &qwen3_fc2}) {
    EXPECT_EQ(g->pick_tactic(8.0 / 128), "sm90.gemv.tma64");
    EXPECT_EQ(g->pick_tactic(64.0 / 128, true), "sm90.gemv.tma64");
  }
  EXPECT_EQ(mixtral_fc2.pick_tactic(2.0 / 8), "sm90.gemv.tma64");
  EXPECT_EQ(deepseek_fc1.pick_tactic(64.0 / 256), "sm90.swapab.128x16x128.c1x1");
  EXPECT_EQ(deepseek_fc1.pick_tactic(64.0 / 256, true), "sm90.gemv.tma64.s12");
  const GroupedGemm mixtral_fc1(GroupedShape{Elem::kBF16, 8, 28672, 4096, 64}, 0);
  EXPECT_TRUE(deepseek_fc1.chains_one_token(8));
  EXPECT_TRUE(mixtral_fc1.chains_one_token(2));
  EXPECT_FALSE(gpt_oss_fc1.chains_one_token(4));
  EXPECT_FALSE(qwen3_fc1.chains_one_token(8));
  // Chained, FC1 (with its activation) and FC2 pick the same variant: they run as one kernel.
  // H 2048, I 1408: FC1's matrix 11.5 MB, FC2's 5.8, the pair 17.3 MB (tma64); H 4096, I 1536:
  // 25 and 12.6 MB, the pair 37.7 (.s12).
  for (const auto& [h, i, pick] :
       {std::tuple{2048, 1408, "sm90.gemv.tma64"}, std::tuple{4096, 1536, "sm90.gemv.tma64.s12"}}) {
    const GroupedGemm fc1(GroupedShape{Elem::kBF16, 64, 2 * i, h, 64}, 0, EpilogueActivation{});
    const GroupedGemm fc2(GroupedShape{Elem::kBF16, 64, h, i, 64}, 0);
    EXPECT_EQ(fc1.pick_tactic(16.0 / 64, true), std::string(pick) + "+act") << h << "x" << i;
    EXPECT_EQ(fc2.pick_tactic(16.0 / 64, true), pick) << h << "x" << i;
  }
}

// At prefill FC1 (with its activation) and FC2 take the 2x1 pair tile (forward A/Bs, H200,
// 2026-12-01); gpt-oss's FC1 (n 5760) and FC2 (n 2880) its 240-wide form where the build has it (it
// pads fewer columns there), else the 256-wide one.
TEST_F(GroupedGemmRun, PickTakesClusterPairsAtPrefill) {
  const auto names = tactic_names(Elem::kBF16);
  const std::string oss_pairs =
      std::find(names.begin(), names.end(), "sm90.coop.128x240x64.c2x1.dyn.pairs") != names.end()
          ? "sm90.coop.128x240x64.c2x1.dyn.pairs"
          : "sm90.coop.128x256x64.c2x1.dyn.pairs";
  const GroupedGemm fc1(GroupedShape{Elem::kBF16, 256, 4096, 7168, 4096}, 0, EpilogueActivation{});
  const GroupedGemm fc2(GroupedShape{Elem::kBF16, 256, 7168, 2048, 4096}, 0);
  const GroupedGemm gpt_oss_fc1(GroupedShape{Elem::kBF16, 128, 5760, 2880, 4096}, 0,
                                EpilogueActivation{});
  const GroupedGemm gpt_oss_fc2(GroupedShape{Elem::kBF16, 128, 2880, 2880, 4096}, 0);
  for (double h : {64.0, 512.0}) {
    EXPECT_EQ(fc1.pick_tactic(h), "sm90.coop.128x256x64.c2x1.dyn.pairs+act") << h;
    EXPECT_EQ(fc2.pick_tactic(h), "sm90.coop.128x256x64.c2x1.dyn.pairs") << h;
    EXPECT_EQ(gpt_oss_fc1.pick_tactic(h), oss_pairs + "+act") << h;
    EXPECT_EQ(gpt_oss_fc2.pick_tactic(h), oss_pairs) << h;
  }
}

// Constructing a GroupedGemm of `shape` (with `act`) throws `code`, naming `value`.
void expect_refused(const GroupedShape& shape, const std::optional<EpilogueActivation>& act,
                    ErrorCode code, const std::string& value) {
  SCOPED_TRACE("value " + value);
  try {
    GroupedGemm g(shape, 0, act);
    ADD_FAILURE() << "accepted a bad shape or activation";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(value), std::string::npos) << e.what();
  }
}

// Host-only: bad shapes are refused before any CUDA call, so this runs without a GPU too.
TEST(GroupedGemmShape, BadShapesAreRefusedWithTheValue) {
  struct Case {
    GroupedShape shape;
    ErrorCode code;
    const char* value;
  };
  const std::vector<Case> cases = {
      {{Elem::kBF16, 8, 1001, 2048, 64}, ErrorCode::kUnsupported, "1001"},
      {{Elem::kBF16, 8, 1536, 2044, 64}, ErrorCode::kUnsupported, "2044"},
      {{Elem::kFP16, 0, 1536, 2048, 64}, ErrorCode::kInvalidArgument, "0"},
      {{Elem::kFP16, 8, 0, 2048, 64}, ErrorCode::kInvalidArgument, "0"},
      {{Elem::kBF16, 8, 1536, -8, 64}, ErrorCode::kInvalidArgument, "-8"},
      {{Elem::kBF16, 8, 1536, 2048, -1}, ErrorCode::kInvalidArgument, "-1"},
      {{static_cast<Elem>(7), 8, 1536, 2048, 64}, ErrorCode::kInvalidArgument, "7"},
  };
  for (const auto& c : cases) expect_refused(c.shape, std::nullopt, c.code, c.value);
}

TEST(GroupedGemmShape, BadEpilogueActivationIsRefusedWithTheValue) {
  EpilogueActivation plain;  // not gated
  plain.params.kind = activation::Kind::kSiLU;
  expect_refused(GroupedShape{Elem::kBF16, 8, 1536, 2048, 64}, plain, ErrorCode::kInvalidArgument,
                 "5");
  // n = 1000: gate and up rows do not pair up for the fused gated activation
  expect_refused(GroupedShape{Elem::kBF16, 8, 1000, 2048, 64}, EpilogueActivation{},
                 ErrorCode::kUnsupported, "1000");
}

TEST(GroupedGemmShape, WriteProblemsRefusesBadCallLists) {
  GroupedGemm::GemmCall calls[3];
  const Status too_many = GroupedGemm::write_problems(calls, 3, nullptr, nullptr);
  EXPECT_EQ(too_many.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("3"), std::string::npos) << too_many.message();
  const Status no_gemm = GroupedGemm::write_problems(calls, 1, nullptr, nullptr);
  EXPECT_EQ(no_gemm.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(GroupedGemm::write_problems(calls, 0, nullptr, nullptr).ok());
}

// Host-only: the registration pairs every kernel with its "+act" kernel, same kind.
TEST(GroupedGemmShape, EveryTacticHasAnActivationKernel) {
  for (Elem elem : {Elem::kBF16, Elem::kFP16}) {
    const std::vector<detail::TacticEntry> all = detail::all_tactics(elem);
    int stores = 0;
    for (const auto& e : all) {
      if (e.applies_activation) continue;
      ++stores;
      const auto act = std::find_if(all.begin(), all.end(), [&](const detail::TacticEntry& x) {
        return x.name == e.name + "+act";
      });
      ASSERT_NE(act, all.end()) << e.name;
      EXPECT_TRUE(act->applies_activation) << act->name;
      EXPECT_EQ(act->kind, e.kind) << act->name;
      EXPECT_NE(act->make, nullptr);
    }
    // The gathering kernels serve FC1 only: a "+act" kernel each, of a tile built as above.
    int gathering = 0;
    for (const auto& e : all) {
      if (e.kind != detail::TacticKind::kCutlassGather) continue;
      ++gathering;
      EXPECT_TRUE(e.applies_activation) << e.name;
      const std::size_t at = e.name.find(".gather+act");
      ASSERT_NE(at, std::string::npos) << e.name;
      const std::string plain = e.name.substr(0, at) + "+act";
      EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const detail::TacticEntry& x) {
        return x.name == plain;
      })) << e.name;
    }
    EXPECT_EQ(2 * stores + gathering, static_cast<int>(all.size()));
    EXPECT_EQ(stores, static_cast<int>(tactic_names(elem).size()));
  }
}

TEST(GroupedGemmShape, TacticNamesAreUniqueAndNamed) {
  for (Elem elem : {Elem::kBF16, Elem::kFP16}) {
    const std::vector<std::string> names = tactic_names(elem);
    const std::set<std::string> unique(names.begin(), names.end());
    EXPECT_EQ(unique.size(), names.size());
    bool gemv = false, swapab = false, prefill = false;
    for (const auto& n : names) {
      EXPECT_EQ(n.rfind("sm90.", 0), 0u) << n;
      gemv |= n.rfind("sm90.gemv.", 0) == 0;
      swapab |= n.rfind("sm90.swapab.", 0) == 0;
      prefill |= n.rfind("sm90.coop.", 0) == 0;
    }
    EXPECT_TRUE(gemv && swapab && prefill) << "a family is missing for " << elem_name(elem);
  }
}

}  // namespace
}  // namespace moekit::gemm
