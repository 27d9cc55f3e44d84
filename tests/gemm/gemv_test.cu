// Over 800 lines: one fixture's cases over every GEMV tactic and launch (PDL, chained, sliced).
// The GEMV tactics under programmatic dependent launch: launched as the dependent of a slow
// kernel that writes their offsets and activations (and lets them start at once), they must
// wait for it, eagerly and inside a graph; outputs poisoned (NaN) before each run, compared
// with a CPU reference. MOEKIT_GEMV_TIMING=1 also times every GEMV tactic and the tactic
// GroupedGemm::pick_tactic chooses on the decode shapes of the four presets
// (L2 flushed before each run) and prints the achieved weight bandwidth.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "finalize/finalize.hpp"
#include "gemm/grouped_gemm.hpp"
#include "pipeline/pdl.cuh"
#include "support/gemm_problem.hpp"
#include "support/gpu.hpp"
#include "support/pdl_writer.cuh"

namespace moekit::gemm {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

float value(uint16_t u) { return from_bits(DType::kBFloat16, u); }

std::vector<std::string> gemv_tactics() {
  std::vector<std::string> v;
  for (const auto& n : tactic_names(Elem::kBF16))
    if (n.rfind("sm90.gemv.", 0) == 0) v.push_back(n);
  return v;
}

using Problem = GemmProblem;

// The reference D [rows, n] of p's inputs (double sums).
void compute_reference(Problem& p) {
  const int64_t n = p.n, k = p.k;
  p.ref.assign(static_cast<std::size_t>(p.rows * n), 0.f);
  for (int g = 0; g < p.groups; ++g)
    for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r)
      for (int64_t i = 0; i < n; ++i) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          s += double(value(p.a_bits[r * k + kk])) * value(p.w_bits[(g * n + i) * k + kk]);
        p.ref[r * n + i] = float(s);
      }
}

// bf16 inputs and their reference.
Problem make_problem(int64_t n, int64_t k, const std::vector<int>& counts, std::mt19937& rng) {
  Problem p = make_gemm_inputs(Elem::kBF16, n, k, counts, rng);
  compute_reference(p);
  return p;
}

// Relative error below 1e-2, every output of the rows written, nothing past them.
void expect_matches(const Problem& p, const std::vector<uint16_t>& out) {
  double diff = 0, norm = 0;
  int64_t nan = 0, stray = 0;
  for (int64_t i = 0; i < p.rows * p.n; ++i) {
    const float v = value(out[i]);
    if (std::isnan(v)) {
      ++nan;
      continue;
    }
    diff += double(v - p.ref[i]) * double(v - p.ref[i]);
    norm += double(p.ref[i]) * double(p.ref[i]);
  }
  for (std::size_t i = static_cast<std::size_t>(p.rows * p.n); i < out.size(); ++i)
    stray += out[i] != 0xffff;
  EXPECT_EQ(nan, 0) << "unwritten (NaN) outputs";
  EXPECT_EQ(stray, 0) << "outputs written past row " << p.rows;
  if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), 1e-2);
}

// Lets its dependent start at once, spins ~`ns`, then copies the real offsets and activations
// over the stale ones.
__global__ void slow_writer(int32_t* off, const int32_t* src_off, int n_off, uint4* a,
                            const uint4* src_a, int64_t a_vecs, long long ns) {
  launch_dependents_then_spin(ns);
  for (int i = threadIdx.x; i < n_off; i += blockDim.x) off[i] = src_off[i];
  for (int64_t i = threadIdx.x; i < a_vecs; i += blockDim.x) a[i] = src_a[i];
}

// The permute's case at T=1 (OffsetsFinal::kAtFlag): lets its dependent start at once, spins
// ~`ns`, writes the offsets, sets the flag, spins ~`ns` again, then writes the activations.
__global__ void flagging_writer(int32_t* off, const int32_t* src_off, int n_off, uint32_t* flag,
                                uint4* a, const uint4* src_a, int64_t a_vecs, long long ns) {
  launch_dependents_then_spin(ns);
  for (int i = threadIdx.x; i < n_off; i += blockDim.x) off[i] = src_off[i];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) pipeline::store_release(flag, 1u);
  spin_ns(ns);
  for (int64_t i = threadIdx.x; i < a_vecs; i += blockDim.x) a[i] = src_a[i];
}

class GemvPdl : public GpuTest {};

TEST_F(GemvPdl, WaitsForThePreviousKernel) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e02));
  const Problem p = make_problem(128, 256, {3, 0, 9, 1}, rng);
  const DeviceBuffer a_src(to_device(p.a_bits)), w(to_device(p.w_bits)),
      off_src(to_device(p.offsets));
  DeviceBuffer a(p.a_bits.size() * 2), off(p.offsets.size() * 4),
      d(static_cast<std::size_t>(p.max_rows * p.n) * 2);
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& t : gemv_tactics()) {
    for (bool graph : {false, true}) {
      SCOPED_TRACE(t + (graph ? " graph" : " eager"));
      ASSERT_EQ(cudaMemset(off.ptr, 0, off.bytes), cudaSuccess);  // stale: every group empty
      ASSERT_EQ(cudaMemset(a.ptr, 0xff, a.bytes), cudaSuccess);   // stale: NaN
      ASSERT_EQ(cudaMemset(d.ptr, 0xff, d.bytes), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cudaGraph_t g = nullptr;
      if (graph)
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      slow_writer<<<1, 256, 0, stream>>>(
          static_cast<int32_t*>(off.ptr), static_cast<const int32_t*>(off_src.ptr),
          static_cast<int>(p.offsets.size()), static_cast<uint4*>(a.ptr),
          static_cast<const uint4*>(a_src.ptr), static_cast<int64_t>(p.a_bits.size() / 8), 200000);
      const Status s =
          gemm.run(a.ptr, w.ptr, d.ptr, static_cast<const int32_t*>(off.ptr), 1.0, stream, t);
      ASSERT_TRUE(s.ok()) << s.message();
      if (graph) {
        ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
      }
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      expect_matches(p, to_host<uint16_t>(d.ptr, d.bytes / 2));
    }
  }
  cudaStreamDestroy(stream);
}

