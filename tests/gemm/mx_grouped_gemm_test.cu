// MxGroupedGemm (gemm/mx_grouped_gemm.hpp) alone: every built tactic (the streaming GEMV; the
// tensor-core one where the activations are bf16 and k a multiple of 64) for
// MXFP4, NVFP4 and MXFP8 weights in the device layout (pipeline/sm90_mx_layout.hpp), bf16 and
// fp16 activations, with and without a bias, against a host product (in double) of the
// activation rows with the reference's dequantized weights (quant::dequantize_expert, which the
// kernel's decode equals bit for bit) plus the bias. Fresh random inputs each run (the seed is
// printed). Besides random weights, rows 0..3 of every group carry: every value code (row 0),
// the smallest scale (row 1: e8m0 0 = 2^-127; NVFP4's e4m3 0x01 = 2^-9), the largest finite one
// (row 2: e8m0 254 = 2^127, NVFP4 448, over one value of 0.5) and a NaN scale in one block
// (row 3: e8m0 0xff, NVFP4 e4m3 0x7f), whose outputs are NaN as the reference's are. D is
// poisoned (NaN) first: every row of a group must be written, the rows past the last group
// left alone. Each entry within one unit in the last place of the reference rounded to the
// activation type plus 1e-4 of its terms' magnitudes (fp32 accumulation; the same infinity where
// the rounded reference is infinite).
// A captured graph replays with new row counts. The shape checks run without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gemm/mx_grouped_gemm.hpp"
#include "pipeline/sm90_mx_layout.hpp"
#include "quant/quant.hpp"
#include "support/gpu.hpp"

namespace moekit::gemm {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class MxGroupedGemmTest : public GpuTest {};

struct Case {
  WeightFormat format;
  DType elem;
  bool bias;
};

std::string describe(const Case& c) {
  return std::string(to_string(c.format)) + " " + to_string(c.elem) + (c.bias ? " bias" : "");
}

int block_of(WeightFormat f) { return format_scale_group(f, 0); }

// The special rows 0..2 of every expert (the header says which); n >= 4.
void add_special_rows(QuantizedTensor& t) {
  const bool nvfp4 = t.format == WeightFormat::kNVFP4;
  const int bits = format_value_bits(t.format);
  const int64_t row_bytes = t.cols * bits / 8, row_scales = t.cols / block_of(t.format);
  for (int64_t g = 0; g < t.experts; ++g) {
    uint8_t* v = t.values.data() + g * t.expert_value_bytes();
    uint8_t* s = t.scale_bytes.data() + g * t.rows * row_scales;
    std::set<int> low, high;
    for (int64_t j = 0; j < row_bytes; ++j) {
      uint8_t b = bits == 4 ? static_cast<uint8_t>(j * 7 + j / 16) : static_cast<uint8_t>(j);
      if (bits == 8 && (b & 0x7f) == 0x7f) b = 0;  // the e4m3 NaN codes: not in this row
      v[j] = b;
      low.insert(b & 0xf);
      high.insert(b >> 4);
    }
    if (bits == 4) {
      EXPECT_EQ(low.size(), 16u);
      EXPECT_EQ(high.size(), 16u);
    } else {
      EXPECT_GE(row_bytes, 256);  // every code but the NaN ones
    }
    for (int64_t b = 0; b < row_scales; ++b) s[row_scales + b] = nvfp4 ? 0x01 : 0x00;
    for (int64_t j = 0; j < row_bytes; ++j) v[2 * row_bytes + j] = 0;
    v[2 * row_bytes + 2] = bits == 4 ? 0x01 : 0x30;  // element 4 (e2m1) or 2 (e4m3) is 0.5
    for (int64_t b = 0; b < row_scales; ++b) s[2 * row_scales + b] = nvfp4 ? 0x7e : 254;
  }
}

// Host inputs of one GEMM: the weights (with the special rows) in the checkpoint's layout and
// the device one, the bias and the activation rows.
struct Inputs {
  QuantizedTensor t;
  std::vector<uint8_t> values, scales;
  std::vector<float> bias;
  std::vector<uint16_t> a;
};

Inputs make_inputs(const Case& c, int groups, int64_t n, int64_t k, int64_t max_rows,
                   std::mt19937_64& rng) {
  Inputs in;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(groups * n * k));
  for (float& x : w) x = normal(rng);
  WeightQuant q;
  q.format = c.format;
  q.group_size = block_of(c.format);
  in.t = quant::quantize(q, groups, n, k, w.data(), 4.0f, rng());
  add_special_rows(in.t);
  const int64_t vb = pipeline::mx_expert_value_bytes(in.t),
                sb = pipeline::mx_expert_scale_bytes(in.t);
  in.values.resize(static_cast<std::size_t>(groups * vb));
  in.scales.resize(static_cast<std::size_t>(groups * sb));
  for (int g = 0; g < groups; ++g)
    pipeline::mx_expert_layout(in.t, g, nullptr, in.values.data() + g * vb,
                               in.scales.data() + g * sb);
  // Row 3's NaN scale (block 1), which the layout refuses for e8m0: put in both copies after it.
  const uint8_t nan_code = c.format == WeightFormat::kNVFP4 ? 0x7f : 0xff;
  for (int g = 0; g < groups; ++g) {
    const std::size_t at = static_cast<std::size_t>(g * sb + 3 * (k / block_of(c.format)) + 1);
    in.t.scale_bytes[at] = nan_code;
    in.scales[at] = nan_code;
  }
  in.bias.resize(c.bias ? static_cast<std::size_t>(groups * n) : 0);
  for (float& b : in.bias) b = normal(rng);
  in.a.resize(static_cast<std::size_t>(max_rows * k));
  fill_bits(in.a, c.elem, normal, rng);
  return in;
}

