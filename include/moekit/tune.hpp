// Measured GEMM tactics: the tuning cache (`moekit tune` writes it, a layer reads it), its key,
// the token buckets it is measured at, and the tactic choices the engines read.
//
// A tuning file is readable JSON (schema kTuningSchemaVersion): the environment fingerprint it
// was measured on, moekit's version and commit, the routing profile, and one entry per
// (implementation, GEMM, shapes and everything else that changes the best tactic, token bucket)
// with the winning tactic's name, its time, and the runner-up. Tactics are stored by name, never
// by index. Loading never throws on bad content: every problem names the file, the entry and the
// reason, and whatever is refused falls back to the engine's built-in choice.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/spec.hpp"
#include "moekit/types.hpp"

namespace moekit {

// The layer's two GEMMs.
enum class Gemm : int { kFc1 = 1, kFc2 = 2 };
const char* to_string(Gemm g);  // "fc1", "fc2"
std::optional<Gemm> gemm_from_string(std::string_view s);

// One tuned choice: at up to `bucket` tokens (and more than the next smaller bucket), `gemm`
// runs `tactic`.
struct TacticChoice {
  Gemm gemm = Gemm::kFc1;
  int64_t bucket = 0;
  std::string tactic;
  double time_us = 0.0;  // what the tuner measured (0: not known)
};

// What the engines read: per GEMM and bucket, the tactic to run instead of their built-in pick.
// Plain data, no JSON: the engines depend on this alone.
struct TacticChoices {
  std::vector<TacticChoice> choices;
  // The tactic for a forward of `tokens` tokens: the choice of the smallest bucket >= tokens for
  // `gemm`; null where there is none (the engine's built-in pick runs).
  const std::string* find(Gemm gemm, int64_t tokens) const;
  bool empty() const { return choices.empty(); }
};

inline constexpr int kTuningSchemaVersion = 1;

// The token buckets a layer is tuned at: powers of two below the cap, then the cap itself, where
// the cap is max_tokens x dp_factor (the tokens a rank's experts can see when data-parallel
// ranks send it theirs; 1 without). Throws Error(kInvalidArgument) naming the value when either
// is below 1 or their product overflows.
std::vector<int64_t> tuning_buckets(int64_t max_tokens, int64_t dp_factor = 1);

// Everything that changes which tactic is fastest for one GEMM of one layer. Fields that do not
// (max_tokens, the routing method and its parameters, the TP / EP rank) are left out, so layers
// that differ only there share entries. n, k and experts are the GEMM's local shape after TP/EP
// sharding (FC1: n = local fc1 rows, k = hidden; FC2: n = hidden, k = local intermediate).
struct TuningKey {
  std::string implementation;
  Gemm gemm = Gemm::kFc1;
  int64_t n = 0, k = 0, experts = 0;  // local
  int64_t global_experts = 0, top_k = 0;
  DType act_dtype = DType::kBFloat16;
  WeightFormat weight_format = WeightFormat::kBF16;
  int group_size = 0;  // grouped integer formats only, else 0
  bool zero_points = false, pre_quant_scale = false;
  ActivationKind activation = ActivationKind::kSwiGLU;
  // The epilogue fuses these, so they change the kernel: compared bit for bit.
  std::optional<float> limit, alpha, beta;
  bool fc1_bias = false, fc2_bias = false;
  GateUpLayout gate_up_layout = GateUpLayout::kHalves;
  int tp_size = 1, ep_size = 1;
  int64_t bucket = 0;