// Every GEMV tactic as the dependent of flagging_writer (the permute's case at T=1): the offsets
// come at the flag, the rows `a` late. With `one_row` (host, [k]) the call also names that row.
void expect_flagged_runs_match(const Problem& p, const std::vector<uint16_t>& one_row) {
  const DeviceBuffer a_src(to_device(p.a_bits)), w(to_device(p.w_bits)),
      off_src(to_device(p.offsets)), row(to_device(one_row));
  DeviceBuffer a(p.a_bits.size() * 2), off(p.offsets.size() * 4), flag(4),
      d(static_cast<std::size_t>(p.max_rows * p.n) * 2);
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& t : gemv_tactics()) {
    SCOPED_TRACE(t);
    ASSERT_EQ(cudaMemset(off.ptr, 0, off.bytes), cudaSuccess);  // stale: every group empty
    ASSERT_EQ(cudaMemset(flag.ptr, 0, flag.bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(a.ptr, 0xff, a.bytes), cudaSuccess);  // stale: NaN
    ASSERT_EQ(cudaMemset(d.ptr, 0xff, d.bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    flagging_writer<<<1, 256, 0, stream>>>(
        static_cast<int32_t*>(off.ptr), static_cast<const int32_t*>(off_src.ptr),
        static_cast<int>(p.offsets.size()), static_cast<uint32_t*>(flag.ptr),
        static_cast<uint4*>(a.ptr), static_cast<const uint4*>(a_src.ptr),
        static_cast<int64_t>(p.a_bits.size() / 8), 100000);
    GroupedGemm::GemmCall call{&gemm, a.ptr, w.ptr, d.ptr, t};
    call.offsets_flag = static_cast<const uint32_t*>(flag.ptr);
    if (!one_row.empty()) call.one_row = row.ptr;
    const Status s = gemm.launch(call, static_cast<const int32_t*>(off.ptr), stream);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_matches(p, to_host<uint16_t>(d.ptr, d.bytes / 2));
  }
  cudaStreamDestroy(stream);
}

// FC1's case at T=1: the offsets come while the previous kernel runs, announced by a flag; the
// GEMV reads them after the flag (not before: they are stale until then) and the activations
// after its wait.
TEST_F(GemvPdl, FlaggedOffsetsAreReadAfterTheFlag) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e06));
  expect_flagged_runs_match(make_problem(128, 256, {3, 0, 9, 1}, rng), {});
}

// FC1's case at one token: every row is the caller's hidden row (GemmCall::one_row), ready
// before the kernel before, which writes the gathered rows `a` late. The TMA GEMV reads the one
// row (from the flag on); the others read `a` after their wait. Both must match, also where an
// expert has the token twice or more (repeated caller ids: rows of one chunk, and past it). A
// misaligned row is refused, named.
TEST_F(GemvPdl, OneRowServesEveryRowFromTheFlag) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e08));
  Problem p = make_gemm_inputs(Elem::kBF16, 192, 320, {1, 0, 2, 1, 0, 9}, rng);
  for (int64_t r = 1; r < p.rows; ++r)  // one token's 13 slots: equal rows
    std::copy_n(p.a_bits.begin(), p.k, p.a_bits.begin() + r * p.k);
  compute_reference(p);
  const std::vector<uint16_t> row(p.a_bits.begin(), p.a_bits.begin() + p.k);
  expect_flagged_runs_match(p, row);

  const DeviceBuffer buf(to_device(p.a_bits)), off(to_device(p.offsets));
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0);
  GroupedGemm::GemmCall bad{&gemm, buf.ptr, buf.ptr, buf.ptr, gemv_tactics().front()};
  bad.one_row = static_cast<const char*>(buf.ptr) + 2;
  const Status s = gemm.launch(bad, static_cast<const int32_t*>(off.ptr), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("one activation row"), std::string::npos) << s.message();
}

