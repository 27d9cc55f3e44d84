// The environment: probed once without crashing, and a fingerprint that moves with what changes
// the choice or the speed, and with nothing else.
#include "moekit/environment.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <string>
#include <vector>

#include "registry/registry_fixtures.hpp"

namespace moekit::registry::test {
namespace {

TEST(Environment, DetectedIsProbedOnceAndNeverEmptyHanded) {
  const Environment& a = Environment::detected();
  const Environment& b = Environment::detected();
  EXPECT_EQ(&a, &b) << "frozen: one instance per process";
  EXPECT_FALSE(a.library_version.empty());
  if (a.gpus.empty()) EXPECT_FALSE(a.probe_note.empty()) << "no GPU must come with a reason";
#ifdef MOEKIT_WITH_CUDA
  EXPECT_TRUE(a.built_with_cuda);
  EXPECT_GT(a.cuda_runtime_version, 0) << "the runtime is linked in, it knows its version";
#else
  EXPECT_FALSE(a.built_with_cuda);
  EXPECT_TRUE(a.gpus.empty());
  EXPECT_NE(a.probe_note.find("no CUDA"), std::string::npos) << a.probe_note;
#endif
  for (const GpuInfo& g : a.gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.sm, 0);
  }
}

TEST(Environment, CpuOnlyAndSm) {
  Environment cpu = Environment::cpu_only();
  EXPECT_TRUE(cpu.gpus.empty());
  EXPECT_EQ(cpu.sm(), 0);
  Environment gpu = h200_env();
  EXPECT_EQ(gpu.sm(), 90);
  EXPECT_EQ(gpu.sm(0), 90);
  EXPECT_EQ(gpu.sm(1), 0);
  EXPECT_EQ(gpu.sm(-1), 0);
}

TEST(Environment, FingerprintIsStableAndHashed) {
  Environment e = h200_env();
  EXPECT_EQ(e.fingerprint(), h200_env().fingerprint());
  const std::string h = e.fingerprint_hash();
  ASSERT_EQ(h.size(), 16u);
  for (char c : h)
    EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(c)) << h;
  EXPECT_EQ(h, h200_env().fingerprint_hash());
  EXPECT_NE(e.fingerprint().find("NVIDIA H200"), std::string::npos) << "human-readable";
}

struct Change {
  std::string name;
  std::function<void(Environment&)> apply;
};

TEST(Environment, FingerprintChangesWhenAFieldThatMattersChanges) {
  const std::vector<Change> matters = {
      {"GPU name", [](Environment& e) { e.gpus[0].name = "NVIDIA H100 80GB HBM3"; }},
      {"SM", [](Environment& e) { e.gpus[0].sm = 100; }},
      {"multiprocessors (a MIG slice)", [](Environment& e) { e.gpus[0].multiprocessors = 16; }},
      {"GPU count", [](Environment& e) { e.gpus.push_back(h200()); }},
      {"no GPU", [](Environment& e) { e.gpus.clear(); }},
      {"CUDA runtime", [](Environment& e) { e.cuda_runtime_version = 12080; }},
      {"CUDA driver", [](Environment& e) { e.cuda_driver_version = 12090; }},
      {"CUDA build", [](Environment& e) { e.built_with_cuda = false; }},
      {"CUTLASS build", [](Environment& e) { e.built_with_cutlass = false; }},
      {"NCCL build", [](Environment& e) { e.built_with_nccl = true; }},
      {"library version", [](Environment& e) { e.library_version = "0.2.0"; }},
  };
  const Environment base = h200_env();
  for (const Change& c : matters) {
    Environment e = h200_env();
    c.apply(e);
    EXPECT_NE(e.fingerprint(), base.fingerprint()) << c.name;
    EXPECT_NE(e.fingerprint_hash(), base.fingerprint_hash()) << c.name;
  }
}

TEST(Environment, FingerprintIgnoresWhatDoesNotMatter) {
  const std::vector<Change> ignored = {
      {"memory", [](Environment& e) { e.gpus[0].memory_bytes = 80'000'000'000; }},
      {"L2", [](Environment& e) { e.gpus[0].l2_bytes = 50 * 1024 * 1024; }},
      {"probe note", [](Environment& e) { e.probe_note = "probed at noon"; }},
  };
  const Environment base = h200_env();
  for (const Change& c : ignored) {
    Environment e = h200_env();
    c.apply(e);
    EXPECT_EQ(e.fingerprint(), base.fingerprint()) << c.name;
    EXPECT_EQ(e.fingerprint_hash(), base.fingerprint_hash()) << c.name;
  }
}

TEST(Environment, GpuOrderMatters) {
  Environment a = h200_env();
  a.gpus.push_back(h200());
  a.gpus[1].name = "NVIDIA H100";
  a.gpus[1].sm = 90;
  Environment b = a;
  std::swap(b.gpus[0], b.gpus[1]);
  EXPECT_NE(a.fingerprint(), b.fingerprint()) << "device 0 is what the checks read";
}

}  // namespace
}  // namespace moekit::registry::test