// D's reference [rows, n], in double over the exactly dequantized weights, and beside each
// entry the sum of its terms' magnitudes (what bounds the fp32 accumulation's error).
struct Reference {
  std::vector<double> value, magnitude;
};

Reference host_product(const Case& c, const Inputs& in, const std::vector<int32_t>& offsets) {
  const int64_t n = in.t.rows, k = in.t.cols;
  Reference ref;
  ref.value.resize(static_cast<std::size_t>(offsets.back() * n));
  ref.magnitude.resize(ref.value.size());
  std::vector<float> dq(static_cast<std::size_t>(n * k));
  for (int g = 0; g + 1 < static_cast<int>(offsets.size()); ++g) {
    if (offsets[g + 1] == offsets[g]) continue;
    quant::dequantize_expert(in.t, g, dq.data());
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (int64_t j = 0; j < n; ++j) {
        double s = c.bias ? in.bias[static_cast<std::size_t>(g * n + j)] : 0.0;
        double m = std::fabs(s);
        for (int64_t x = 0; x < k; ++x) {
          const double term = double(from_bits(c.elem, in.a[static_cast<std::size_t>(r * k + x)])) *
                              dq[static_cast<std::size_t>(j * k + x)];
          s += term;
          m += std::fabs(term);
        }
        ref.value[static_cast<std::size_t>(r * n + j)] = s;
        ref.magnitude[static_cast<std::size_t>(r * n + j)] = m;
      }
  }
  return ref;
}

// D [max_rows, n] against the reference, entry by entry: NaN where the reference is NaN, the
// same infinity where the reference rounded to the activation type is infinite, else within
// one unit in the last place of the rounded reference plus 1e-4 of the terms' magnitudes (fp32
// accumulation over at most a few thousand terms stays far below it); rows past the last group
// untouched (still the poison's NaN).
void expect_matches(const Case& c, const std::vector<uint16_t>& out, const Reference& ref,
                    const std::vector<int32_t>& offsets, int64_t n, int64_t max_rows) {
  const bool bf16 = c.elem == DType::kBFloat16;
  const double ulp = bf16 ? 0x1p-7 : 0x1p-10, tiniest = bf16 ? 0x1p-133 : 0x1p-24;
  int64_t unwritten = 0, nan_missing = 0, inf_wrong = 0, far = 0, written_past_end = 0;
  for (int64_t i = 0; i < offsets.back() * n; ++i) {
    const std::size_t at = static_cast<std::size_t>(i);
    const double o = from_bits(c.elem, out[at]);
    const double want = quant::round_to(c.elem, static_cast<float>(ref.value[at]));
    if (std::isnan(want)) {
      nan_missing += !std::isnan(o);
    } else if (std::isnan(o)) {
      ++unwritten;
    } else if (std::isinf(want)) {
      inf_wrong += o != want;
    } else if (!(std::fabs(o - want) <=
                 ulp * std::fabs(want) + 1e-4 * ref.magnitude[at] + tiniest)) {
      if (far++ < 5)
        ADD_FAILURE() << "row " << i / n << " column " << i % n << ": " << o << ", reference "
                      << ref.value[at] << " (terms' magnitude " << ref.magnitude[at] << ")";
    }
  }
  for (int64_t i = offsets.back() * n; i < max_rows * n; ++i)
    written_past_end += !std::isnan(from_bits(c.elem, out[static_cast<std::size_t>(i)]));
  EXPECT_EQ(unwritten, 0) << "outputs of a group left unwritten (or NaN where finite)";
  EXPECT_EQ(nan_missing, 0) << "finite outputs where a NaN scale makes the reference NaN";
  EXPECT_EQ(inf_wrong, 0) << "outputs where the rounded reference is infinite";
  EXPECT_EQ(far, 0) << "outputs off the reference";
  EXPECT_EQ(written_past_end, 0) << "rows past the last group written";
}