// A shape built for many more rows than the run has (a server's workspace, at decode): with
// GemmCall::rows_bound, every GEMV tactic launches a grid for that many rows. Any grid serves
// (the kernels are persistent over their items), so a bound of the run's rows and one of a
// single row (one block per row tile) both match the reference, every output written, none past
// the rows. A negative bound is refused, named.
TEST_F(GemvPdl, GridBoundedByTheRunsRows) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e0c));
  Problem p = make_gemm_inputs(Elem::kBF16, 192, 320, {1, 0, 2, 1, 0, 9}, rng, 4000);
  compute_reference(p);
  const DeviceBuffer a(to_device(p.a_bits)), w(to_device(p.w_bits)), off(to_device(p.offsets));
  DeviceBuffer d(static_cast<std::size_t>(p.max_rows * p.n) * 2);
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0);
  for (const auto& t : gemv_tactics())
    for (int64_t bound : {p.rows, int64_t(1)}) {
      SCOPED_TRACE(t + " rows_bound " + std::to_string(bound));
      d.poison();
      GroupedGemm::GemmCall call{&gemm, a.ptr, w.ptr, d.ptr, t};
      call.rows_bound = bound;
      const Status s = gemm.launch(call, static_cast<const int32_t*>(off.ptr), nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expect_matches(p, to_host<uint16_t>(d.ptr, d.bytes / 2));
    }
  GroupedGemm::GemmCall bad{&gemm, a.ptr, w.ptr, d.ptr, gemv_tactics().front()};
  bad.rows_bound = -5;
  const Status s = gemm.launch(bad, static_cast<const int32_t*>(off.ptr), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rows_bound -5"), std::string::npos) << s.message();
}

// Rows in the permute's order (by expert, then token, then slot) for the slots' experts
// slot_expert [T, top_k] (-1: none): each slot's row into slot_row (left as it is for -1), each
// expert's row count into counts; returns each row's token.
std::vector<int> rows_by_expert(const std::vector<int32_t>& slot_expert, int T, int top_k,
                                int groups, std::vector<int32_t>& slot_row,
                                std::vector<int>& counts) {
  counts.assign(groups, 0);
  std::vector<int> row_token;
  for (int g = 0; g < groups; ++g)
    for (int t = 0; t < T; ++t)
      for (int s = 0; s < top_k; ++s)
        if (slot_expert[t * top_k + s] == g) {
          slot_row[t * top_k + s] = static_cast<int32_t>(row_token.size());
          row_token.push_back(t);
          ++counts[g];
        }
  return row_token;
}

// FC1 (+ its SwiGLU) and FC2 on a TMA GEMV tactic over `counts` rows per expert, with the
// buffers of two runs: y1/z1 from two launches, y2/z2 from the chained kernel or from two
// launches that take their items from counters (`x` their input).
struct ChainedCase {
  using Call = GroupedGemm::GemmCall;
  std::string tactic = "sm90.gemv.tma64";
  int64_t H, I;
  Problem p1, p2;  // p2: FC2's weights only
  int G;
  int64_t P;
  DeviceBuffer x_src, x, w1, w2, off, y1, z1, y2, z2, done;
  EpilogueActivation act;
  GroupedGemm fc1, fc2;
  ChainedCase(int64_t h, int64_t i, const std::vector<int>& counts, std::mt19937& rng)
      : H(h),
        I(i),
        p1(make_gemm_inputs(Elem::kBF16, 2 * i, h, counts, rng)),
        p2(make_gemm_inputs(Elem::kBF16, h, i, counts, rng)),
        G(p1.groups),
        P(p1.max_rows),
        x_src(to_device(p1.a_bits)),
        x(to_device(p1.a_bits)),
        w1(to_device(p1.w_bits)),
        w2(to_device(p2.w_bits)),
        off(to_device(p1.offsets)),
        y1(size_t(P) * i * 2),
        z1(size_t(P) * h * 2),
        y2(size_t(P) * i * 2),
        z2(size_t(P) * h * 2),
        done(size_t(G + 2) * 4),
        fc1(GroupedShape{Elem::kBF16, G, 2 * i, h, P}, 0, act),
        fc2(GroupedShape{Elem::kBF16, G, h, i, P}, 0) {}
  const int32_t* offsets() const { return static_cast<const int32_t*>(off.ptr); }
  // y1 and z1 by two launches (poisoned first: rows past the last expert's stay so).
  void two_launches(cudaStream_t stream) {
    for (DeviceBuffer* b : {&y1, &z1}) b->poison();
    const std::string& t = tactic;
    ASSERT_TRUE(fc1.launch(Call{&fc1, x.ptr, w1.ptr, y1.ptr, t + "+act"}, offsets(), stream).ok());
    ASSERT_TRUE(fc2.launch(Call{&fc2, y1.ptr, w2.ptr, z1.ptr, t, true}, offsets(), stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  // y2 and z2 by two launches taking their items from done[G] and done[G + 1] (after reset());
  // returns the two counters' values after the run.
  std::vector<int32_t> counted_launches(cudaStream_t stream) {
    const std::string& t = tactic;
    Call c1{&fc1, x.ptr, w1.ptr, y2.ptr, t + "+act"}, c2{&fc2, y2.ptr, w2.ptr, z2.ptr, t, true};
    c1.item_counter = static_cast<int32_t*>(done.ptr) + G;
    c2.item_counter = static_cast<int32_t*>(done.ptr) + G + 1;
    EXPECT_TRUE(fc1.launch(c1, offsets(), stream).ok());
    EXPECT_TRUE(fc2.launch(c2, offsets(), stream).ok());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto counters = to_host<int32_t>(done.ptr, size_t(G) + 2);
    return {counters[G], counters[G + 1]};
  }
  // Before each chained run (and before any kernel it is to follow: this waits for the device):
  // y2 and z2 poisoned, the counters cleared.
  void reset() {
    for (DeviceBuffer* b : {&y2, &z2}) b->poison();
    EXPECT_EQ(cudaMemset(done.ptr, 0, done.bytes), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // see DeviceBuffer::poison()
  }
  // y2 and z2 by the chained kernel (enqueued only); `second`: FC2's tactic, FC1's unless given.
  Status chained(cudaStream_t stream, bool fc1_offsets_ready, const std::string& second = {}) {
    return GroupedGemm::launch_chained(
        Call{&fc1, x.ptr, w1.ptr, y2.ptr, tactic + "+act", fc1_offsets_ready},
        Call{&fc2, y2.ptr, w2.ptr, z2.ptr, second.empty() ? tactic : second}, offsets(),
        static_cast<int*>(done.ptr), stream);
  }
  // Both ways on fresh buffers (the chained kernel after nothing: offsets ready), bit for bit,
  // and every row of FC2's output written (poisoned first).
  void expect_chained_matches_two_launches(cudaStream_t stream) {
    two_launches(stream);
    reset();
    const Status s = chained(stream, false);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(first_difference(), "");
    EXPECT_EQ(unwritten(), 0);
  }
  // The chained run as the dependent of flagging_writer (the permute's case at its flag), with
  // FC1 on the caller's rows (`one_row` or `token_rows`): x (the gathered rows, from p1.a_bits)
  // gives the reference by two launches, then is poisoned; the offsets stay stale until the
  // flag; after it the writer copies late_bytes from late_src to late_dst. Bit for bit against
  // the two launches, every row written.
  void expect_flagged_chained_matches(cudaStream_t stream, const DeviceBuffer& off_src,
                                      DeviceBuffer& flag, void* late_dst, const void* late_src,
                                      int64_t late_bytes, const void* one_row,
                                      const TokenRows& token_rows) {
    ASSERT_EQ(cudaMemcpy(x.ptr, p1.a_bits.data(), p1.a_bits.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    two_launches(stream);
    x.poison();
    ASSERT_EQ(cudaMemset(off.ptr, 0, off.bytes), cudaSuccess);  // stale: every group empty
    ASSERT_EQ(cudaMemset(flag.ptr, 0, flag.bytes), cudaSuccess);
    reset();
    flagging_writer<<<1, 256, 0, stream>>>(
        static_cast<int32_t*>(off.ptr), static_cast<const int32_t*>(off_src.ptr),
        static_cast<int>(p1.offsets.size()), static_cast<uint32_t*>(flag.ptr),
        static_cast<uint4*>(late_dst), static_cast<const uint4*>(late_src), late_bytes / 16, 20000);
    Call c1{&fc1, x.ptr, w1.ptr, y2.ptr, tactic + "+act"};
    c1.offsets_flag = static_cast<const uint32_t*>(flag.ptr);
    c1.one_row = one_row;
    c1.token_rows = token_rows;
    const Call c2{&fc2, y2.ptr, w2.ptr, z2.ptr, tactic};
    const Status s =
        GroupedGemm::launch_chained(c1, c2, offsets(), static_cast<int*>(done.ptr), stream);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(first_difference(), "");
    EXPECT_EQ(unwritten(), 0);
  }
  // Elements of FC2's output rows (z2) still poisoned.
  int64_t unwritten() const {
    const auto got_z = to_host<uint16_t>(z2.ptr, z2.bytes / 2);
    return std::count(got_z.begin(), got_z.begin() + p1.rows * H, uint16_t(0xffff));
  }
  // The first element where the chained run differs from the two launches, as row (expert) and
  // column of FC1's and FC2's outputs; empty where both are equal bit for bit.
  std::string first_difference() const {
    const auto where = [&](const DeviceBuffer& got_b, const DeviceBuffer& want_b, int64_t n,
                           const char* what) -> std::string {
      const auto got = to_host<uint16_t>(got_b.ptr, got_b.bytes / 2);
      const auto want = to_host<uint16_t>(want_b.ptr, want_b.bytes / 2);
      for (std::size_t e = 0; e < got.size(); ++e)
        if (got[e] != want[e]) {
          const int64_t row = int64_t(e) / n;
          int g = 0;
          while (g < G && p1.offsets[g + 1] <= row) ++g;
          return std::string(what) + " row " + std::to_string(row) + " (expert " +
                 std::to_string(g) + ") column " + std::to_string(int64_t(e) % n) + "; ";
        }
      return "";
    };
    return where(y2, y1, I, "FC1's activation:") + where(z2, z1, H, "FC2:");
  }
};

// FC1 (+ its activation) and FC2 as one kernel: what the two launches give, bit for bit (each
// element's sum runs in the same order); the engine tests check the chained forward against the
// CPU reference. Experts of 0, 1, 3, 9 and 17 rows (up to 3 chunks of 8), and FC2's
// activations read right after FC1 writes them, in other blocks. Every TMA GEMV variant built.
TEST_F(GemvPdl, ChainedFc1Fc2EqualsTwoLaunches) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e08));
  ChainedCase c(256, 96, {3, 0, 9, 1, 17, 0}, rng);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& t : gemv_tactics()) {
    if (t.rfind("sm90.gemv.tma", 0) != 0) continue;
    SCOPED_TRACE(t);
    c.tactic = t;
    c.expect_chained_matches_two_launches(stream);
  }
  c.tactic = "sm90.gemv.tma64";

  // Only the TMA GEMV chains, and only into itself; nothing is enqueued otherwise.
  const Status other = c.chained(stream, false, "sm90.gemv.n8");
  EXPECT_EQ(other.code(), ErrorCode::kUnsupported) << other.message();
  EXPECT_NE(other.message().find("sm90.gemv.tma64"), std::string::npos) << other.message();
  cudaStreamDestroy(stream);
}

// The engine's T=16 case (64 experts, 64 rows: many experts of 0-2 rows; H 2048, I 256) after a
// kernel that writes FC1's activations late (the gather kernel; FC1 reads settled offsets), many
// times, FC1's input, its output and FC2's poisoned before each: every run equal to the two
// launches, bit for bit. H200, 2026-11-30 saw the engine's forward at this shape 1.1% off the
// reference once in three runs (device-like numerics give 0.4%); a stale read in the chained kernel
// would show here.
TEST_F(GemvPdl, ChainedFc1Fc2RepeatedAfterALateWriter) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e09));
  std::vector<int> counts(64, 0);
  for (int r = 0; r < 64; ++r) ++counts[rng() % counts.size()];
  ChainedCase c(2048, 256, counts, rng);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  c.two_launches(stream);
  const int kRuns = sanitizer_run() ? 8 : 200;  // the tools check each run's accesses, not its luck
  int bad_runs = 0;
  for (int run = 0; run < kRuns; ++run) {
    c.x.poison();
    c.reset();  // before the writer: it waits for the device
    slow_writer<<<1, 256, 0, stream>>>(
        nullptr, nullptr, 0, static_cast<uint4*>(c.x.ptr), static_cast<const uint4*>(c.x_src.ptr),
        static_cast<int64_t>(c.p1.a_bits.size() / 8), (run % 4) * 5000);
    const Status s = c.chained(stream, true);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::string diff = c.first_difference();
    if (!diff.empty() && ++bad_runs <= 3) ADD_FAILURE() << "run " << run << ": " << diff;
  }
  EXPECT_EQ(bad_runs, 0) << "of " << kRuns << " runs";
  cudaStreamDestroy(stream);
}

