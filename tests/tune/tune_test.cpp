// The tuning cache (moekit/tune.hpp): buckets, the key, the JSON round trip, every malformed
// file, the fallback rule, the layer's option and environment variable, the report, and the
// CLI's tune and --tuning-file flags.
#include "moekit/tune.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "moekit/status.hpp"
#include "quant/quant.hpp"
#include "support/command.hpp"
#ifdef MOEKIT_WITH_CUDA
#include "support/gpu.hpp"
#endif
#include "tune/rank_tactics.hpp"
#include "tune/routing_profile.hpp"

namespace moekit {
namespace {

using nlohmann::json;

constexpr const char* kFile = "tuning.json";
const std::string kGpu = "cuda.sm90.cutlass.bf16";

std::string tmp_dir() { return testcmd::test_dir("tune"); }

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = tmp_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

MoeSpec small_layer() {
  MoeSpec s;
  s.num_experts = 8;
  s.top_k = 2;
  s.hidden = 64;
  s.intermediate = 32;
  s.max_tokens = 16;
  return s;
}

TuningEntry entry_for(const MoeSpec& spec, const std::string& impl, Gemm gemm, int64_t bucket,
                      const std::string& tactic) {
  TuningEntry e;
  e.key = TuningKey::of(spec, impl, gemm, bucket);
  e.tactic = tactic;
  e.time_us = 10.0 + bucket;
  e.runner_up = tactic + ".b";
  e.runner_up_us = 11.0 + bucket;
  return e;
}

TuningCache cache_with(const std::string& fingerprint, std::vector<TuningEntry> entries) {
  TuningCache c;
  c.fingerprint = fingerprint;
  c.moekit_version = "1.2.3";
  c.moekit_commit = "abcdef123456";
  c.entries = std::move(entries);
  return c;
}

// A valid one-entry document, as JSON, to break one piece of at a time.
json valid_doc() {
  MoeSpec s = small_layer();
  s.activation.kind = ActivationKind::kSwiGLUClamped;
  s.activation.limit = 7.0f;
  s.activation.alpha = 1.702f;
  return json::parse(
      cache_with("fp", {entry_for(s, kGpu, Gemm::kFc1, 4, "sm90.coop.128x128x64.c1x1")}).to_json());
}

TuningCache::Loaded parse_doc(const json& doc, const std::string& fingerprint = "fp") {
  return TuningCache::parse(doc.dump(), kFile, fingerprint);
}

TEST(TuneBuckets, PowersOfTwoThenTheExactCap) {
  EXPECT_EQ(tuning_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(tuning_buckets(8), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(tuning_buckets(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 100}));
  // Data-parallel ranks send theirs: the cap is max_tokens x the factor, and nothing above it.
  EXPECT_EQ(tuning_buckets(100, 4), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 400}));
  EXPECT_EQ(tuning_buckets(4096).back(), 4096);
  EXPECT_EQ(tuning_buckets(4096).size(), 13u);
}

TEST(TuneBuckets, RefusesCapsBelowOneAndOverflow) {
  for (auto [t, dp] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {-5, 1}, {8, 0}, {8, -1}}) {
    try {
      tuning_buckets(t, dp);
      FAIL() << t << " x " << dp;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(t < 1 ? t : dp)), std::string::npos);
    }
  }
  try {
    tuning_buckets(int64_t{1} << 40, int64_t{1} << 40);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(TuneChoices, SmallestBucketAtOrAboveTheTokens) {
  TacticChoices c{
      {{Gemm::kFc1, 1, "a"}, {Gemm::kFc1, 4, "b"}, {Gemm::kFc1, 16, "c"}, {Gemm::kFc2, 4, "x"}}};
  EXPECT_EQ(*c.find(Gemm::kFc1, 1), "a");
  EXPECT_EQ(*c.find(Gemm::kFc1, 2), "b");
  EXPECT_EQ(*c.find(Gemm::kFc1, 4), "b");
  EXPECT_EQ(*c.find(Gemm::kFc1, 5), "c");
  EXPECT_EQ(c.find(Gemm::kFc1, 17), nullptr);  // above every bucket: the built-in pick
  EXPECT_EQ(*c.find(Gemm::kFc2, 1), "x");
  EXPECT_EQ(c.find(Gemm::kFc2, 5), nullptr);
  EXPECT_EQ(TacticChoices{}.find(Gemm::kFc1, 1), nullptr);
}

TEST(TuneKey, EveryFieldThatChangesTheAnswerMisses) {
  MoeSpec base = small_layer();
  base.activation.kind = ActivationKind::kSwiGLUClamped;
  base.activation.limit = 7.0f;
  const TuningKey key = TuningKey::of(base, kGpu, Gemm::kFc1, 8);
  std::vector<std::pair<const char*, std::function<void(MoeSpec&)>>> changes = {
      {"experts", [](MoeSpec& s) { s.num_experts = 16; }},
      {"top_k", [](MoeSpec& s) { s.top_k = 4; }},
      {"hidden", [](MoeSpec& s) { s.hidden = 128; }},
      {"intermediate", [](MoeSpec& s) { s.intermediate = 64; }},
      {"act_dtype", [](MoeSpec& s) { s.act_dtype = DType::kFloat16; }},
      {"weight format", [](MoeSpec& s) { s.weights.format = WeightFormat::kFP16; }},
      {"activation kind",
       [](MoeSpec& s) {
         s.activation = ActivationParams{ActivationKind::kSwiGLU, {}, {}, {}};
       }},
      {"clamp limit", [](MoeSpec& s) { s.activation.limit = 7.5f; }},
      {"alpha", [](MoeSpec& s) { s.activation.alpha = 1.702f; }},
      {"beta", [](MoeSpec& s) { s.activation.beta = 1.0f; }},
      {"fc1 bias", [](MoeSpec& s) { s.fc1_bias = true; }},
      {"fc2 bias", [](MoeSpec& s) { s.fc2_bias = true; }},
      {"gate/up layout", [](MoeSpec& s) { s.gate_up_layout = GateUpLayout::kInterleaved; }},
      {"tp size", [](MoeSpec& s) { s.tp_size = 2; }},
      {"ep size", [](MoeSpec& s) { s.ep_size = 2; }},
  };
  for (auto& [name, change] : changes) {
    MoeSpec s = base;
    change(s);
    EXPECT_NE(TuningKey::of(s, kGpu, Gemm::kFc1, 8), key) << name;
  }
  // The kind alone (no parameters on either side).
  MoeSpec swiglu = small_layer(), geglu = small_layer();
  geglu.activation.kind = ActivationKind::kGeGLUTanh;
  EXPECT_NE(TuningKey::of(swiglu, kGpu, Gemm::kFc1, 8), TuningKey::of(geglu, kGpu, Gemm::kFc1, 8));
  EXPECT_NE(TuningKey::of(base, "cpu.reference", Gemm::kFc1, 8), key);
  EXPECT_NE(TuningKey::of(base, kGpu, Gemm::kFc2, 8), key);
  EXPECT_NE(TuningKey::of(base, kGpu, Gemm::kFc1, 16), key);
  // Grouped integer formats: the group size and its options change the kernel too.
  MoeSpec int4 = base;
  int4.weights.format = WeightFormat::kInt4Group;
  int4.hidden = int4.intermediate = 256;  // multiples of every group size
  const TuningKey int4_key = TuningKey::of(int4, kGpu, Gemm::kFc1, 8);
  for (auto change : std::vector<std::function<void(MoeSpec&)>>{
           [](MoeSpec& s) { s.weights.group_size = 64; },
           [](MoeSpec& s) { s.weights.zero_points = true; },
           [](MoeSpec& s) { s.weights.pre_quant_scale = true; }}) {
    MoeSpec s = int4;
    change(s);
    EXPECT_NE(TuningKey::of(s, kGpu, Gemm::kFc1, 8), int4_key);
  }
}

TEST(TuneKey, FieldsThatDoNotChangeTheAnswerHit) {
  const MoeSpec base = small_layer();
  const TuningKey key = TuningKey::of(base, kGpu, Gemm::kFc2, 8);
  std::vector<std::pair<const char*, std::function<void(MoeSpec&)>>> changes = {
      {"max_tokens", [](MoeSpec& s) { s.max_tokens = 4096; }},
      {"routing method", [](MoeSpec& s) { s.routing.method = RoutingMethod::kSoftmaxTopK; }},
      {"routed scaling", [](MoeSpec& s) { s.routing.routed_scaling_factor = 2.5f; }},
      {"weight placement",
       [](MoeSpec& s) { s.routing.weight_placement = RouterWeightPlacement::kInput; }},
      // The group size means nothing to a bf16 layer.
      {"group size of bf16", [](MoeSpec& s) { s.weights.group_size = 64; }},
  };
  for (auto& [name, change] : changes) {
    MoeSpec s = base;
    change(s);
    EXPECT_EQ(TuningKey::of(s, kGpu, Gemm::kFc2, 8), key) << name;
  }
  // The ranks do not change the local shape (even splits): every rank shares the entry.
  MoeSpec r0 = base, r1 = base;
  r0.ep_size = r1.ep_size = 2;
  r1.ep_rank = 1;
  r0.tp_size = r1.tp_size = 2;
  r1.tp_rank = 1;
  EXPECT_EQ(TuningKey::of(r0, kGpu, Gemm::kFc1, 8), TuningKey::of(r1, kGpu, Gemm::kFc1, 8));
}

TEST(TuneKey, LocalShapesFollowTheSharding) {
  MoeSpec s = small_layer();
  s.tp_size = 2;
  s.ep_size = 2;
  const TuningKey fc1 = TuningKey::of(s, kGpu, Gemm::kFc1, 1);
  const TuningKey fc2 = TuningKey::of(s, kGpu, Gemm::kFc2, 1);
  EXPECT_EQ(fc1.n, 2 * 16);  // gated: 2 x the local intermediate 32 / 2
  EXPECT_EQ(fc1.k, 64);
  EXPECT_EQ(fc2.n, 64);
  EXPECT_EQ(fc2.k, 16);
  EXPECT_EQ(fc1.experts, 4);
  EXPECT_EQ(fc1.global_experts, 8);
}

TEST(TuneCache, RoundTripKeepsEveryField) {
  MoeSpec a = small_layer();
  a.activation.kind = ActivationKind::kSwiGLUClamped;
  a.activation.limit = 7.0f;
  a.activation.alpha = 1.702f;
  a.activation.beta = 1.0f;
  a.fc1_bias = a.fc2_bias = true;
  a.gate_up_layout = GateUpLayout::kInterleaved;
  MoeSpec b = small_layer();
  b.hidden = b.intermediate = 256;  // multiples of the group over TP 2
  b.weights.format = WeightFormat::kInt4Group;
  b.weights.group_size = 64;
  b.weights.zero_points = true;
  b.tp_size = 2;
  TuningEntry lone = entry_for(b, kGpu, Gemm::kFc2, 16, "sm90.gemv.tma64");
  lone.runner_up.clear();
  lone.runner_up_us = 0.0;
  TuningCache c =
      cache_with("fp", {entry_for(a, kGpu, Gemm::kFc1, 1, "sm90.gemv.tma64+act"),
                        entry_for(a, kGpu, Gemm::kFc2, 4, "sm90.swapab.128x16x128.c1x1"), lone});
  c.routing = "zipf:1.2";
  const std::string path = tmp_dir() + "/round_trip.json";
  c.save(path);
  const TuningCache::Loaded back = TuningCache::load(path, "fp");
  ASSERT_TRUE(back.problems.empty()) << back.problems[0].text();
  EXPECT_EQ(back.cache.schema_version, kTuningSchemaVersion);
  EXPECT_EQ(back.cache.fingerprint, "fp");
  EXPECT_EQ(back.cache.moekit_version, "1.2.3");
  EXPECT_EQ(back.cache.moekit_commit, "abcdef123456");
  EXPECT_EQ(back.cache.routing, "zipf:1.2");
  ASSERT_EQ(back.cache.entries.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    const TuningEntry &x = c.entries[i], &y = back.cache.entries[i];
    EXPECT_EQ(x.key, y.key) << i;
    EXPECT_EQ(x.tactic, y.tactic);
    EXPECT_EQ(x.time_us, y.time_us);
    EXPECT_EQ(x.runner_up, y.runner_up);
    EXPECT_EQ(x.runner_up_us, y.runner_up_us);
  }
  EXPECT_EQ(back.cache.entries[0].key.alpha, 1.702f);  // bit for bit
  ASSERT_NE(back.cache.lookup(TuningKey::of(a, kGpu, Gemm::kFc2, 4)), nullptr);
  EXPECT_EQ(back.cache.lookup(TuningKey::of(a, kGpu, Gemm::kFc2, 8)), nullptr);
  // The file is readable JSON with the fields the issue names.
  const json doc = json::parse(testcmd::slurp(path));
  for (const char* f : {"schema_version", "fingerprint", "moekit_version", "moekit_commit"})
    EXPECT_TRUE(doc.contains(f)) << f;
  for (const char* f : {"implementation", "gemm", "n", "k", "experts", "bucket", "tactic",
                        "time_us", "runner_up", "runner_up_us"})
    EXPECT_TRUE(doc["entries"][0].contains(f)) << f;
}

TEST(TuneCache, PutReplacesTheSameKey) {
  const MoeSpec s = small_layer();
  TuningCache c;
  c.put(entry_for(s, kGpu, Gemm::kFc1, 4, "a"));
  c.put(entry_for(s, kGpu, Gemm::kFc1, 8, "b"));
  c.put(entry_for(s, kGpu, Gemm::kFc1, 4, "c"));
  ASSERT_EQ(c.entries.size(), 2u);
  EXPECT_EQ(c.lookup(TuningKey::of(s, kGpu, Gemm::kFc1, 4))->tactic, "c");
}

// A problem of the whole file: nothing is used, one problem names the file.
void expect_file_refused(const TuningCache::Loaded& l, const std::string& says) {
  EXPECT_TRUE(l.cache.entries.empty());
  ASSERT_EQ(l.problems.size(), 1u);
  EXPECT_EQ(l.problems[0].file, kFile);
  EXPECT_EQ(l.problems[0].entry, -1);
  EXPECT_NE(l.problems[0].reason.find(says), std::string::npos) << l.problems[0].reason;
}

TEST(TuneCache, MalformedFilesAreRefusedWholeNamingTheFile) {
  expect_file_refused(TuningCache::parse("{not json", kFile, "fp"), "not JSON");
  expect_file_refused(TuningCache::parse("", kFile, "fp"), "not JSON");
  expect_file_refused(TuningCache::parse("[1, 2]", kFile, "fp"), "not a JSON object");
  json doc = valid_doc();
  doc["schema_version"] = kTuningSchemaVersion + 1;
  expect_file_refused(parse_doc(doc), std::to_string(kTuningSchemaVersion + 1));
  doc = valid_doc();
  doc["schema_version"] = "1";
  expect_file_refused(parse_doc(doc), "schema_version");
  doc = valid_doc();
  doc.erase("schema_version");
  expect_file_refused(parse_doc(doc), "schema_version");
  for (const char* field : {"fingerprint", "moekit_version", "moekit_commit", "routing"}) {
    doc = valid_doc();
    doc.erase(field);
    expect_file_refused(parse_doc(doc), field);
    doc = valid_doc();
    doc[field] = 3;
    expect_file_refused(parse_doc(doc), field);
  }
  doc = valid_doc();
  doc.erase("entries");
  expect_file_refused(parse_doc(doc), "entries");
  doc = valid_doc();
  doc["entries"] = json::object();
  expect_file_refused(parse_doc(doc), "entries");
}

TEST(TuneCache, AnotherFingerprintIsRefusedNamingBoth) {
  const TuningCache::Loaded l = parse_doc(valid_doc(), "this machine");
  expect_file_refused(l, "another environment");
  EXPECT_NE(l.problems[0].reason.find("this machine"), std::string::npos);
  EXPECT_NE(l.problems[0].reason.find("\"fp\""), std::string::npos);
  // An empty expectation does not check it.
  EXPECT_EQ(parse_doc(valid_doc(), "").cache.entries.size(), 1u);
  EXPECT_EQ(parse_doc(valid_doc(), "fp").cache.entries.size(), 1u);
}

// One bad entry between two good ones: it alone is dropped, with a problem naming its index.
void expect_entry_refused(const std::function<void(json&)>& spoil, const std::string& says) {
  json doc = valid_doc();
  json good = doc["entries"][0];
  json bad = good;
  spoil(bad);
  json second = good;
  second["bucket"] = 8;
  doc["entries"] = json::array({good, bad, second});
  const TuningCache::Loaded l = parse_doc(doc);
  EXPECT_EQ(l.cache.entries.size(), 2u) << says;
  ASSERT_EQ(l.problems.size(), 1u) << says;
  EXPECT_EQ(l.problems[0].file, kFile);
  EXPECT_EQ(l.problems[0].entry, 1);
  EXPECT_NE(l.problems[0].reason.find(says), std::string::npos) << l.problems[0].reason;
  EXPECT_NE(l.problems[0].text().find(std::string(kFile) + ": entry 1: "), std::string::npos);
}

TEST(TuneCache, BadEntriesAreDroppedOneByOneNamingTheEntry) {
  expect_entry_refused([](json& e) { e = 5; }, "not an object");
  for (const char* field : {"implementation",
                            "gemm",
                            "n",
                            "k",
                            "experts",
                            "global_experts",
                            "top_k",
                            "act_dtype",
                            "weight_format",
                            "group_size",
                            "zero_points",
                            "pre_quant_scale",
                            "activation",
                            "limit",
                            "alpha",
                            "beta",
                            "fc1_bias",
                            "fc2_bias",
                            "gate_up_layout",
                            "tp_size",
                            "ep_size",
                            "bucket",
                            "tactic",
                            "time_us",
                            "runner_up"})
    expect_entry_refused([&](json& e) { e.erase(field); }, field);
  // Wrong types.
  expect_entry_refused([](json& e) { e["n"] = "64"; }, "\"n\"");
  expect_entry_refused([](json& e) { e["n"] = 1.5; }, "\"n\"");
  expect_entry_refused([](json& e) { e["bucket"] = 0; }, "\"bucket\"");
  expect_entry_refused([](json& e) { e["experts"] = -8; }, "\"experts\"");
  expect_entry_refused([](json& e) { e["fc1_bias"] = 1; }, "\"fc1_bias\"");
  expect_entry_refused([](json& e) { e["limit"] = "7"; }, "\"limit\"");
  expect_entry_refused([](json& e) { e["tactic"] = 3; }, "\"tactic\"");
  expect_entry_refused([](json& e) { e["act_dtype"] = "bf17"; }, "bf17");
  expect_entry_refused([](json& e) { e["weight_format"] = "fp7"; }, "fp7");
  expect_entry_refused([](json& e) { e["activation"] = "tanh2"; }, "tanh2");
  expect_entry_refused([](json& e) { e["gate_up_layout"] = "diagonal"; }, "diagonal");
  // Unknown names.
  expect_entry_refused([](json& e) { e["implementation"] = "cuda.sm99.magic"; }, "cuda.sm99.magic");
  expect_entry_refused([](json& e) { e["gemm"] = "fc3"; }, "fc3");
  // Tactics are names: never an index, never empty.
  expect_entry_refused([](json& e) { e["tactic"] = "3"; }, "index");
  expect_entry_refused([](json& e) { e["tactic"] = ""; }, "empty");
  expect_entry_refused([](json& e) { e["runner_up"] = "12"; }, "index");
  // Times.
  expect_entry_refused([](json& e) { e["time_us"] = -1.0; }, "time_us");
  expect_entry_refused([](json& e) { e["time_us"] = 0; }, "time_us");
  expect_entry_refused([](json& e) { e["time_us"] = "fast"; }, "time_us");
  expect_entry_refused([](json& e) { e["runner_up_us"] = -2.0; }, "runner_up_us");
  expect_entry_refused([](json& e) { e.erase("runner_up_us"); }, "runner_up_us");
}

TEST(TuneCache, DuplicateEntriesKeepTheFirst) {
  json doc = valid_doc();
  json again = doc["entries"][0];
  again["tactic"] = "sm90.coop.128x256x64.c1x1";
  doc["entries"].push_back(again);
  const TuningCache::Loaded l = parse_doc(doc);
  ASSERT_EQ(l.cache.entries.size(), 1u);
  EXPECT_EQ(l.cache.entries[0].tactic, "sm90.coop.128x128x64.c1x1");
  ASSERT_EQ(l.problems.size(), 1u);
  EXPECT_EQ(l.problems[0].entry, 1);
  EXPECT_NE(l.problems[0].reason.find("repeats"), std::string::npos);
}

TEST(TuneCache, UnreadableFileIsAnIoErrorNamingThePath) {
  const std::string path = tmp_dir() + "/does_not_exist.json";
  try {
    TuningCache::load(path, "fp");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  // A folder cannot be read as a file either.
  EXPECT_THROW(TuningCache::load(tmp_dir(), "fp"), Error);
  // read_tuning reports it instead and chooses nothing.
  const TuningOutcome o = read_tuning(path, "fp", small_layer(), kGpu, nullptr, 1);
  EXPECT_EQ(o.file, path);
  EXPECT_TRUE(o.chosen.empty());
  ASSERT_EQ(o.problems.size(), 1u);
  EXPECT_EQ(o.problems[0].entry, -1);
  EXPECT_NE(o.problems[0].reason.find(path), std::string::npos);
}

TEST(TuneCache, SaveToAnUnwritablePathIsAnIoError) {
  try {
    cache_with("fp", {}).save(tmp_dir() + "/no/such/folder/t.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

// save() replaces the file through a temporary renamed onto it: a symlink planted at the path is
// replaced, never written through, and no temporary is left behind.
TEST(TuneCache, SaveReplacesASymlinkAndLeavesNoTemporary) {
  const std::string dir = tmp_dir() + "/save_atomic";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string victim = dir + "/victim.txt", path = dir + "/t.json";
  std::ofstream(victim) << "untouched";
  std::filesystem::create_symlink(victim, path);
  const TuningCache c = cache_with("fp", {});
  c.save(path);
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  std::ifstream v(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(v), {}), "untouched");
  std::ifstream f(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), c.to_json());
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2);  // victim.txt and t.json
}

TEST(TuneFallback, KnownTacticsAreChosenUnknownOnesReportedAndMissingOnesSilent) {
  const MoeSpec s = small_layer();  // buckets 1, 2, 4, 8, 16
  TuningCache c = cache_with(
      "fp", {entry_for(s, kGpu, Gemm::kFc1, 2, "good"), entry_for(s, kGpu, Gemm::kFc1, 8, "ghost"),
             entry_for(s, kGpu, Gemm::kFc2, 16, "good2"),
             // another layer's, and a bucket this layer never sees
             entry_for(s, "cpu.reference", Gemm::kFc1, 2, "good"),
             entry_for(s, kGpu, Gemm::kFc1, 32, "good")});
  std::vector<TuningProblem> problems;
  const auto known = [](Gemm g) {
    return g == Gemm::kFc1 ? std::vector<std::string>{"good"} : std::vector<std::string>{"good2"};
  };
  const TacticChoices chosen = choose_tactics(c, kFile, s, kGpu, known, 1, &problems);
  ASSERT_EQ(chosen.choices.size(), 2u);
  EXPECT_EQ(*chosen.find(Gemm::kFc1, 2), "good");
  EXPECT_EQ(chosen.find(Gemm::kFc1, 8), nullptr);   // the unknown one fell back
  EXPECT_EQ(chosen.find(Gemm::kFc1, 32), nullptr);  // above the cap: never looked up
  EXPECT_EQ(*chosen.find(Gemm::kFc2, 9), "good2");
  EXPECT_EQ(chosen.choices[0].time_us, 12.0);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].file, kFile);
  EXPECT_EQ(problems[0].entry, 1);
  EXPECT_NE(problems[0].reason.find("ghost"), std::string::npos);
  // Without a list every name counts (moekit resolve builds no engine).
  EXPECT_EQ(choose_tactics(c, kFile, s, kGpu, nullptr, 1, nullptr).choices.size(), 3u);
  // The data-parallel factor reaches the larger bucket.
  EXPECT_EQ(choose_tactics(c, kFile, s, kGpu, nullptr, 2, nullptr).choices.size(), 4u);
}

