// Host routing on crafted logits: every method, ties, grouped selection, correction bias,
// scaling factor, NaN handling, and id validation.
#include "routing/routing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace moekit::routing {
namespace {

struct Routed {
  Status status;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const RoutingParams& p, int64_t experts, int64_t k, const std::vector<float>& logits,
             const std::vector<float>* bias = nullptr) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / experts;
  Routed r;
  r.ids.assign(tokens * k, -7);
  r.weights.assign(tokens * k, NAN);
  r.status = route_host(p, tokens, experts, k, logits.data(), bias ? bias->data() : nullptr,
                        r.ids.data(), r.weights.data());
  return r;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
float logit_of(double p) { return static_cast<float>(std::log(p / (1.0 - p))); }

RoutingParams params(RoutingMethod m) {
  RoutingParams p;
  p.method = m;
  return p;
}

TEST(RoutingHost, SoftmaxTopKTiesGoToLowerIdAndWeightsAreNotRenormalized) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  Routed r = route(params(RoutingMethod::kSoftmaxTopK), 4, 2, l);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  const double denom = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / denom, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(3.0) / denom, 1e-6);
  EXPECT_LT(r.weights[0] + r.weights[1], 0.9f);  // not renormalized
}

TEST(RoutingHost, TopKSoftmaxRenormalizesOverTheSelected) {
  const std::vector<float> l = {1.0f, 2.0f, 0.0f, 3.0f,    // token 0
                                0.5f, 2.0f, 2.0f, -1.0f};  // token 1: tie
  Routed r = route(params(RoutingMethod::kTopKSoftmax), 4, 2, l);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1, 1, 2}));
  const double d = std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / d, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(2.0) / d, 1e-6);
  EXPECT_FLOAT_EQ(r.weights[2], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[3], 0.5f);
}

TEST(RoutingHost, ScalingFactorMultipliesEveryMethod) {
  const std::vector<float> l = {0.3f, -1.0f, 2.0f, 0.9f, 1.7f, -0.2f, 0.0f, 1.1f};
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                          RoutingMethod::kDeepSeekV3, RoutingMethod::kLlama4}) {
    const int64_t k = 3;
    RoutingParams p = params(m);
    Routed base = route(p, 8, k, l);
    p.routed_scaling_factor = 2.5f;
    Routed scaled = route(p, 8, k, l);
    ASSERT_TRUE(base.status.ok() && scaled.status.ok()) << to_string(m);
    EXPECT_EQ(base.ids, scaled.ids);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_NEAR(scaled.weights[j], 2.5 * base.weights[j], 1e-6) << to_string(m) << " slot " << j;
    }
  }
}

TEST(RoutingHost, Llama4TopOneSigmoid) {
  const std::vector<float> l = {0.5f, 1.25f, -3.0f, 1.25f};
  RoutingParams p = params(RoutingMethod::kLlama4);
  Routed r = route(p, 4, 1, l);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.ids[0], 1);  // tie with expert 3
  EXPECT_NEAR(r.weights[0], sigmoid(1.25), 1e-7);
}

// transformers' Llama4Router.forward takes any top_k: each slot's weight is the sigmoid of its
// own logit, not renormalized (they need not sum to 1).
TEST(RoutingHost, Llama4TopKSigmoidOfEachSlot) {
  const std::vector<float> l = {0.5f, 1.25f, -3.0f, 1.25f, 2.0f, -0.5f};
  Routed r = route(params(RoutingMethod::kLlama4), 6, 3, l);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 1, 3}));  // 1 and 3 tie: the lower id first
  EXPECT_NEAR(r.weights[0], sigmoid(2.0), 1e-7);
  EXPECT_NEAR(r.weights[1], sigmoid(1.25), 1e-7);
  EXPECT_NEAR(r.weights[2], sigmoid(1.25), 1e-7);
}