// For compute-sanitizer (scripts/device.sh runs every GPU test under its four tools): the
// chained kernel once, with its blocks taking more items than its item ring has slots (256
// experts of one row: 6144 items, ~15 per block on 132 SMs, the ring 8), so that the ring's slots
// are written again after the consumers read them. Racecheck saw that reuse as a race while every
// consumer lane read the slot (H200, 2026-12-01); the two-launch result must match bit for bit.
class GemvPdlSanitizer : public GpuTest {};

TEST_F(GemvPdlSanitizer, ChainedItemRingWraps) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e0a));
  ChainedCase c(1024, 256, std::vector<int>(256, 1), rng);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const char* t : {"sm90.gemv.tma64", "sm90.gemv.tma64.s12"}) {  // the engine's two picks
    SCOPED_TRACE(t);
    c.tactic = t;
    c.expect_chained_matches_two_launches(stream);
  }
  cudaStreamDestroy(stream);
}

// The chained kernel at one token (the engine's case where FC1 has many items): FC1 reads the
// caller's row (GemmCall::one_row) from the permute's flag on, and FC2 stores into the gathered
// rows' memory, which the permute writes after the flag. flagging_writer stands in for it: the
// stale offsets (every expert empty) until the flag, then, late, junk over FC2's output. So FC1
// must wait for the flag, never read `x` (poisoned), and FC2's stores must follow the writer:
// bit for bit the two launches' result, every row written. Experts of 1, 2 and 9 rows (repeated
// caller ids: copies of the one row). For the sanitizers too (its spins are short).
TEST_F(GemvPdlSanitizer, ChainedOneRowFromTheFlag) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e0d));
  ChainedCase c(256, 96, {1, 0, 2, 1, 0, 9}, rng);
  for (int64_t r = 1; r < c.p1.rows; ++r)  // one token's slots: equal rows
    std::copy_n(c.p1.a_bits.begin(), c.H, c.p1.a_bits.begin() + r * c.H);
  const DeviceBuffer row(
      to_device(std::vector<uint16_t>(c.p1.a_bits.begin(), c.p1.a_bits.begin() + c.H))),
      off_src(to_device(c.p1.offsets));
  DeviceBuffer flag(4), junk(c.z2.bytes);
  junk.poison();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const char* t : {"sm90.gemv.tma64", "sm90.gemv.tma64.s12"}) {
    SCOPED_TRACE(t);
    c.tactic = t;
    // Late, junk over FC2's output: its stores must wait for the writer's end.
    c.expect_flagged_chained_matches(stream, off_src, flag, c.z2.ptr, junk.ptr,
                                     static_cast<int64_t>(c.z2.bytes), row.ptr, TokenRows{});
  }
  cudaStreamDestroy(stream);
}

