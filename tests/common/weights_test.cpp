// QuantizedTensor::check_sizes, check_weights and shard_weights (TP slice of both gate/up
// layouts and of FC2, EP expert ranges, biases), for every weight format.
#include "moekit/weights.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moekit/status.hpp"
#include "quant/quant.hpp"
#include "support/errors.hpp"

namespace moekit {
namespace {

const WeightFormat kAllFormats[] = {WeightFormat::kBF16,        WeightFormat::kFP16,
                                    WeightFormat::kFP32,        WeightFormat::kFP8PerTensor,
                                    WeightFormat::kFP8Block128, WeightFormat::kInt8Group,
                                    WeightFormat::kInt4Group,   WeightFormat::kMXFP4,
                                    WeightFormat::kNVFP4,       WeightFormat::kMXFP8};

bool is_int(WeightFormat f) {
  return f == WeightFormat::kInt8Group || f == WeightFormat::kInt4Group;
}

// A small layer whose local intermediate stays a multiple of 128 under TP 2.
MoeSpec small_spec(WeightFormat f, ActivationKind act = ActivationKind::kSwiGLU,
                   GateUpLayout layout = GateUpLayout::kHalves) {
  MoeSpec s;
  s.num_experts = 4;
  s.top_k = 2;
  s.hidden = 128;
  s.intermediate = 256;
  s.weights.format = f;
  s.weights.group_size = 64;
  s.activation.kind = act;
  s.gate_up_layout = layout;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  return s;
}

using test::expect_error;

std::vector<float> dequant(const QuantizedTensor& t, int64_t e) {
  std::vector<float> out(static_cast<std::size_t>(t.rows * t.cols));
  quant::dequantize_expert(t, e, out.data());
  return out;
}

TEST(CheckSizes, NamesTheTensorTheBufferAndBothSizes) {
  WeightQuant q;
  q.format = WeightFormat::kInt4Group;
  q.group_size = 32;
  q.zero_points = true;
  q.pre_quant_scale = true;
  std::vector<float> w(2 * 3 * 64, 0.25f);
  const QuantizedTensor good = quant::quantize(q, 2, 3, 64, w.data());
  EXPECT_NO_THROW(good.check_sizes("fc1"));
  EXPECT_EQ(good.expert_value_bytes(), 3 * 32);

  auto broken = good;
  broken.values.pop_back();
  expect_error(ErrorCode::kInvalidArgument, {"fc1", "values", "191", "192"},
               [&] { broken.check_sizes("fc1"); });
  broken = good;
  broken.scales.push_back(1.0f);
  expect_error(ErrorCode::kInvalidArgument, {"fc2", "scales", "13", "12"},
               [&] { broken.check_sizes("fc2"); });
  broken = good;
  broken.zeros.resize(5);
  expect_error(ErrorCode::kInvalidArgument, {"zeros", "5", "12"}, [&] { broken.check_sizes("w"); });
  broken = good;
  broken.zeros.clear();  // optional: absent is fine
  EXPECT_NO_THROW(broken.check_sizes("w"));
  broken = good;
  broken.pre_quant_scale.resize(64);
  expect_error(ErrorCode::kInvalidArgument, {"pre_quant_scale", "64", "128"},
               [&] { broken.check_sizes("w"); });
  broken = good;
  broken.weight_scale = {1.0f, 1.0f};  // int formats have none
  expect_error(ErrorCode::kInvalidArgument, {"weight_scale", "2"},
               [&] { broken.check_sizes("w"); });
  broken = good;
  broken.group_size = 48;  // 64 columns are not a multiple of 48
  expect_error(ErrorCode::kInvalidArgument, {"48", "64"}, [&] { broken.check_sizes("w"); });
  broken = good;
  broken.group_size = 0;
  expect_error(ErrorCode::kInvalidArgument, {"group_size"}, [&] { broken.check_sizes("w"); });
  broken = good;
  broken.cols = 63;
  expect_error(ErrorCode::kInvalidArgument, {"63"}, [&] { broken.check_sizes("w"); });
  broken = good;
  broken.rows = -1;
  expect_error(ErrorCode::kInvalidArgument, {"-1"}, [&] { broken.check_sizes("w"); });
}

TEST(CheckSizes, FixedGroupsAndScalarBuffers) {
  std::vector<float> w(2 * 130 * 200, 0.5f);
  WeightQuant q;
  q.format = WeightFormat::kFP8Block128;
  auto t = quant::quantize(q, 2, 130, 200, w.data());
  EXPECT_EQ(t.group_size, 128);
  EXPECT_EQ(t.scales.size(), 2u * 2u * 2u);  // ceil(130/128) x ceil(200/128) per expert
  t.group_size = 64;
  expect_error(ErrorCode::kInvalidArgument, {"group_size", "64", "128"},
               [&] { t.check_sizes("fc2"); });

  std::vector<float> w2(2 * 4 * 64, 0.5f);
  q.format = WeightFormat::kNVFP4;
  auto n = quant::quantize(q, 2, 4, 64, w2.data());
  EXPECT_EQ(n.group_size, 16);
  EXPECT_EQ(n.scale_bytes.size(), 2u * 4u * 4u);
  n.global_scale.pop_back();
  expect_error(ErrorCode::kInvalidArgument, {"global_scale", "1", "2"},
               [&] { n.check_sizes("fc1"); });
  n.global_scale = {1.0f, 1.0f};
  n.weight_scale = {1.0f, 1.0f};  // kFP8PerTensor's field: NVFP4 has none
  expect_error(ErrorCode::kInvalidArgument, {"weight_scale", "2", "0"},
               [&] { n.check_sizes("fc1"); });

  q.format = WeightFormat::kFP8PerTensor;
  auto p = quant::quantize(q, 2, 4, 64, w2.data());
  p.input_scale.pop_back();  // one per expert, or none (dynamic per-token activations)
  expect_error(ErrorCode::kInvalidArgument, {"input_scale", "1", "2"},
               [&] { p.check_sizes("fc1"); });
  p.input_scale.clear();
  EXPECT_NO_THROW(p.check_sizes("fc1"));

  q.format = WeightFormat::kBF16;
  auto b = quant::quantize(q, 2, 4, 64, w2.data());
  EXPECT_EQ(b.group_size, 0);
  b.scales = {1.0f};
  expect_error(ErrorCode::kInvalidArgument, {"scales", "1", "0"}, [&] { b.check_sizes("fc1"); });
}

// Every buffer of one expert of t, in bytes: what the tensor really holds.
int64_t stored_bytes_per_expert(const QuantizedTensor& t) {
  const std::size_t fp32 = t.scales.size() + t.weight_scale.size() + t.global_scale.size() +
                           t.input_scale.size() + t.pre_quant_scale.size();
  const std::size_t bytes = t.values.size() + t.scale_bytes.size() + t.zeros.size() + 4 * fp32;
  return static_cast<int64_t>(bytes) / t.experts;
}

// expert_matrix_bytes counts what quantize() stores, for every format and option (the last
// 128-row block and 128-column block of kFP8Block128 partial).
TEST(ExpertMatrixBytes, EqualsTheStoredBuffersOfEveryFormat) {
  const int64_t rows = 160, cols = 256;
  std::vector<float> w(2 * rows * cols, 0.25f);
  for (WeightFormat f : kAllFormats)
    for (int options = 0; options < (is_int(f) ? 4 : 1); ++options) {
      WeightQuant q;
      q.format = f;
      q.group_size = 64;
      q.zero_points = (options & 1) != 0;
      q.pre_quant_scale = (options & 2) != 0;
      const QuantizedTensor t = quant::quantize(q, 2, rows, cols, w.data());
      EXPECT_EQ(expert_matrix_bytes(q, rows, cols), stored_bytes_per_expert(t))
          << to_string(f) << " options " << options;
    }
  WeightQuant block;
  block.format = WeightFormat::kFP8Block128;
  // 130 x 200: values plus a 2 x 2 table of fp32 block scales.
  EXPECT_EQ(expert_matrix_bytes(block, 130, 200), 130 * 200 + 4 * 2 * 2);
  // DeepSeek-V3's FC1 [4096, 7168]: 32 x 56 blocks.
  EXPECT_EQ(expert_matrix_bytes(block, 4096, 7168), int64_t{4096} * 7168 + 4 * 32 * 56);
  WeightQuant tensor;
  tensor.format = WeightFormat::kFP8PerTensor;
  EXPECT_EQ(expert_matrix_bytes(tensor, 130, 200), 130 * 200 + 8);  // weight and input scale
  tensor.dynamic_activations = true;
  EXPECT_EQ(expert_matrix_bytes(tensor, 130, 200), 130 * 200 + 4);  // the weight scale alone
  WeightQuant bf16;
  EXPECT_EQ(expert_matrix_bytes(bf16, 130, 200), 2 * 130 * 200);
}

TEST(CheckWeights, FormatMismatchNamesBothFormats) {
  const MoeSpec spec = small_spec(WeightFormat::kBF16);
  const MoeWeights w = quant::make_random_weights(spec, 1);
  EXPECT_NO_THROW(check_weights(spec, w));
  MoeSpec other = spec;
  other.weights.format = WeightFormat::kMXFP4;
  expect_error(ErrorCode::kFormatMismatch, {"bf16", "mxfp4"}, [&] { check_weights(other, w); });
}

TEST(CheckWeights, ShapeAndBufferErrorsNameTheField) {
  MoeSpec spec = small_spec(WeightFormat::kInt8Group);
  spec.fc1_bias = true;
  spec.fc2_bias = true;
  const MoeWeights w = quant::make_random_weights(spec, 2);
  EXPECT_NO_THROW(check_weights(spec, w));

  MoeSpec tp2 = spec;  // the unsharded weights do not fit a TP shard
  tp2.tp_size = 2;
  expect_error(ErrorCode::kInvalidArgument, {"fc1.rows", "512", "256"},
               [&] { check_weights(tp2, w); });

  auto bad = w;
  bad.fc2.cols = 128;
  expect_error(ErrorCode::kInvalidArgument, {"fc2.cols", "128", "256"},
               [&] { check_weights(spec, bad); });
  bad = w;
  bad.fc1.experts = 3;
  expect_error(ErrorCode::kInvalidArgument, {"fc1.experts", "3", "4"},
               [&] { check_weights(spec, bad); });
  bad = w;
  bad.fc1_bias.pop_back();
  expect_error(ErrorCode::kInvalidArgument, {"fc1_bias"}, [&] { check_weights(spec, bad); });
  bad = w;
  bad.fc2_bias.clear();
  expect_error(ErrorCode::kInvalidArgument, {"fc2_bias", "0"}, [&] { check_weights(spec, bad); });
  bad = w;
  bad.fc1.group_size = 128;
  expect_error(ErrorCode::kInvalidArgument, {"fc1.group_size", "128", "64"},
               [&] { check_weights(spec, bad); });
  bad = w;
  bad.fc2.scales.pop_back();
  expect_error(ErrorCode::kInvalidArgument, {"fc2", "scales"}, [&] { check_weights(spec, bad); });
  bad = w;
  bad.routing_bias.assign(4, 0.0f);  // the spec has no correction bias
  expect_error(ErrorCode::kInvalidArgument, {"routing_bias", "4"},
               [&] { check_weights(spec, bad); });
  bad = w;
  bad.fc1.zeros.assign(bad.fc1.scales.size(), 0);  // the spec has no zero points
  expect_error(ErrorCode::kInvalidArgument, {"fc1.zeros"}, [&] { check_weights(spec, bad); });

  MoeSpec awq = spec;
  awq.weights.pre_quant_scale = true;
  expect_error(ErrorCode::kInvalidArgument, {"fc1.pre_quant_scale"},
               [&] { check_weights(awq, w); });

  // Per-tensor fp8: static input scales, or none where the spec quantizes per token.
  const MoeSpec fp8 = small_spec(WeightFormat::kFP8PerTensor);
  MoeSpec dynamic = fp8;
  dynamic.weights.dynamic_activations = true;
  const MoeWeights w_static = quant::make_random_weights(fp8, 3);
  const MoeWeights w_dynamic = quant::make_random_weights(dynamic, 3);
  EXPECT_TRUE(w_dynamic.fc1.input_scale.empty());
  EXPECT_NO_THROW(check_weights(fp8, w_static));
  EXPECT_NO_THROW(check_weights(dynamic, w_dynamic));
  expect_error(ErrorCode::kInvalidArgument, {"fc1.input_scale", "missing", "false"},
               [&] { check_weights(fp8, w_dynamic); });
  expect_error(ErrorCode::kInvalidArgument, {"fc1.input_scale", "present", "true"},
               [&] { check_weights(dynamic, w_static); });
}

// Full row of FC1 that local row r of TP rank `rank` (of `tp`) holds, written out per layout.
int64_t expected_fc1_row(const MoeSpec& s, int tp, int rank, int64_t r) {
  const int64_t li = s.intermediate / tp, off = rank * li;
  if (!activation_is_gated(s.activation.kind)) return off + r;
  if (s.gate_up_layout == GateUpLayout::kInterleaved) {
    const int64_t i = r / 2;  // local gate/up pair
    return 2 * (off + i) + (r % 2);
  }
  return r < li ? off + r : s.intermediate + off + (r - li);
}

void expect_same_tensor(const QuantizedTensor& a, const QuantizedTensor& b) {
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.group_size, b.group_size);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.scale_bytes, b.scale_bytes);
  EXPECT_EQ(a.zeros, b.zeros);
  EXPECT_EQ(a.weight_scale, b.weight_scale);
  EXPECT_EQ(a.input_scale, b.input_scale);
  EXPECT_EQ(a.pre_quant_scale, b.pre_quant_scale);
}