TEST(TuneRoutingProfile, ParsesUniformAndZipfRefusesTheRest) {
  EXPECT_EQ(tune::parse_routing_profile("uniform").zipf_s, 0.0);
  EXPECT_EQ(tune::parse_routing_profile("zipf").zipf_s, 1.0);
  EXPECT_EQ(tune::parse_routing_profile("zipf:1.5").zipf_s, 1.5);
  EXPECT_EQ(tune::parse_routing_profile("zipf:1.5").text(), "zipf:1.5");
  EXPECT_EQ(tune::RoutingProfile{}.text(), "uniform");
  for (const char* bad :
       {"", "zipf:", "zipf:0", "zipf:-1", "zipf:1x", "zipf:inf", "zipf:nan", "pareto", "Uniform"}) {
    try {
      tune::parse_routing_profile(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos);
    }
  }
}

TEST(TuneRoutingProfile, ZipfFavoursTheFirstExpertsWithoutRepeats) {
  MoeSpec s = small_layer();
  s.num_experts = 16;
  s.top_k = 4;
  s.routing.method = RoutingMethod::kExternal;
  std::vector<float> logits, weights;
  std::vector<int32_t> ids;
  tune::draw_zipf_routing(s, 2000, 1.2, 7, &logits, &ids, &weights);
  EXPECT_TRUE(logits.empty());
  ASSERT_EQ(ids.size(), 8000u);
  ASSERT_EQ(weights.size(), 8000u);
  std::vector<int> hits(16, 0);
  for (int64_t t = 0; t < 2000; ++t) {
    std::vector<int32_t> row(ids.begin() + t * 4, ids.begin() + t * 4 + 4);
    std::sort(row.begin(), row.end());
    EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t;
    for (int32_t e : row) {
      ASSERT_GE(e, 0);
      ASSERT_LT(e, 16);
      ++hits[e];
    }
  }
  EXPECT_GT(hits[0], 2 * hits[15]);  // skewed: expert 0 far more often than the last
  EXPECT_EQ(weights[0], 0.25f);
  // Logits for a computed routing: per token, expert 0's logit tops expert 15's most often.
  s.routing.method = RoutingMethod::kTopKSoftmax;
  tune::draw_zipf_routing(s, 2000, 1.2, 7, &logits, &ids, &weights);
  ASSERT_EQ(logits.size(), 2000u * 16);
  EXPECT_TRUE(ids.empty());
  int first_wins = 0;
  for (int64_t t = 0; t < 2000; ++t) first_wins += logits[t * 16] > logits[t * 16 + 15];
  EXPECT_GT(first_wins, 1000);
}