// One token's FC1 and FC2 in slices of the intermediate (GroupedGemm::launch_sliced), as the
// dependent of flagging_writer (stale offsets until the flag), with the gathered rows poisoned
// (it reads the caller's row) and its partials poisoned first. The slices' partials of each row,
// added up, against FC2's output by two launches (rounded to bf16 there: within 1e-2, not bit for
// bit); every partial of the run's rows written, the rows past them untouched. I 96: the last
// slice has one FC1 box (the next is not loaded); H 264 and I 104: the last FC2 box and the last
// FC1 box are partial (gate rows past the expert's give zeros); I 128: whole slices.
TEST_F(GemvPdlSanitizer, SlicedOneRowFromTheFlag) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e10));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& [h, i] : {std::pair<int64_t, int64_t>{256, 96}, {264, 104}, {136, 128}}) {
    ChainedCase c(h, i, {1, 0, 1, 1, 0, 1}, rng);
    for (int64_t r = 1; r < c.p1.rows; ++r)  // one token's slots: equal rows
      std::copy_n(c.p1.a_bits.begin(), c.H, c.p1.a_bits.begin() + r * c.H);
    const DeviceBuffer row(
        to_device(std::vector<uint16_t>(c.p1.a_bits.begin(), c.p1.a_bits.begin() + c.H))),
        off_src(to_device(c.p1.offsets));
    DeviceBuffer flag(4);
    const int64_t slices = c.fc1.slices(), rows = c.p1.rows;
    ASSERT_EQ(slices, (i + 63) / 64);
    DeviceBuffer partials(static_cast<std::size_t>((rows + 1) * slices * h) * 4);
    for (const char* t : {"sm90.gemv.tma64", "sm90.gemv.tma64.s12"}) {
      SCOPED_TRACE(std::string(t) + " H " + std::to_string(h) + " I " + std::to_string(i));
      c.tactic = t;
      ASSERT_EQ(
          cudaMemcpy(c.x.ptr, c.p1.a_bits.data(), c.p1.a_bits.size() * 2, cudaMemcpyHostToDevice),
          cudaSuccess);
      c.two_launches(stream);
      c.x.poison();
      partials.poison();
      ASSERT_EQ(cudaMemset(c.off.ptr, 0, c.off.bytes), cudaSuccess);  // stale: every group empty
      ASSERT_EQ(cudaMemset(flag.ptr, 0, flag.bytes), cudaSuccess);
      c.reset();
      flagging_writer<<<1, 256, 0, stream>>>(
          static_cast<int32_t*>(c.off.ptr), static_cast<const int32_t*>(off_src.ptr),
          static_cast<int>(c.p1.offsets.size()), static_cast<uint32_t*>(flag.ptr), nullptr, nullptr,
          0, 20000);
      GroupedGemm::GemmCall c1{&c.fc1, c.x.ptr, c.w1.ptr, c.y2.ptr, c.tactic + "+act"};
      c1.offsets_flag = static_cast<const uint32_t*>(flag.ptr);
      c1.one_row = row.ptr;
      const Status s =
          GroupedGemm::launch_sliced(c1, c.w2.ptr, partials.as<float>(),
                                     static_cast<int*>(c.done.ptr) + c.G, c.offsets(), stream);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto parts = to_host<float>(partials.ptr, partials.bytes / 4);
      const auto z1 = to_host<uint16_t>(c.z1.ptr, static_cast<std::size_t>(rows * h));
      double diff = 0, norm = 0;
      int64_t nan = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = 0; col < h; ++col) {
          double sum = 0;
          for (int64_t sl = 0; sl < slices; ++sl) {
            const float v = parts[(r * slices + sl) * h + col];
            nan += std::isnan(v);
            sum += v;
          }
          const double want = value(z1[r * h + col]);
          diff += (sum - want) * (sum - want);
          norm += want * want;
        }
      EXPECT_EQ(nan, 0) << "partials not written";
      EXPECT_LT(std::sqrt(diff / norm), 1e-2);
      const int64_t past = std::count_if(parts.begin() + rows * slices * h, parts.end(),
                                         [](float v) { return !std::isnan(v); });
      EXPECT_EQ(past, 0) << "partials written past row " << rows;
    }
  }
  // Only FC1's tma64 variants with their activation run sliced, and only on one row at the flag.
  ChainedCase c(256, 96, {1, 0, 1}, rng);
  DeviceBuffer partials(static_cast<std::size_t>(3 * c.fc1.slices() * 256) * 4);
  GroupedGemm::GemmCall c1{&c.fc1, c.x.ptr, c.w1.ptr, c.y2.ptr, "sm90.gemv.n8+act"};
  Status s = GroupedGemm::launch_sliced(c1, c.w2.ptr, partials.as<float>(),
                                        static_cast<int*>(c.done.ptr) + c.G, c.offsets(), stream);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.message();
  EXPECT_NE(s.message().find("sm90.gemv.n8+act"), std::string::npos) << s.message();
  c1.tactic = "sm90.gemv.tma64+act";
  s = GroupedGemm::launch_sliced(c1, c.w2.ptr, partials.as<float>(),
                                 static_cast<int*>(c.done.ptr) + c.G, c.offsets(), stream);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("one row"), std::string::npos) << s.message();
  cudaStreamDestroy(stream);
}

// The engine's tactic for one token's sliced forward (GroupedGemm::sliced_tactic): tma64 with
// FC1's activation for every shape, whatever pick_tactic() runs there otherwise (mixtral's FC1:
// swap-AB); none for a GEMM without an activation. Only tma64's "+act" kernels run sliced.
TEST_F(GemvPdl, SlicedTacticIsTma64WithTheActivation) {
  EpilogueActivation act;
  GroupedGemm qwen3(GroupedShape{Elem::kBF16, 128, 1536, 2048, 8}, 0, act);
  EXPECT_EQ(qwen3.sliced_tactic(), "sm90.gemv.tma64+act");
  EXPECT_TRUE(qwen3.runs_sliced("sm90.gemv.tma64.s12+act"));
  EXPECT_FALSE(qwen3.runs_sliced("sm90.gemv.n8+act"));
  EXPECT_FALSE(qwen3.runs_sliced("sm90.gemv.tma64"));
  GroupedGemm mixtral(GroupedShape{Elem::kBF16, 8, 28672, 4096, 8}, 0, act);
  EXPECT_NE(mixtral.pick_tactic(2.0 / 8), "sm90.gemv.tma64+act");
  EXPECT_EQ(mixtral.sliced_tactic(), "sm90.gemv.tma64+act");
  GroupedGemm fc2(GroupedShape{Elem::kBF16, 128, 2048, 768, 8}, 0);
  EXPECT_EQ(fc2.sliced_tactic(), "");
}

