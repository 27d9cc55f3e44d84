// IntGroupedGemm (gemm/int_grouped_gemm.hpp) alone: every built tactic (the GEMV, the CUTLASS
// mixed-input kernels, with the finish kernel where zero points or a bias stage D in fp32; for
// groups of 32 the streaming GEMV) against a host product of the activation rows with the
// reference's exactly dequantized weights (quant::dequantize_expert) plus the bias, in double,
// for int4 and int8, bf16 and fp16, groups 32, 64 and 128, with and without zero points and bias;
// row distributions with empty groups, all rows in the first or the last group, and none. D is
// poisoned (NaN) first: every row of a group must be written (no NaN), the rows past the last group
// left alone (still NaN). ||D - ref|| / ||ref|| < 1e-2 (each weight rounded to the activation type
// after its scale on the tensor cores; fp32 on the GEMV). The shape checks run without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gemm/int_grouped_gemm.hpp"
#include "pipeline/sm90_int_layout.hpp"
#include "quant/quant.hpp"
#include "support/gpu.hpp"

namespace moekit::gemm {
namespace {

using namespace devtest;  // NOLINT: the shared device-test helpers

class IntGroupedGemmTest : public GpuTest {};

struct Variant {
  WeightFormat format;
  DType elem;
  int group;
  bool zero_points, bias;
};

std::string describe(const Variant& v) {
  return std::string(to_string(v.format)) + " " + to_string(v.elem) + " group " +
         std::to_string(v.group) + (v.zero_points ? " zero points" : "") + (v.bias ? " bias" : "");
}

void check_variant(const Variant& v, int64_t n, int64_t k, const std::vector<int>& counts,
                   std::mt19937_64& rng) {
  const int groups = static_cast<int>(counts.size());
  std::vector<int32_t> offsets(1, 0);
  for (const int c : counts) offsets.push_back(offsets.back() + c);
  const int64_t rows = offsets.back(), max_rows = rows + 5;
  // Weights: random, quantized as a checkpoint would be, then laid out for the device.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(groups * n * k));
  for (float& x : w) x = normal(rng) + (v.zero_points ? 0.5f : 0.0f);
  WeightQuant q;
  q.format = v.format;
  q.group_size = v.group;
  q.zero_points = v.zero_points;
  const QuantizedTensor t = quant::quantize(q, groups, n, k, w.data());
  const int64_t vb = pipeline::int_expert_value_bytes(t),
                ge = pipeline::int_expert_group_entries(t);
  std::vector<uint8_t> values(static_cast<std::size_t>(groups * vb));
  std::vector<float> scales(static_cast<std::size_t>(groups * ge)),
      zeros(v.zero_points ? scales.size() : 0);
  for (int g = 0; g < groups; ++g)
    pipeline::int_expert_layout(t, g, nullptr, values.data() + g * vb, scales.data() + g * ge,
                                v.zero_points ? zeros.data() + g * ge : nullptr);
  std::vector<float> bias(v.bias ? static_cast<std::size_t>(groups * n) : 0);
  for (float& b : bias) b = normal(rng);
  std::vector<uint16_t> a_bits(static_cast<std::size_t>(max_rows * k));
  fill_bits(a_bits, v.elem, normal, rng);

  // The host product, in double, over the exactly dequantized weights.
  std::vector<double> ref(static_cast<std::size_t>(rows * n));
  std::vector<float> dq(static_cast<std::size_t>(n * k));
  for (int g = 0; g < groups; ++g) {
    quant::dequantize_expert(t, g, dq.data());
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (int64_t j = 0; j < n; ++j) {
        double s = v.bias ? bias[static_cast<std::size_t>(g * n + j)] : 0.0;
        for (int64_t c = 0; c < k; ++c)
          s += double(from_bits(v.elem, a_bits[static_cast<std::size_t>(r * k + c)])) *
               dq[static_cast<std::size_t>(j * k + c)];
        ref[static_cast<std::size_t>(r * n + j)] = s;
      }
  }

  const IntGroupedShape shape{
      groups,        n,     k, max_rows, v.elem, pipeline::int_group_bits(v.format), v.group,
      v.zero_points, v.bias};
  IntGroupedGemm gemm(shape, 0);
  DeviceBuffer d_off = to_device(offsets), d_a = to_device(a_bits), d_w = to_device(values),
               d_s = to_device(scales), d_z = to_device(zeros), d_b = to_device(bias);
  DeviceBuffer d_out(static_cast<std::size_t>(max_rows * n) * 2);
  DeviceBuffer staging(std::max<std::size_t>(gemm.staging_bytes(), 16));
  for (const std::string& tactic : gemm.tactics()) {
    SCOPED_TRACE(describe(v) + " " + tactic + " rows " + std::to_string(rows));
    d_out.poison();
    staging.poison();
    IntGroupedGemm::Call c;
    c.a = d_a.ptr;
    c.w = d_w.ptr;
    c.scales = d_s.as<float>();
    c.zeros = v.zero_points ? d_z.as<float>() : nullptr;
    c.bias = v.bias ? d_b.as<float>() : nullptr;
    c.d = d_out.ptr;
    c.staging = gemm.staging_bytes() ? staging.as<float>() : nullptr;
    c.tactic = tactic;
    const Status st = gemm.run(c, d_off.as<int32_t>(), nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> out =
        to_host<uint16_t>(d_out.ptr, static_cast<std::size_t>(max_rows * n));
    double diff = 0, norm = 0;
    int64_t nan = 0, written_past_end = 0;
    for (int64_t i = 0; i < rows * n; ++i) {
      const double o = from_bits(v.elem, out[static_cast<std::size_t>(i)]);
      if (std::isnan(o)) {
        ++nan;
        continue;
      }
      const double r = ref[static_cast<std::size_t>(i)];
      diff += (o - r) * (o - r);
      norm += r * r;
    }
    for (int64_t i = rows * n; i < max_rows * n; ++i)
      written_past_end += !std::isnan(from_bits(v.elem, out[static_cast<std::size_t>(i)]));
    EXPECT_EQ(nan, 0) << "rows of a group left unwritten";
    EXPECT_EQ(written_past_end, 0) << "rows past the last group written";
    if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), 1e-2);
  }
}

TEST_F(IntGroupedGemmTest, EveryTacticAgainstTheHostProduct) {
  std::mt19937_64 rng(base_seed() ^ 0x16e1);
  const std::vector<std::vector<int>> distributions = {
      {3, 0, 70, 1, 0, 9},  // empty groups, one past a 64-row tile
      {200, 0, 0, 0},       // all in the first group
      {0, 0, 0, 5},         // all in the last group
      {0, 0, 0},            // none
  };
  for (const WeightFormat f : {WeightFormat::kInt4Group, WeightFormat::kInt8Group})
    for (const DType elem : {DType::kBFloat16, DType::kFloat16})
      for (const int group : {32, 64, 128})
        for (const bool zero : {false, true})
          for (const bool bias : {false, true}) {
            const Variant v{f, elem, group, zero, bias};
            // n with a partial 128-row tile, k of a few groups.
            for (const auto& counts : distributions) check_variant(v, 136, 256, counts, rng);
            // With zero points, a k whose rows take the group-sum kernel's loop more than
            // once, the last time in part (1536 columns: 192 16-byte vectors, 128 a step).
            if (zero) check_variant(v, 136, 1536, distributions[0], rng);
          }
}

// A k long enough that the GEMV stages its rows in slices of k (6144 columns are past both its
// 8- and 16-row passes' one-slice limit) and takes 128-row items: groups of up to 20 rows, one
// past a 16-row pass, and a partial row tile.
TEST_F(IntGroupedGemmTest, GemvSlicesOfALongK) {
  std::mt19937_64 rng(base_seed() ^ 0x51ce);
  for (const Variant& v : {Variant{WeightFormat::kInt4Group, DType::kBFloat16, 128, true, true},
                           Variant{WeightFormat::kInt8Group, DType::kFloat16, 64, false, false}})
    check_variant(v, 136, 6144, {3, 0, 20}, rng);
}

// More groups than the GEMV's shared memory holds beside the staged rows (its compacted list of
// non-empty groups is an int each): refused when the GEMM is built, naming the count.
TEST_F(IntGroupedGemmTest, GemvRefusesMoreGroupsThanItsSharedMemoryHolds) {
  const IntGroupedShape shape{30000, 64, 128, 16, DType::kBFloat16, 4, 64, false, false};
  try {
    IntGroupedGemm gemm(shape, 0);
    ADD_FAILURE() << "built with 30000 groups";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("30000"), std::string::npos) << e.what();
  }
}