// Sets an environment variable for a scope, and restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::unique_ptr<MoeLayer> cpu_layer(const std::string& tuning_file, const Environment& env,
                                    int64_t dp = 1) {
  const MoeSpec s = small_layer();
  LayerOptions o;
  o.backend = "reference";
  o.environment = &env;
  o.tuning_file = tuning_file;
  o.tuning_dp_factor = dp;
  return MoeLayer::create(s, quant::make_random_weights(s, 1), o);
}

TEST(TuneLayer, EnvironmentVariableWithABadPathIsReportedAndFallsBack) {
  const Environment env = Environment::cpu_only();
  const std::string path = tmp_dir() + "/missing_tuning.json";
  ScopedEnv set(kTuningFileEnv, path.c_str());
  auto layer = cpu_layer("", env);
  const TuningOutcome& t = layer->resolution().tuning;
  EXPECT_EQ(t.file, path);
  EXPECT_TRUE(t.chosen.empty());
  ASSERT_EQ(t.problems.size(), 1u);
  EXPECT_NE(t.problems[0].text().find(path), std::string::npos);
  EXPECT_NE(layer->resolution().table().find("problem: " + path), std::string::npos);
  // The layer runs on its built-in choices.
  EXPECT_EQ(layer->implementation().id(), "cpu.reference");
}