// 2 to 8 tokens (GemmCall::token_rows, the permute's case with no gather): FC1 of the chained
// kernel reads the tokens' own rows from the flag on and stores each token's product at its
// slots' rows, which the writer publishes only late, after the flag (as the permute's end); the
// gathered rows are poisoned. Equal bit for bit to two launches on the gathered rows, every row
// written: T=8 with one expert in every token's first slot (8 rows), slots of other ranks' experts
// (-1), experts with none.
TEST_F(GemvPdlSanitizer, ChainedTokenRowsFromTheFlag) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e0e));
  constexpr int kGroups = 6, kTopK = 3;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const int T : {2, 5, 8}) {
    // Slots: expert 0 first, then distinct others or -1; rows by (expert, token, slot).
    std::vector<int32_t> slot_expert(T * kTopK), slot_row(T * kTopK, -1);
    for (int t = 0; t < T; ++t) {
      std::vector<int32_t> pick = {1, 2, 3, 4, 5};
      std::shuffle(pick.begin(), pick.end(), rng);
      slot_expert[t * kTopK] = 0;
      for (int s = 1; s < kTopK; ++s) slot_expert[t * kTopK + s] = rng() % 4 == 0 ? -1 : pick[s];
    }
    std::vector<int> counts;
    const std::vector<int> row_token =
        rows_by_expert(slot_expert, T, kTopK, kGroups, slot_row, counts);
    ChainedCase c(256, 96, counts, rng);
    std::vector<uint16_t> hidden(c.p1.a_bits.begin(), c.p1.a_bits.begin() + T * c.H);
    for (std::size_t r = 0; r < row_token.size(); ++r)  // the gathered rows, for the reference
      std::copy_n(hidden.begin() + row_token[r] * c.H, c.H, c.p1.a_bits.begin() + r * c.H);
    // slot_expert then slot_row, each padded to 16 bytes: the writer copies 16-byte vectors.
    const int pad = (T * kTopK + 3) / 4 * 4;
    std::vector<int32_t> slots(2 * pad, -1);
    std::copy(slot_expert.begin(), slot_expert.end(), slots.begin());
    std::copy(slot_row.begin(), slot_row.end(), slots.begin() + pad);
    const DeviceBuffer rows(to_device(hidden)), off_src(to_device(c.p1.offsets)),
        slots_src(to_device(slots));
    DeviceBuffer flag(4), slots_late(slots.size() * 4);
    for (const char* t : {"sm90.gemv.tma64", "sm90.gemv.tma64.s12"}) {
      SCOPED_TRACE(std::string(t) + " T=" + std::to_string(T));
      c.tactic = t;
      slots_late.poison();  // -1: a store that reads the slots early writes nothing
      const auto* late = static_cast<const int32_t*>(slots_late.ptr);
      c.expect_flagged_chained_matches(stream, off_src, flag, slots_late.ptr, slots_src.ptr,
                                       static_cast<int64_t>(slots_late.bytes), nullptr,
                                       TokenRows{rows.ptr, T, kTopK, late, late + pad});
    }
  }
  cudaStreamDestroy(stream);
}

// The engine's decode chain with token rows (2 to 8 tokens): the permute, the chained kernel
// (FC1 on the tokens' own rows, after the permute's end), then the finalize, which reads the
// permute's slots before its PDL wait (slots_ready). slow_writer stands in for the permute: it
// lets the chained kernel start at once and writes the offsets, the slots and the routing
// weights ~30 us later. So the finalize must not start before the writer has ended: its output
// equals the same finalize run again once everything is done, bit for bit. A stale read of the
// slots (still poisoned: rows -1) would leave tokens without their experts' rows. The kernel
// before the fix of 2026-12-02 (its consumers let the finalize start early) passed it 20 of 20
// times on the H200: a guard of the protocol, not a reproduction of a seen failure.
TEST_F(GemvPdl, FinalizeAfterChainedTokenRowsReadsTheWrittenSlots) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e10));
  constexpr int kGroups = 6, kTopK = 2, kT = 8;
  std::vector<int32_t> slot_expert(kT * kTopK), slot_row(kT * kTopK);
  std::vector<float> weights(kT * kTopK);
  std::uniform_real_distribution<float> unit(0.1f, 1.0f);
  for (int t = 0; t < kT; ++t) {  // two distinct experts per token
    const int e0 = static_cast<int>(rng() % kGroups);
    slot_expert[t * kTopK] = e0;
    slot_expert[t * kTopK + 1] = (e0 + 1 + static_cast<int>(rng() % (kGroups - 1))) % kGroups;
    for (int s = 0; s < kTopK; ++s) weights[t * kTopK + s] = unit(rng);
  }
  std::vector<int> counts;
  rows_by_expert(slot_expert, kT, kTopK, kGroups, slot_row, counts);
  ChainedCase c(256, 96, counts, rng);
  std::vector<uint16_t> hidden(c.p1.a_bits.begin(), c.p1.a_bits.begin() + kT * c.H);
  // The late part, in 16-byte vectors: offsets (padded), slot_expert, slot_row, weights.
  const int n = kT * kTopK, pad_off = (kGroups + 1 + 3) / 4 * 4;
  std::vector<int32_t> late(pad_off + 3 * n, -1);
  std::copy(c.p1.offsets.begin(), c.p1.offsets.end(), late.begin());
  std::copy(slot_expert.begin(), slot_expert.end(), late.begin() + pad_off);
  std::copy(slot_row.begin(), slot_row.end(), late.begin() + pad_off + n);
  std::memcpy(late.data() + pad_off + 2 * n, weights.data(), weights.size() * 4);
  static_assert(kT * kTopK % 4 == 0, "each array a whole number of 16-byte vectors");
  const DeviceBuffer rows(to_device(hidden)), late_src(to_device(late));
  DeviceBuffer late_dst(late.size() * 4), out(size_t(kT) * c.H * 2), again(size_t(kT) * c.H * 2);
  const auto* d = static_cast<const int32_t*>(late_dst.ptr);
  finalize::DeviceFinalize fin;
  fin.elem = DType::kBFloat16;
  fin.hidden = c.H;
  fin.top_k = kTopK;
  ASSERT_TRUE(finalize::prepare(fin).ok());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const char* t : {"sm90.gemv.tma64", "sm90.gemv.tma64.s12"}) {
    for (int run = 0; run < 3; ++run) {
      SCOPED_TRACE(std::string(t) + " run " + std::to_string(run));
      c.tactic = t;
      late_dst.poison();  // the offsets too: every expert empty until the writer
      out.poison();
      c.reset();
      // The writer's offsets go to late_dst's first vectors, which the GEMMs read as theirs.
      slow_writer<<<1, 256, 0, stream>>>(nullptr, nullptr, 0, static_cast<uint4*>(late_dst.ptr),
                                         static_cast<const uint4*>(late_src.ptr),
                                         static_cast<int64_t>(late.size() / 4), 30000);
      using Call = GroupedGemm::GemmCall;
      Call c1{&c.fc1, c.x.ptr, c.w1.ptr, c.y2.ptr, c.tactic + "+act"};
      c1.token_rows = TokenRows{rows.ptr, kT, kTopK, d + pad_off, d + pad_off + n};
      const Call c2{&c.fc2, c.y2.ptr, c.w2.ptr, c.z2.ptr, c.tactic};
      Status s = GroupedGemm::launch_chained(c1, c2, d, static_cast<int*>(c.done.ptr), stream);
      ASSERT_TRUE(s.ok()) << s.message();
      const auto* w = reinterpret_cast<const float*>(d + pad_off + 2 * n);
      s = finalize::run(fin, kT, c.z2.ptr, d + pad_off + n, w, d + pad_off, out.ptr, stream, true);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      s = finalize::run(fin, kT, c.z2.ptr, d + pad_off + n, w, d + pad_off, again.ptr, stream);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto got = to_host<uint16_t>(out.ptr, out.bytes / 2);
      const auto want = to_host<uint16_t>(again.ptr, again.bytes / 2);
      int64_t differ = 0;
      for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
      EXPECT_EQ(differ, 0) << "of " << got.size() << " outputs differ from the finalize run after "
                           << "everything ended (the slots read before the writer wrote them)";
    }
  }
  cudaStreamDestroy(stream);
}