// Calls the GEMM refuses: an unknown tactic (kNotFound), a null or misaligned operand
// (kInvalidArgument); nothing is enqueued.
TEST_F(IntGroupedGemmTest, RefusesBadCalls) {
  const IntGroupedShape shape{4, 64, 128, 16, DType::kBFloat16, 4, 64, true, false};
  IntGroupedGemm gemm(shape, 0);
  DeviceBuffer off(4 * 5), a(16 * 128 * 2), w(4 * 64 * 64), s(4 * 2 * 64 * 4), z(s.bytes),
      d(16 * 64 * 2), staging(gemm.staging_bytes());
  IntGroupedGemm::Call ok;
  ok.a = a.ptr;
  ok.w = w.ptr;
  ok.scales = s.as<float>();
  ok.zeros = z.as<float>();
  ok.d = d.ptr;
  ok.staging = staging.as<float>();
  IntGroupedGemm::Call c = ok;
  c.tactic = "sm90.int4.no_such_tactic";
  Status st = gemm.run(c, off.as<int32_t>(), nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_NE(st.message().find("no_such_tactic"), std::string::npos) << st.message();
  for (const std::string& tactic : gemm.tactics()) {
    SCOPED_TRACE(tactic);
    c = ok;
    c.tactic = tactic;
    c.zeros = nullptr;  // the shape has zero points
    st = gemm.run(c, off.as<int32_t>(), nullptr);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("zero terms"), std::string::npos) << st.message();
    c = ok;
    c.tactic = tactic;
    c.a = static_cast<char*>(a.ptr) + 2;
    EXPECT_EQ(gemm.run(c, off.as<int32_t>(), nullptr).code(), ErrorCode::kInvalidArgument);
  }
  c = ok;
  c.tactic = gemm.tactics().back();  // a CUTLASS one, which stages D with zero points
  c.staging = nullptr;
  st = gemm.run(c, off.as<int32_t>(), nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("staging"), std::string::npos) << st.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(IntGroupedGemmShape, ValidateNamesTheValue) {
  const IntGroupedShape ok{8, 256, 512, 64, DType::kBFloat16, 4, 128, false, false};
  EXPECT_TRUE(IntGroupedGemm::validate(ok).ok());
  struct Bad {
    IntGroupedShape shape;
    ErrorCode code;
    std::string value;
  };
  std::vector<Bad> bad;
  IntGroupedShape s = ok;
  s.group_size = 48;
  bad.push_back({s, ErrorCode::kUnsupported, "48"});
  s = ok;
  s.group_size = 32;  // the streaming GEMV's
  EXPECT_TRUE(IntGroupedGemm::validate(s).ok());
  s = ok;
  s.bits = 2;
  bad.push_back({s, ErrorCode::kUnsupported, "2"});
  s = ok;
  s.elem = DType::kFloat32;
  bad.push_back({s, ErrorCode::kUnsupported, "fp32"});
  s = ok;
  s.k = 320;  // not a multiple of 128
  bad.push_back({s, ErrorCode::kUnsupported, "320"});
  s = ok;
  s.n = 100;
  bad.push_back({s, ErrorCode::kUnsupported, "100"});
  s = ok;
  s.groups = 0;
  bad.push_back({s, ErrorCode::kInvalidArgument, "0"});
  s = ok;
  s.max_rows = -1;
  bad.push_back({s, ErrorCode::kInvalidArgument, "-1"});
  for (const Bad& b : bad) {
    const Status st = IntGroupedGemm::validate(b.shape);
    EXPECT_EQ(st.code(), b.code) << st.message();
    EXPECT_NE(st.message().find(b.value), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace moekit::gemm