struct ShardCase {
  ActivationKind act;
  GateUpLayout layout;
};

TEST(ShardWeights, SliceEqualsTheSliceOfTheDequantizedFullTensor) {
  const ShardCase cases[] = {{ActivationKind::kSwiGLU, GateUpLayout::kHalves},
                             {ActivationKind::kSwiGLUClamped, GateUpLayout::kInterleaved},
                             {ActivationKind::kReLU2, GateUpLayout::kHalves}};
  for (WeightFormat f : kAllFormats) {
    for (const auto& c : cases) {
      MoeSpec full_spec = small_spec(f, c.act, c.layout);
      full_spec.fc1_bias = true;
      full_spec.fc2_bias = true;
      if (is_int(f)) {
        full_spec.weights.zero_points = f == WeightFormat::kInt4Group;
        full_spec.weights.pre_quant_scale = true;
      }
      const MoeWeights full = quant::make_random_weights(full_spec, 42);
      for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
        for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
          SCOPED_TRACE(std::string(to_string(f)) + " " + to_string(c.act) + " " +
                       to_string(c.layout) + " tp_rank " + std::to_string(tp_rank) + " ep_rank " +
                       std::to_string(ep_rank));
          MoeSpec spec = full_spec;
          spec.tp_size = 2;
          spec.tp_rank = tp_rank;
          spec.ep_size = 2;
          spec.ep_rank = ep_rank;
          const MoeWeights s = shard_weights(spec, full);
          const int64_t li = spec.intermediate / 2, ne = 2, e0 = 2 * ep_rank;
          const int64_t fc1_rows = activation_is_gated(c.act) ? 2 * li : li;
          ASSERT_EQ(s.fc1.experts, ne);
          ASSERT_EQ(s.fc1.rows, fc1_rows);
          ASSERT_EQ(s.fc2.cols, li);
          for (int64_t e = 0; e < ne; ++e) {
            const auto full1 = dequant(full.fc1, e0 + e), loc1 = dequant(s.fc1, e);
            for (int64_t r = 0; r < fc1_rows; ++r) {
              const int64_t fr = expected_fc1_row(spec, 2, tp_rank, r);
              for (int64_t col = 0; col < spec.hidden; ++col)
                ASSERT_EQ(loc1[r * spec.hidden + col], full1[fr * spec.hidden + col])
                    << "fc1 expert " << e << " row " << r << " col " << col;
              ASSERT_EQ(s.fc1_bias[e * fc1_rows + r], full.fc1_bias[(e0 + e) * full.fc1.rows + fr]);
            }
            const auto full2 = dequant(full.fc2, e0 + e), loc2 = dequant(s.fc2, e);
            for (int64_t r = 0; r < spec.hidden; ++r)
              for (int64_t col = 0; col < li; ++col)
                ASSERT_EQ(loc2[r * li + col], full2[r * spec.intermediate + tp_rank * li + col])
                    << "fc2 expert " << e << " row " << r << " col " << col;
            for (int64_t h = 0; h < spec.hidden; ++h)  // FC2 bias stays whole
              ASSERT_EQ(s.fc2_bias[e * spec.hidden + h], full.fc2_bias[(e0 + e) * spec.hidden + h]);
            if (is_int(f)) {
              for (int64_t col = 0; col < li; ++col)
                ASSERT_EQ(
                    s.fc2.pre_quant_scale[e * li + col],
                    full.fc2.pre_quant_scale[(e0 + e) * spec.intermediate + tp_rank * li + col]);
              for (int64_t col = 0; col < spec.hidden; ++col)
                ASSERT_EQ(s.fc1.pre_quant_scale[e * spec.hidden + col],
                          full.fc1.pre_quant_scale[(e0 + e) * spec.hidden + col]);
            }
          }
          // Random weights drawn for the shard are exactly the shard of the full random weights.
          const MoeWeights direct = quant::make_random_weights(spec, 42);
          expect_same_tensor(direct.fc1, s.fc1);
          expect_same_tensor(direct.fc2, s.fc2);
          EXPECT_EQ(direct.fc1_bias, s.fc1_bias);
          EXPECT_EQ(direct.fc2_bias, s.fc2_bias);
        }
      }
    }
  }
}