// Token rows are read only by the chained TMA GEMV's FC1, for 2 to 8 tokens: anything else is
// refused before a kernel is enqueued.
TEST_F(GemvPdl, TokenRowsRefusedOutsideTheirCase) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e0f));
  ChainedCase c(256, 96, {2, 1}, rng);
  DeviceBuffer slots(64), flag(4);
  const auto* sl = static_cast<const int32_t*>(slots.ptr);
  GroupedGemm::GemmCall c1{&c.fc1, c.x.ptr, c.w1.ptr, c.y2.ptr, "sm90.gemv.tma64+act"};
  c1.offsets_flag = static_cast<const uint32_t*>(flag.ptr);
  c1.token_rows = TokenRows{c.x.ptr, 2, 2, sl, sl + 4};
  const GroupedGemm::GemmCall c2{&c.fc2, c.y2.ptr, c.w2.ptr, c.z2.ptr, "sm90.gemv.tma64"};
  // Alone (not chained).
  Status s = c.fc1.launch(c1, c.offsets(), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.message();
  EXPECT_NE(s.message().find("only chained"), std::string::npos) << s.message();
  // A token count outside 2..8, named.
  for (const int count : {1, 9}) {
    GroupedGemm::GemmCall bad = c1;
    bad.token_rows.count = count;
    s = GroupedGemm::launch_chained(bad, c2, c.offsets(), static_cast<int*>(c.done.ptr), nullptr);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("(" + std::to_string(count) + " tokens"), std::string::npos)
        << s.message();
  }
  // On FC2.
  GroupedGemm::GemmCall second = c2;
  second.token_rows = c1.token_rows;
  s = GroupedGemm::launch_chained(c1, second, c.offsets(), static_cast<int*>(c.done.ptr), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// FC2's k slices (KSlices) are taken only by the chained kernel's second GEMM, 1..ceil(k / 64)
// of them, with 16-byte aligned partials exactly when above 1: anything else is refused before
// a kernel is enqueued, the count named.
TEST_F(GemvPdl, KSlicesRefusedOutsideTheirCase) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e10));
  ChainedCase c(256, 96, {2, 1}, rng);  // FC2's k 96: 2 boxes
  DeviceBuffer partials(size_t(c.P) * 2 * 256 * 4);
  auto* part = static_cast<float*>(partials.ptr);
  const GroupedGemm::GemmCall c1{&c.fc1, c.x.ptr, c.w1.ptr, c.y2.ptr, "sm90.gemv.tma64+act"};
  GroupedGemm::GemmCall c2{&c.fc2, c.y2.ptr, c.w2.ptr, c.z2.ptr, "sm90.gemv.tma64"};
  auto* done = static_cast<int*>(c.done.ptr);
  const std::pair<int, float*> bad[] = {{0, nullptr}, {-2, part},    {3, part},  // outside 1..2
                                        {2, nullptr}, {2, part + 1},             // partials
                                        {1, part}};
  for (const auto& [count, ptr] : bad) {
    GroupedGemm::GemmCall second = c2;
    second.k_slices = KSlices{ptr, count};
    const Status s = GroupedGemm::launch_chained(c1, second, c.offsets(), done, nullptr);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("k slices " + std::to_string(count) + " need 1..2"),
              std::string::npos)
        << s.message();
  }
  // On FC1, and alone (not chained).
  GroupedGemm::GemmCall first = c1;
  first.k_slices = KSlices{part, 2};
  Status s = GroupedGemm::launch_chained(first, c2, c.offsets(), done, nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.message();
  c2.k_slices = KSlices{part, 2};
  s = c.fc2.launch(c2, c.offsets(), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.message();
  EXPECT_NE(s.message().find("only chained"), std::string::npos) << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The standalone TMA GEMV with GemmCall::item_counter, where its blocks take several items
// (256 experts of one row: FC1 2048 items, FC2 4096, on at most 396 blocks), so that the item
// ring's slots are reused: equal to the fixed shares bit for bit, every output written, and the
// counters show that the items came from them. Named for the device script's memcheck and
// racecheck pass; the two variants the engine picks.
TEST_F(GemvPdlSanitizer, CountedItemsEqualFixedShares) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e0b));
  ChainedCase c(1024, 256, std::vector<int>(256, 1), rng);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const char* t : {"sm90.gemv.tma64", "sm90.gemv.tma64.s12"}) {
    SCOPED_TRACE(t);
    c.tactic = t;
    c.two_launches(stream);
    c.reset();
    const std::vector<int32_t> counters = c.counted_launches(stream);
    EXPECT_EQ(c.first_difference(), "");
    EXPECT_EQ(c.unwritten(), 0);
    // A block's first id is its own; it takes the rest from the counter (from the grid on)
    // until one passes the end: (items - grid) + grid takes, exactly the items.
    EXPECT_EQ(counters[0], 256 * 8);
    EXPECT_EQ(counters[1], 256 * 16);
  }
  cudaStreamDestroy(stream);
}