TEST(TuneLayer, OptionBeatsTheEnvironmentVariableAndNoneMeansNoTuning) {
  const Environment env = Environment::cpu_only();
  const std::string good =
      write_file("empty_cache.json", cache_with(env.fingerprint(), {}).to_json());
  {
    ScopedEnv set(kTuningFileEnv, (tmp_dir() + "/missing.json").c_str());
    auto layer = cpu_layer(good, env);
    EXPECT_EQ(layer->resolution().tuning.file, good);
    EXPECT_TRUE(layer->resolution().tuning.problems.empty());
  }
  ScopedEnv unset(kTuningFileEnv, nullptr);
  auto layer = cpu_layer("", env);
  EXPECT_TRUE(layer->resolution().tuning.file.empty());
  EXPECT_EQ(layer->resolution().table().find("tuning:"), std::string::npos);
}

TEST(TuneLayer, MalformedAndForeignFilesFallBackWithTheReason) {
  ScopedEnv unset(kTuningFileEnv, nullptr);
  const Environment env = Environment::cpu_only();
  const std::string garbage = write_file("garbage.json", "{\"schema_version\": ");
  auto a = cpu_layer(garbage, env);
  ASSERT_EQ(a->resolution().tuning.problems.size(), 1u);
  EXPECT_NE(a->resolution().tuning.problems[0].reason.find("not JSON"), std::string::npos);
  const std::string foreign = write_file(
      "foreign.json",
      cache_with("another machine", {entry_for(small_layer(), "cpu.reference", Gemm::kFc1, 4, "x")})
          .to_json());
  auto b = cpu_layer(foreign, env);
  ASSERT_EQ(b->resolution().tuning.problems.size(), 1u);
  EXPECT_NE(b->resolution().tuning.problems[0].reason.find("another environment"),
            std::string::npos);
}