// e8m0 0xff is NaN: weights given directly (MoeLayer::create, the reference) are refused with
// the tensor and position named (types.hpp).
TEST(CheckWeights, NanE8m0ScaleIsRefused) {
  for (WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kMXFP8}) {
    SCOPED_TRACE(to_string(f));
    const MoeSpec spec = small_spec(f);
    MoeWeights w = quant::make_random_weights(spec, 9);
    EXPECT_NO_THROW(check_weights(spec, w));
    // fc1 [4, 512, 128]: 4 groups per row; expert 2, row 7, group 3.
    w.fc1.scale_bytes[(2 * 512 + 7) * 4 + 3] = 0xff;
    expect_error(ErrorCode::kInvalidArgument,
                 {"fc1.scale_bytes", "0xff", "expert 2", "row 7", "group 3"},
                 [&] { check_weights(spec, w); });
  }
  // NVFP4's block scales are e4m3, where 0xff is not a scale moekit refuses here.
  const MoeSpec nv = small_spec(WeightFormat::kNVFP4);
  MoeWeights n = quant::make_random_weights(nv, 9);
  n.fc1.scale_bytes[0] = 0x7e;
  EXPECT_NO_THROW(check_weights(nv, n));
}

TEST(ShardWeights, KeepsRoutingBiasWholeAndChecksTheFullWeights) {
  MoeSpec spec = small_spec(WeightFormat::kBF16);
  spec.routing.method = RoutingMethod::kDeepSeekV3;
  spec.routing.correction_bias = true;
  const MoeWeights full = quant::make_random_weights(spec, 5);
  ASSERT_EQ(full.routing_bias.size(), 4u);
  MoeSpec sharded = spec;
  sharded.ep_size = 4;
  sharded.ep_rank = 3;
  const MoeWeights s = shard_weights(sharded, full);
  EXPECT_EQ(s.routing_bias, full.routing_bias);
  EXPECT_EQ(s.fc1.experts, 1);
  EXPECT_EQ(dequant(s.fc2, 0), dequant(full.fc2, 3));

  MoeSpec fp8 = sharded;
  fp8.weights.format = WeightFormat::kFP8Block128;
  expect_error(ErrorCode::kFormatMismatch, {"bf16", "fp8_block128"},
               [&] { shard_weights(fp8, full); });
  auto truncated = full;
  truncated.fc2.values.resize(10);
  expect_error(ErrorCode::kInvalidArgument, {"fc2", "values"},
               [&] { shard_weights(sharded, truncated); });
}

}  // namespace
}  // namespace moekit