// FC2's case: row_offsets were written before the previous kernel started (offsets_ready), so
// the GEMV may read them and prefetch weights before its wait, but not the activations, which
// the previous kernel writes late.
TEST_F(GemvPdl, SettledOffsetsStillWaitForTheActivations) {
  std::mt19937 rng(static_cast<unsigned>(base_seed() ^ 0x6e04));
  const Problem p = make_problem(128, 256, {3, 0, 9, 1}, rng);
  const DeviceBuffer a_src(to_device(p.a_bits)), w(to_device(p.w_bits)), off(to_device(p.offsets));
  DeviceBuffer a(p.a_bits.size() * 2), d(static_cast<std::size_t>(p.max_rows * p.n) * 2);
  GroupedGemm gemm(GroupedShape{Elem::kBF16, p.groups, p.n, p.k, p.max_rows}, 0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& t : gemv_tactics()) {
    SCOPED_TRACE(t);
    ASSERT_EQ(cudaMemset(a.ptr, 0xff, a.bytes), cudaSuccess);  // stale: NaN
    ASSERT_EQ(cudaMemset(d.ptr, 0xff, d.bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Leaves the offsets alone and writes the activations after ~200 us.
    slow_writer<<<1, 256, 0, stream>>>(nullptr, nullptr, 0, static_cast<uint4*>(a.ptr),
                                       static_cast<const uint4*>(a_src.ptr),
                                       static_cast<int64_t>(p.a_bits.size() / 8), 200000);
    GroupedGemm::GemmCall call{&gemm, a.ptr, w.ptr, d.ptr, t, true};
    const Status s = gemm.launch(call, static_cast<const int32_t*>(off.ptr), stream);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_matches(p, to_host<uint16_t>(d.ptr, d.bytes / 2));
  }
  cudaStreamDestroy(stream);
}

// ---- Timing (MOEKIT_GEMV_TIMING=1): decode shapes, weights streamed from HBM ----

__global__ void fill_random(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    const float v = (x & 0xffff) / 32768.0f - 1.0f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v * 0.05f));
  }
}

TEST_F(GemvPdl, DecodeTiming) {
  if (std::getenv("MOEKIT_GEMV_TIMING") == nullptr) GTEST_SKIP() << "set MOEKIT_GEMV_TIMING=1";
  struct Shape {
    const char* name;
    int E, k_top;
    int64_t H, I;
  };
  const Shape shapes[] = {{"qwen3-30b-a3b", 128, 8, 2048, 768},
                          {"mixtral-8x7b", 8, 2, 4096, 14336},
                          {"deepseek-v3", 256, 8, 7168, 2048},
                          {"gpt-oss-120b", 128, 4, 2880, 2880}};
  std::mt19937 rng(1234);
  DeviceBuffer flush(256u << 20);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("[ timing ] %-14s %4s %-4s %-30s %9s %9s %6s\n", "preset", "T", "gemm", "tactic",
              "median_us", "floor_us", "TB/s");
  for (const Shape& sh : shapes) {
    const int64_t max_rows = 64 * sh.k_top;
    DeviceBuffer w1(size_t(sh.E) * 2 * sh.I * sh.H * 2), w2(size_t(sh.E) * sh.H * sh.I * 2);
    DeviceBuffer x(size_t(max_rows) * std::max(sh.H, sh.I) * 2),
        y(size_t(max_rows) * std::max(sh.H, 2 * sh.I) * 2);
    fill_random<<<4096, 256>>>(static_cast<uint16_t*>(w1.ptr), int64_t(w1.bytes / 2), 1);
    fill_random<<<4096, 256>>>(static_cast<uint16_t*>(w2.ptr), int64_t(w2.bytes / 2), 2);
    fill_random<<<4096, 256>>>(static_cast<uint16_t*>(x.ptr), int64_t(x.bytes / 2), 3);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    GroupedGemm fc1(GroupedShape{Elem::kBF16, sh.E, 2 * sh.I, sh.H, max_rows}, 0);
    GroupedGemm fc2(GroupedShape{Elem::kBF16, sh.E, sh.H, sh.I, max_rows}, 0);
    for (int T : {1, 8, 64}) {
      std::vector<int> counts(sh.E, 0), perm(sh.E);
      for (int t = 0; t < T; ++t) {
        for (int e = 0; e < sh.E; ++e) perm[e] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int j = 0; j < sh.k_top; ++j) ++counts[perm[j]];
      }
      std::vector<int32_t> offsets(1, 0);
      int live = 0;
      for (int c : counts) {
        offsets.push_back(offsets.back() + c);
        live += c > 0;
      }
      const DeviceBuffer off(to_device(offsets));
      const double hint = double(T) * sh.k_top / sh.E;
      for (int which = 0; which < 2; ++which) {
        GroupedGemm& gemm = which == 0 ? fc1 : fc2;
        const void* w = which == 0 ? w1.ptr : w2.ptr;
        const double bytes = double(live) * double(gemm.shape().n) * double(gemm.shape().k) * 2;
        std::vector<std::string> names = gemv_tactics();
        const std::string pick = gemm.pick_tactic(hint);
        if (std::find(names.begin(), names.end(), pick) == names.end()) names.push_back(pick);
        for (const auto& t : names) {
          std::vector<float> us;
          for (int rep = 0; rep < 25; ++rep) {
            cudaMemsetAsync(flush.ptr, rep & 0xff, flush.bytes, stream);
            cudaEventRecord(e0, stream);
            const Status s =
                gemm.run(x.ptr, w, y.ptr, static_cast<const int32_t*>(off.ptr), hint, stream, t);
            ASSERT_TRUE(s.ok()) << s.message();
            cudaEventRecord(e1, stream);
            ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep >= 3) us.push_back(ms * 1e3f);
          }
          std::sort(us.begin(), us.end());
          const double med = us[us.size() / 2];
          std::printf("[ timing ] %-14s %4d %-4s %-30s %9.1f %9.1f %6.2f\n", sh.name, T,
                      which == 0 ? "fc1" : "fc2", (t + (t == pick ? " (pick)" : "")).c_str(), med,
                      bytes / 4.24e12 * 1e6, bytes / med / 1e6);
        }
      }
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace moekit::gemm