struct Device {
  DeviceBuffer off, a, w, s, gs, b, d;
};

Device upload_inputs(const Inputs& in, const std::vector<int32_t>& offsets, int64_t n,
                     int64_t max_rows) {
  Device dev;
  dev.off = to_device(offsets);
  dev.a = to_device(in.a);
  dev.w = to_device(in.values);
  dev.s = to_device(in.scales);
  dev.gs = to_device(in.t.global_scale);
  dev.b = to_device(in.bias);
  dev.d = DeviceBuffer(static_cast<std::size_t>(max_rows * n) * 2);
  return dev;
}

MxGroupedGemm::Call call_of(const Case& c, const Device& dev) {
  MxGroupedGemm::Call call;
  call.a = dev.a.ptr;
  call.w = dev.w.ptr;
  call.scales = dev.s.as<uint8_t>();
  call.global_scales = c.format == WeightFormat::kNVFP4 ? dev.gs.as<float>() : nullptr;
  call.bias = c.bias ? dev.b.as<float>() : nullptr;
  call.d = dev.d.ptr;
  return call;
}

void check_case(const Case& c, int64_t n, int64_t k, const std::vector<int>& counts,
                std::mt19937_64& rng) {
  std::vector<int32_t> offsets(1, 0);
  for (const int x : counts) offsets.push_back(offsets.back() + x);
  const int groups = static_cast<int>(counts.size());
  const int64_t max_rows = offsets.back() + 5;
  const Inputs in = make_inputs(c, groups, n, k, max_rows, rng);
  const Reference ref = host_product(c, in, offsets);
  MxGroupedGemm gemm(MxGroupedShape{groups, n, k, max_rows, c.elem, c.format, c.bias}, 0);
  Device dev = upload_inputs(in, offsets, n, max_rows);
  for (const std::string& tactic : gemm.tactics()) {
    SCOPED_TRACE(describe(c) + " " + tactic + " n " + std::to_string(n) + " k " +
                 std::to_string(k) + " rows " + std::to_string(offsets.back()));
    dev.d.poison();
    MxGroupedGemm::Call call = call_of(c, dev);
    call.tactic = tactic;
    const Status st = gemm.run(call, dev.off.as<int32_t>(), nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_matches(c, to_host<uint16_t>(dev.d.ptr, static_cast<std::size_t>(max_rows * n)), ref,
                   offsets, n, max_rows);
  }
}

TEST_F(MxGroupedGemmTest, EveryTacticAgainstTheHostProduct) {
  std::mt19937_64 rng(base_seed() ^ 0x3f4a);
  const std::vector<std::vector<int>> distributions = {
      {3, 0, 9, 1, 0, 2},  // empty groups, more rows than one GEMV pass
      {20, 0, 0, 0},       // all in the first group
      {0, 0, 0, 5},        // all in the last group
      {0, 0, 0},           // none
  };
  for (const WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kNVFP4, WeightFormat::kMXFP8})
    for (const DType elem : {DType::kBFloat16, DType::kFloat16})
      for (const bool bias : {false, true}) {
        const Case c{f, elem, bias};
        // n with a partial 32-row tile, k of 8 MXFP4 chunks (a lane's first load only).
        for (const auto& counts : distributions) check_case(c, 136, 512, counts, rng);
        // k past 32 chunks: the lanes' second loads and a second pass of the row loop.
        check_case(c, 40, 2080, {1, 0, 7}, rng);
        // The tensor-core tiles (k a multiple of 64): a partial 256-row tile, token tiles of
        // 128 and 64 with a partial last one, an empty group, a one-row group.
        check_case(c, 136, 512, {150, 0, 70, 1}, rng);
      }
}

// The gpt-oss-120b expert shapes (FC1 2 x 2880 rows over 2880, FC2 2880 over 2880) with a
// decode's few rows, MXFP4 and bf16 with biases, as the layer would run them.
TEST_F(MxGroupedGemmTest, GptOssShapes) {
  std::mt19937_64 rng(base_seed() ^ 0x6055);
  const Case c{WeightFormat::kMXFP4, DType::kBFloat16, true};
  check_case(c, 2 * 2880, 2880, {1, 0, 2, 0}, rng);
  check_case(c, 2880, 2880, {0, 1, 0, 3}, rng);
  // Prefill's rows per expert, on the tensor-core tactics.
  check_case(c, 2880, 2880, {130, 0, 3, 64}, rng);
}