TEST(TuneLayer, ATacticTheEngineLacksIsReportedNeverUsed) {
  ScopedEnv unset(kTuningFileEnv, nullptr);
  const Environment env = Environment::cpu_only();
  // The CPU reference builds no tactics: any name is one it lacks.
  const std::string path = write_file(
      "ref.json", cache_with(env.fingerprint(), {entry_for(small_layer(), "cpu.reference",
                                                           Gemm::kFc2, 4, "sm90.gemv.tma64")})
                      .to_json());
  auto layer = cpu_layer(path, env);
  const TuningOutcome& t = layer->resolution().tuning;
  EXPECT_TRUE(t.chosen.empty());
  ASSERT_EQ(t.problems.size(), 1u);
  EXPECT_EQ(t.problems[0].entry, 0);
  EXPECT_NE(t.problems[0].reason.find("sm90.gemv.tma64"), std::string::npos);
  EXPECT_TRUE(layer->tactics(Gemm::kFc1).empty());
  layer->warmup();  // the reference: nothing to do
}

TEST(TuneLayer, DataParallelFactorBelowOneIsRefused) {
  const Environment env = Environment::cpu_only();
  try {
    cpu_layer("", env, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("0"), std::string::npos);
  }
}

TEST(TuneReport, TuningSectionRoundTripsThroughTheJsonReport) {
  ScopedEnv unset(kTuningFileEnv, nullptr);
  Resolution r = resolve(small_layer(), Environment::cpu_only(), "reference");
  r.tuning.file = "t.json";
  r.tuning.chosen = {{Gemm::kFc1, 4, "sm90.gemv.tma64+act", 12.5},
                     {Gemm::kFc2, 16, "sm90.coop.128x128x64.c1x1", 30.0}};
  r.tuning.problems = {{"t.json", 3, "names the tactic \"x\""}, {"t.json", -1, "whole"}};
  const std::string table = r.table();
  EXPECT_NE(table.find("fc1 up to 4 tokens: sm90.gemv.tma64+act"), std::string::npos) << table;
  EXPECT_NE(table.find("t.json: entry 3: names the tactic"), std::string::npos);
  const Resolution back = resolution_from_json(r.json());
  EXPECT_EQ(back.tuning.file, "t.json");
  ASSERT_EQ(back.tuning.chosen.size(), 2u);
  EXPECT_EQ(back.tuning.chosen[1].gemm, Gemm::kFc2);
  EXPECT_EQ(back.tuning.chosen[1].bucket, 16);
  EXPECT_EQ(back.tuning.chosen[1].tactic, "sm90.coop.128x128x64.c1x1");
  EXPECT_EQ(back.tuning.chosen[0].time_us, 12.5);
  ASSERT_EQ(back.tuning.problems.size(), 2u);
  EXPECT_EQ(back.tuning.problems[0].entry, 3);
  EXPECT_EQ(back.tuning.problems[1].reason, "whole");
  // Without a tuning file the report has no tuning section.
  const Resolution plain = resolve(small_layer(), Environment::cpu_only(), "reference");
  EXPECT_EQ(plain.json().find("\"tuning\""), std::string::npos);
  // A bad tuning section is refused like any other malformed report.
  json doc = json::parse(r.json());
  doc["tuning"]["chosen"][0]["gemm"] = "fc9";
  try {
    resolution_from_json(doc.dump());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("fc9"), std::string::npos);
  }
}