  // The key of `gemm` of `spec` (which must be valid) on implementation `implementation`.
  static TuningKey of(const MoeSpec& spec, const std::string& implementation, Gemm gemm,
                      int64_t bucket);
  bool operator==(const TuningKey& o) const;
  bool operator!=(const TuningKey& o) const { return !(*this == o); }
  std::string text() const;  // one line, for messages
};

struct TuningEntry {
  TuningKey key;
  std::string tactic;
  double time_us = 0.0;
  std::string runner_up;      // empty: only one tactic was measured
  double runner_up_us = 0.0;  // 0 where runner_up is empty
};

// One thing wrong with a tuning file: the file, the entry (its index in "entries"; -1: the
// file as a whole, whose entries are then all refused) and why, naming the value.
struct TuningProblem {
  std::string file;
  int entry = -1;
  std::string reason;
  std::string text() const;  // "<file>: entry <i>: <reason>" or "<file>: <reason>"
};

struct TuningCache {
  int schema_version = kTuningSchemaVersion;
  std::string fingerprint;  // Environment::fingerprint() of the machine it was measured on
  std::string moekit_version, moekit_commit;
  std::string routing = "uniform";  // the routing profile the rows were drawn from
  std::vector<TuningEntry> entries;

  struct Loaded;
  // Parses `text` (named `file` in problems). A file that is not JSON, has another schema
  // version or lacks its header fields, or whose fingerprint is not `expected_fingerprint`
  // (empty: not checked), yields no entries and one problem; an entry with a missing field, a
  // field of the wrong type, an unknown implementation or GEMM, a tactic that is not a name
  // (empty, or digits: an index), a time that is not finite and positive, or the key of an
  // earlier entry is dropped with a problem naming it. Never throws.
  static Loaded parse(const std::string& text, const std::string& file,
                      const std::string& expected_fingerprint);
  // Reads and parses `path`. Throws Error(kIo) naming the path when it cannot be read;
  // bad content is reported as parse() does.
  static Loaded load(const std::string& path, const std::string& expected_fingerprint);

  std::string to_json() const;
  // Writes to_json() to `path` through a temporary beside it renamed onto it (a reader sees the
  // old file or the new one); Error(kIo) naming the path when it cannot.
  void save(const std::string& path) const;

  const TuningEntry* lookup(const TuningKey& key) const;
  // Adds `entry`, replacing one with the same key.
  void put(const TuningEntry& entry);
};

struct TuningCache::Loaded {
  TuningCache cache;
  std::vector<TuningProblem> problems;
};

// The fallback rule: for each GEMM of `spec` on `implementation` and each of its buckets
// (tuning_buckets(spec.max_tokens, dp_factor)), the cache's entry where there is one whose
// tactic is one of `known_tactics(gemm)` (the names the engine built; null: any name); a missing
// entry keeps the engine's built-in pick silently, an entry with a tactic the engine lacks keeps it
// too and adds a problem naming the entry (`file`, and its index in cache.entries).
TacticChoices choose_tactics(const TuningCache& cache, const std::string& file, const MoeSpec& spec,
                             const std::string& implementation,
                             const std::function<std::vector<std::string>(Gemm)>& known_tactics,
                             int64_t dp_factor, std::vector<TuningProblem>* problems);

// What a tuning file changed for one layer: the file, the tactics it chose per GEMM and bucket
// (every other GEMM and bucket keeps the engine's built-in pick), and every problem with it
// (each one fell back). `file` empty: no tuning file was given.
struct TuningOutcome {
  std::string file;
  std::vector<TacticChoice> chosen;
  std::vector<TuningProblem> problems;
};

// Reads `file` (TuningCache::load, checked against `fingerprint`) and applies choose_tactics
// for `spec` on `implementation`. Never throws for the file: an unreadable one is a problem of
// the file as a whole. A null known_tactics accepts every tactic name (`moekit resolve`, which
// builds no engine; the layer checks them against its engine).
TuningOutcome read_tuning(const std::string& file, const std::string& fingerprint,
                          const MoeSpec& spec, const std::string& implementation,
                          const std::function<std::vector<std::string>(Gemm)>& known_tactics,
                          int64_t dp_factor);

// The environment variable a layer reads the tuning file's path from when LayerOptions names
// none.
inline constexpr const char* kTuningFileEnv = "MOEKIT_TUNING_FILE";

}  // namespace moekit
