// The resolution report: the table names every candidate; the JSON parses and round-trips.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "moekit/registry.hpp"
#include "moekit/status.hpp"
#include "registry/registry_fixtures.hpp"

namespace moekit::registry::test {
namespace {

void expect_same(const Resolution& a, const Resolution& b) {
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.chosen, b.chosen);
  EXPECT_EQ(a.environment_fingerprint, b.environment_fingerprint);
  ASSERT_EQ(a.candidates.size(), b.candidates.size());
  for (size_t i = 0; i < a.candidates.size(); ++i) {
    const CandidateReport &x = a.candidates[i], &y = b.candidates[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.family, y.family);
    EXPECT_EQ(x.priority, y.priority);
    EXPECT_EQ(x.eligible, y.eligible);
    EXPECT_EQ(x.chosen, y.chosen);
    ASSERT_EQ(x.rejection.has_value(), y.rejection.has_value());
    if (x.rejection) {
      EXPECT_EQ(x.rejection->stage, y.rejection->stage);
      EXPECT_EQ(x.rejection->reason, y.rejection->reason);
    }
  }
  ASSERT_EQ(a.degraded_from.has_value(), b.degraded_from.has_value());
  if (a.degraded_from) {
    EXPECT_EQ(a.degraded_from->requested, b.degraded_from->requested);
    EXPECT_EQ(a.degraded_from->chosen, b.degraded_from->chosen);
    EXPECT_EQ(a.degraded_from->reason.stage, b.degraded_from->reason.stage);
    EXPECT_EQ(a.degraded_from->reason.reason, b.degraded_from->reason.reason);
  }
}

TEST(Report, JsonParsesAndRoundTrips) {
  MoeSpec odd = small_spec(WeightFormat::kFP16, DType::kFloat16);
  odd.hidden = 260;
  const Resolution cases[] = {
      resolve(small_spec(), h200_env(), "auto"),
      resolve(small_spec(), Environment::cpu_only(), "auto"),
      resolve(odd, h200_env(), "cutlass"),
      resolve(small_spec(), Environment::cpu_only(), "cuda.sm90.cutlass.bf16"),
  };
  for (const Resolution& r : cases) {
    const std::string text = r.json();
    nlohmann::json j = nlohmann::json::parse(text);  // throws if it is not JSON
    EXPECT_EQ(j.at("request"), r.request);
    EXPECT_EQ(j.at("candidates").size(), r.candidates.size());
    if (r.ok())
      EXPECT_EQ(j.at("chosen"), r.chosen->id());
    else
      EXPECT_TRUE(j.at("chosen").is_null());
    Resolution back = resolution_from_json(text);
    expect_same(r, back);
    EXPECT_EQ(back.json(), text);
  }
}

// What `moekit resolve --json` prints (and moekit.resolve(...).json in Python): the spec first,
// then the report's fields, which read back as the same report.
TEST(Report, JsonWithSpecHoldsTheSpecAndTheReport) {
  const MoeSpec spec = small_spec();
  const Resolution r = resolve(spec, Environment::cpu_only(), "auto");
  const std::string text = resolution_json_with_spec(spec, r);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  EXPECT_EQ(j.begin().key(), "spec");
  EXPECT_EQ(j.at("spec"), nlohmann::ordered_json::parse(spec_to_json(spec)));
  nlohmann::ordered_json report = j;
  report.erase("spec");
  EXPECT_EQ(report, nlohmann::ordered_json::parse(r.json()));
  expect_same(r, resolution_from_json(text));
}

TEST(Report, JsonCarriesStagesByName) {
  MoeSpec odd = small_spec(WeightFormat::kFP16, DType::kFloat16);
  odd.hidden = 260;
  nlohmann::json j = nlohmann::json::parse(resolve(odd, h200_env(), "cutlass").json());
  EXPECT_EQ(j.at("degraded_from").at("reason").at("stage"), "alignment");
  EXPECT_EQ(j.at("candidates").at(0).at("rejection").at("stage"), "format");
}

TEST(Report, MalformedJsonIsRefused) {
  const std::string good = resolve(small_spec(), h200_env(), "auto").json();
  auto expect_refused = [](const std::string& text, const char* what) {
    try {
      resolution_from_json(text);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
    }
  };
  expect_refused("{not json", "not JSON");
  expect_refused("[]", "an array");
  // Deep nesting where a number belongs: refused before anything recurses over it.
  expect_refused("{\"schema\": " + std::string(200000, '[') + std::string(200000, ']') + "}",
                 "deeply nested schema");
  nlohmann::json j = nlohmann::json::parse(good);
  j.erase("candidates");
  expect_refused(j.dump(), "no candidates");
  j = nlohmann::json::parse(good);
  j["candidates"][0]["rejection"] = {{"stage", "weather"}, {"reason", "rain"}};
  expect_refused(j.dump(), "unknown stage");
  j = nlohmann::json::parse(good);
  j["chosen"] = "cuda.sm42.magic";
  expect_refused(j.dump(), "unknown chosen id");
  j = nlohmann::json::parse(good);
  j["schema"] = 99;
  expect_refused(j.dump(), "other schema");
  j = nlohmann::json::parse(good);
  j["candidates"][0]["eligible"] = false;  // rejected without a rejection
  expect_refused(j.dump(), "rejected without a reason");
}

TEST(Report, TableNamesEveryCandidate) {
  Resolution r = resolve(small_spec(), Environment::cpu_only(), "auto");
  const std::string t = r.table();
  for (const CandidateReport& c : r.candidates) EXPECT_NE(t.find(c.id), std::string::npos) << t;
  EXPECT_NE(t.find("CHOSEN"), std::string::npos) << t;
  EXPECT_NE(t.find("gpu_generation"), std::string::npos) << t;

  MoeSpec odd = small_spec(WeightFormat::kFP16, DType::kFloat16);
  odd.hidden = 260;
  const std::string d = resolve(odd, h200_env(), "cutlass").table();
  EXPECT_NE(d.find("none"), std::string::npos) << d;
  EXPECT_NE(d.find("alignment"), std::string::npos) << d;
  EXPECT_NE(d.find("260"), std::string::npos) << d;
}

}  // namespace
}  // namespace moekit::registry::test