// The CLI.
testcmd::Ran moekit_cli(const std::string& args) {
  return testcmd::run(tmp_dir(), "env -u MOEKIT_TUNING_FILE " +
                                     testcmd::program("MOEKIT_TEST_CLI", MOEKIT_CLI_PATH) + " " +
                                     args);
}

TEST(TuneCli, ResolveShowsTheTacticsTheFileChose) {
  const MoeSpec qwen = find_preset("qwen3-30b-a3b").spec;
  MoeSpec keyed = qwen;
  keyed.max_tokens = 1;  // resolve's layer: one token unless --max-tokens
  const std::string fingerprint = Environment::detected().fingerprint();
  const std::string path = write_file(
      "resolve.json",
      cache_with(fingerprint, {entry_for(keyed, "cpu.reference", Gemm::kFc1, 1, "chosen.one")})
          .to_json());
  const testcmd::Ran r =
      moekit_cli("resolve --preset qwen3-30b-a3b --backend reference --tuning-file " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("fc1 up to 1 tokens: chosen.one"), std::string::npos) << r.out;
  const testcmd::Ran j =
      moekit_cli("resolve --preset qwen3-30b-a3b --backend reference --json --tuning-file " + path);
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(json::parse(j.out)["tuning"]["chosen"][0]["tactic"], "chosen.one");
  // A bad file is reported and resolve still answers.
  const testcmd::Ran bad =
      moekit_cli("resolve --preset qwen3-30b-a3b --tuning-file " + tmp_dir() + "/nope.json");
  EXPECT_EQ(bad.code, 0) << bad.err;
  EXPECT_NE(bad.out.find("problem: " + tmp_dir() + "/nope.json"), std::string::npos) << bad.out;
  // The environment variable names it too.
  const testcmd::Ran env =
      testcmd::run(tmp_dir(), "MOEKIT_TUNING_FILE=" + path + " " +
                                  testcmd::program("MOEKIT_TEST_CLI", MOEKIT_CLI_PATH) +
                                  " resolve --preset qwen3-30b-a3b --backend reference");
  EXPECT_NE(env.out.find("chosen.one"), std::string::npos) << env.out << env.err;
}