// 8 experts in 4 groups of 2; sigmoid scores chosen so that the best single expert (0) sits in
// a group whose top-2 sum loses.
TEST(RoutingHost, DeepSeekV3KeepsTheGroupsWithTheBestTopTwoSum) {
  const std::vector<double> s = {0.9, 0.1, 0.6, 0.6, 0.55, 0.55, 0.2, 0.2};
  std::vector<float> l;
  for (double x : s) l.push_back(logit_of(x));
  RoutingParams p = params(RoutingMethod::kDeepSeekV3);
  p.n_group = 4;
  p.topk_group = 2;
  Routed r = route(p, 8, 3, l);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3, 4}));  // 4 and 5 tie: lower id
  const double sum = sigmoid(l[2]) + sigmoid(l[3]) + sigmoid(l[4]);
  EXPECT_NEAR(r.weights[0], sigmoid(l[2]) / sum, 1e-6);
  EXPECT_NEAR(r.weights[2], sigmoid(l[4]) / sum, 1e-6);

  // Without grouping expert 0 wins.
  p.n_group = 1;
  p.topk_group = 1;
  Routed flat = route(p, 8, 3, l);
  ASSERT_TRUE(flat.status.ok());
  EXPECT_EQ(flat.ids, (std::vector<int32_t>{0, 2, 3}));
}

TEST(RoutingHost, DeepSeekV3GroupTiesGoToLowerGroup) {
  // Groups 1 and 3 tie for the one kept group (equal scores): group 1 wins.
  const std::vector<float> l = {-2.0f, -2.0f, 1.0f, 0.5f, -2.0f, -2.0f, 1.0f, 0.5f};
  RoutingParams p = params(RoutingMethod::kDeepSeekV3);
  p.n_group = 4;
  p.topk_group = 1;
  Routed r = route(p, 8, 2, l);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
}

TEST(RoutingHost, DeepSeekV3CorrectionBiasSelectsButDoesNotWeigh) {
  const std::vector<float> l = {1.0f, 0.8f, 0.6f, 0.4f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.5f, 0.0f};
  RoutingParams p = params(RoutingMethod::kDeepSeekV3);
  p.renormalize = false;
  p.routed_scaling_factor = 2.0f;
  Routed plain = route(p, 4, 2, l);
  ASSERT_TRUE(plain.status.ok());
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{0, 1}));
  p.correction_bias = true;
  Routed biased = route(p, 4, 2, l, &bias);
  ASSERT_TRUE(biased.status.ok()) << biased.status.message();
  EXPECT_EQ(biased.ids, (std::vector<int32_t>{2, 0}));       // 0.646 + 0.5 beats 0.731
  EXPECT_NEAR(biased.weights[0], 2.0 * sigmoid(0.6), 1e-6);  // the bias is not in the weight
  EXPECT_NEAR(biased.weights[1], 2.0 * sigmoid(1.0), 1e-6);

  p.renormalize = true;
  Routed norm = route(p, 4, 2, l, &bias);
  ASSERT_TRUE(norm.status.ok());
  const double sum = sigmoid(0.6) + sigmoid(1.0);
  EXPECT_NEAR(norm.weights[0], 2.0 * sigmoid(0.6) / sum, 1e-6);
  EXPECT_NEAR(norm.weights[0] + norm.weights[1], 2.0, 1e-6);

  // The bias flag without a bias is refused, not read through a null pointer.
  EXPECT_EQ(route(p, 4, 2, l).status.code(), ErrorCode::kInvalidArgument);
}

TEST(RoutingHost, DeepSeekV3BiasChangesTheKeptGroup) {
  // Group 0 (experts 0, 1) wins on scores; a bias on group 1 moves the choice there.
  const std::vector<float> l = {1.0f, 1.0f, 0.0f, 0.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.3f, 0.3f};
  RoutingParams p = params(RoutingMethod::kDeepSeekV3);
  p.n_group = 2;
  p.topk_group = 1;
  p.correction_bias = true;
  Routed r = route(p, 4, 2, l, &bias);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], 0.5, 1e-7);
}