// A run captured in a graph reads row_offsets when replayed: new counts written to the same
// buffer give the new product, with no host synchronization inside the capture.
TEST_F(MxGroupedGemmTest, GraphReplayReadsNewRowCounts) {
  std::mt19937_64 rng(base_seed() ^ 0x96a9);
  const Case c{WeightFormat::kMXFP4, DType::kBFloat16, true};
  const int64_t n = 64, k = 256;
  const std::vector<int32_t> first = {0, 2, 2, 5}, second = {0, 0, 4, 8};
  const int64_t max_rows = 8 + 5;
  const Inputs in = make_inputs(c, 3, n, k, max_rows, rng);
  MxGroupedGemm gemm(MxGroupedShape{3, n, k, max_rows, c.elem, c.format, c.bias}, 0);
  Device dev = upload_inputs(in, first, n, max_rows);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  MxGroupedGemm::Call call = call_of(c, dev);
  call.rows_bound = 8;
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status st = gemm.run(call, dev.off.as<int32_t>(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.message();
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const auto& offsets : {first, second}) {
    upload(dev.off, offsets);
    dev.d.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_matches(c, to_host<uint16_t>(dev.d.ptr, static_cast<std::size_t>(max_rows * n)),
                   host_product(c, in, offsets), offsets, n, max_rows);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Calls the GEMM refuses: an unknown tactic (kNotFound), a null or misaligned operand
// (kInvalidArgument, naming the null one); nothing is enqueued.
TEST_F(MxGroupedGemmTest, RefusesBadCalls) {
  MxGroupedGemm gemm(MxGroupedShape{4, 64, 128, 16, DType::kBFloat16, WeightFormat::kNVFP4, true},
                     0);
  DeviceBuffer off(4 * 5), a(16 * 128 * 2), w(4 * 64 * 64), s(4 * 64 * 8), gs(4 * 4), b(4 * 64 * 4),
      d(16 * 64 * 2);
  // The status of a call with every operand in place but for what `change` does to it.
  const auto status_of = [&](const std::string& tactic, auto change) {
    MxGroupedGemm::Call c;
    c.a = a.ptr;
    c.w = w.ptr;
    c.scales = s.as<uint8_t>();
    c.global_scales = gs.as<float>();
    c.bias = b.as<float>();
    c.d = d.ptr;
    c.tactic = tactic;
    change(c);
    return gemm.run(c, off.as<int32_t>(), nullptr);
  };
  const auto expect_refused = [](const Status& st, ErrorCode code, const std::string& named) {
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_NE(st.message().find(named), std::string::npos) << st.message();
  };
  expect_refused(status_of("sm90.nvfp4.no_such_tactic", [](MxGroupedGemm::Call&) {}),
                 ErrorCode::kNotFound, "no_such_tactic");
  for (const std::string& tactic : gemm.tactics()) {
    SCOPED_TRACE(tactic);
    expect_refused(status_of(tactic, [](MxGroupedGemm::Call& c) { c.global_scales = nullptr; }),
                   ErrorCode::kInvalidArgument, "global scales");
    expect_refused(status_of(tactic, [](MxGroupedGemm::Call& c) { c.bias = nullptr; }),
                   ErrorCode::kInvalidArgument, "bias");
    expect_refused(status_of(tactic, [](MxGroupedGemm::Call& c) { c.scales += 1; }),
                   ErrorCode::kInvalidArgument, "aligned");
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(MxGroupedGemmShape, ValidateNamesTheValue) {
  const MxGroupedShape ok{8, 256, 512, 64, DType::kBFloat16, WeightFormat::kMXFP4, false};
  EXPECT_TRUE(MxGroupedGemm::validate(ok).ok());
  const auto expect_refused = [&](auto change, ErrorCode code, const std::string& value) {
    MxGroupedShape shape = ok;
    change(shape);
    const Status st = MxGroupedGemm::validate(shape);
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_NE(st.message().find(value), std::string::npos) << st.message();
  };
  using S = MxGroupedShape;
  expect_refused([](S& s) { s.format = WeightFormat::kInt4Group; }, ErrorCode::kUnsupported,
                 "int4_group");
  expect_refused([](S& s) { s.elem = DType::kFloat32; }, ErrorCode::kUnsupported, "fp32");
  // A whole number of NVFP4 blocks, not of 32.
  expect_refused([](S& s) { s.k = 2880 + 16; }, ErrorCode::kUnsupported, "2896");
  expect_refused([](S& s) { s.n = 100; }, ErrorCode::kUnsupported, "100");
  expect_refused([](S& s) { s.groups = 0; }, ErrorCode::kInvalidArgument, "groups 0");
  expect_refused([](S& s) { s.max_rows = -1; }, ErrorCode::kInvalidArgument, "-1");
}

}  // namespace
}  // namespace moekit::gemm