TEST(TuneCli, TuneRefusesBadFlagsAndMachinesWithoutADeviceImplementation) {
  // --out is required (a command-line error: 2).
  EXPECT_EQ(moekit_cli("tune --preset qwen3-30b-a3b").code, 2);
  const std::string out = tmp_dir() + "/tuned.json";
  for (const char* profile : {"zipf:0", "zipf:-1", "zipf:x", "pareto"}) {
    const testcmd::Ran r = moekit_cli("tune --preset qwen3-30b-a3b --routing-profile " +
                                      std::string(profile) + " --out " + out);
    EXPECT_EQ(r.code, 1) << profile;
    EXPECT_NE(r.err.find(profile), std::string::npos) << r.err;
    // bench takes the same profiles, refused the same way before anything is timed.
    const testcmd::Ran b = moekit_cli("bench --preset qwen3-30b-a3b --tokens 1 --routing-profile " +
                                      std::string(profile));
    EXPECT_EQ(b.code, 1) << profile;
    EXPECT_NE(b.err.find(profile), std::string::npos) << b.err;
  }
  const testcmd::Ran dp = moekit_cli("tune --preset qwen3-30b-a3b --dp-factor 0 --out " + out);
  EXPECT_EQ(dp.code, 1);
  EXPECT_NE(dp.err.find("--dp-factor"), std::string::npos) << dp.err;
  // Only a CUDA implementation is tuned: the CPU reference is refused with the reason.
  const testcmd::Ran ref =
      moekit_cli("tune --preset qwen3-30b-a3b --backend reference --out " + out);
  EXPECT_EQ(ref.code, 1);
  EXPECT_NE(ref.err.find("tune times a CUDA implementation"), std::string::npos) << ref.err;
#ifndef MOEKIT_WITH_CUDA
  const testcmd::Ran none = moekit_cli("tune --preset qwen3-30b-a3b --out " + out);
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("no CUDA"), std::string::npos) << none.err;
#endif
  EXPECT_FALSE(std::ifstream(out).good());  // nothing was written
}