TEST(RoutingHost, DeepSeekV3RandomSelectionsStayInKeptGroups) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int64_t E = 64, k = 8, tokens = 50;
  std::vector<float> l(tokens * E), bias(E);
  for (auto& x : l) x = nd(rng);
  for (auto& x : bias) x = 0.1f * nd(rng);
  RoutingParams p = params(RoutingMethod::kDeepSeekV3);
  p.n_group = 8;
  p.topk_group = 3;
  p.correction_bias = true;
  p.routed_scaling_factor = 2.5f;
  Routed r = route(p, E, k, l, &bias);
  ASSERT_TRUE(r.status.ok());
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> ids(r.ids.begin() + t * k, r.ids.begin() + (t + 1) * k);
    std::set<int32_t> groups;
    for (int32_t id : ids) groups.insert(id / 8);
    EXPECT_EQ(ids.size(), 8u);
    EXPECT_LE(groups.size(), 3u);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += r.weights[t * k + j];
    EXPECT_NEAR(sum, 2.5f, 1e-5f);
    for (int64_t j = 1; j < k; ++j) {  // descending selection score
      const int32_t a = r.ids[t * k + j - 1], b = r.ids[t * k + j];
      EXPECT_GE(sigmoid(l[t * E + a]) + bias[a], sigmoid(l[t * E + b]) + bias[b] - 1e-6);
    }
  }
}

TEST(RoutingHost, NaNLogitsAreMinusInfinity) {
  const std::vector<float> l = {NAN, 1.0f, NAN, 0.0f};
  Routed r = route(params(RoutingMethod::kTopKSoftmax), 4, 3, l);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(r.weights[2], 0.0f);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-6f);

  const std::vector<float> all_nan = {NAN, NAN, NAN, NAN};
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                          RoutingMethod::kDeepSeekV3, RoutingMethod::kLlama4}) {
    const int64_t k = 2;
    Routed z = route(params(m), 4, k, all_nan);
    ASSERT_TRUE(z.status.ok()) << to_string(m);
    EXPECT_EQ(z.ids[0], 0) << to_string(m);
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(z.weights[j], 0.0f) << to_string(m);
  }
}

TEST(RoutingHost, RefusesWhatItCannotRoute) {
  const std::vector<float> l(8, 0.0f);
  EXPECT_EQ(route(params(RoutingMethod::kExternal), 4, 2, l).status.code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(route(params(RoutingMethod::kTopKSoftmax), 4, 5, l).status.code(),
            ErrorCode::kInvalidArgument);
  RoutingParams p = params(RoutingMethod::kDeepSeekV3);
  p.n_group = 3;
  EXPECT_EQ(route(p, 4, 2, l).status.code(), ErrorCode::kInvalidArgument);
  p.n_group = 2;
  p.topk_group = 1;
  EXPECT_EQ(route(p, 4, 3, l).status.code(), ErrorCode::kInvalidArgument);  // 3 > 1 x 2
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  EXPECT_EQ(route_host(params(RoutingMethod::kTopKSoftmax), 1, 4, 2, nullptr, nullptr, ids.data(),
                       w.data())
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST(RoutingHost, ValidateIds) {
  const std::vector<int32_t> good = {0, 3, 2, 1};
  EXPECT_TRUE(validate_ids_host(2, 4, 2, good.data()).ok());
  const std::vector<int32_t> high = {0, 3, 2, 4};
  Status s = validate_ids_host(2, 4, 2, high.data());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4"), std::string::npos);
  EXPECT_NE(s.message().find("token 1"), std::string::npos);
  const std::vector<int32_t> negative = {-1, 3};
  EXPECT_EQ(validate_ids_host(1, 4, 2, negative.data()).code(), ErrorCode::kInvalidArgument);
  const std::vector<int32_t> twice = {0, 1, 2, 2};
  s = validate_ids_host(2, 4, 2, twice.data());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot 1"), std::string::npos);
  EXPECT_TRUE(validate_ids_host(0, 4, 2, nullptr).ok());
}

}  // namespace
}  // namespace moekit::routing