TEST(TuneCli, RunAndBenchTakeATuningFile) {
  const testcmd::Ran run = moekit_cli(
      "run --preset qwen3-30b-a3b --backend reference --tokens 1 --hidden 64 --intermediate 32 "
      "--experts 8 --top-k 2 --tuning-file " +
      tmp_dir() + "/absent.json");
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("absent.json"), std::string::npos) << run.err;  // reported, fell back
  for (const char* sub : {"run", "bench", "resolve"}) {
    const testcmd::Ran help = moekit_cli(std::string(sub) + " --help");
    EXPECT_NE(help.out.find("--tuning-file"), std::string::npos) << sub;
  }
}

// bench --compare-tuning times a row with and without the file: refused, before any GPU work,
// without a file or with --trace / --json, which it does not produce.
TEST(TuneCli, CompareTuningNeedsAFileAndNothingElse) {
  const testcmd::Ran none = moekit_cli("bench --preset qwen3-30b-a3b --tokens 1 --compare-tuning");
  EXPECT_EQ(none.code, 1) << none.out << none.err;
  EXPECT_NE(none.err.find("--compare-tuning needs a tuning file"), std::string::npos) << none.err;
  const std::string file = tmp_dir() + "/absent.json";
  for (const char* extra : {"--trace 3", "--json out.json"}) {
    const testcmd::Ran r = moekit_cli(
        "bench --preset qwen3-30b-a3b --tokens 1 --compare-tuning "
        "--tuning-file " +
        file + " " + extra);
    EXPECT_EQ(r.code, 1) << extra;
    EXPECT_NE(r.err.find("--compare-tuning takes neither"), std::string::npos) << r.err;
  }
}

#ifdef MOEKIT_WITH_CUDA
// tune then bench --compare-tuning on a small layer: one row per token count with both times.
TEST(TuneCli, TuneThenCompareOnTheGpu) {
  const std::string reason = devtest::gpu_skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string shape = "--preset qwen3-30b-a3b --experts 8 --hidden 256 --intermediate 128 ";
  const std::string file = tmp_dir() + "/small-tuned.json";
  const testcmd::Ran tune =
      moekit_cli("tune " + shape + "--max-tokens 64 --budget-ms 1 --out " + file);
  ASSERT_EQ(tune.code, 0) << tune.out << tune.err;
  const testcmd::Ran bench =
      moekit_cli("bench " + shape + "--tokens 64 --tuning-file " + file + " --compare-tuning");
  ASSERT_EQ(bench.code, 0) << bench.out << bench.err;
  EXPECT_NE(bench.out.find("builtin_us"), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("fc1 "), std::string::npos) << bench.out;  // the file's tactics at T
}
#endif

TEST(RankTactics, TheBuiltInPickStaysFirstWithinTheMargin) {
  using tune::rank_tactics;
  // 0.5% faster than the built-in: noise, the pick stays; the rest fastest first.
  auto r = rank_tactics({{"a", 100.0}, {"b", 99.5}, {"c", 101.0}}, "a");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].tactic, "a");
  EXPECT_EQ(r[1].tactic, "b");
  EXPECT_EQ(r[2].tactic, "c");
  // 2% faster: the tuned tactic wins, the built-in is the runner-up.
  r = rank_tactics({{"a", 100.0}, {"b", 98.0}, {"c", 99.5}}, "a");
  EXPECT_EQ(r[0].tactic, "b");
  EXPECT_EQ(r[1].tactic, "c");
  EXPECT_EQ(r[2].tactic, "a");
  // Exactly at the margin the built-in stays.
  r = rank_tactics({{"b", 99.0}, {"a", 100.0}}, "a", 0.01);
  EXPECT_EQ(r[0].tactic, "a");
}

TEST(RankTactics, WithoutAKnownBuiltInTheFastestIsFirst) {
  using tune::rank_tactics;
  for (const std::string builtin : {"", "not-built"}) {
    const auto r = rank_tactics({{"a", 100.0}, {"b", 99.9}, {"c", 99.9}}, builtin);
    EXPECT_EQ(r[0].tactic, "b");  // ties keep their order
    EXPECT_EQ(r[1].tactic, "c");
    EXPECT_EQ(r[2].tactic, "a");
  }
  EXPECT_TRUE(rank_tactics({}, "a").empty());
}

}  // namespace
}  // namespace moekit
