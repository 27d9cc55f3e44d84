// moekit_gemm_sweep refuses bad arguments and environment with one named line and exit code 2,
// before it touches the GPU (so these run on machines without one).
#include <gtest/gtest.h>

#include <string>

#include "support/command.hpp"

namespace {

using testcmd::Ran;

Ran sweep(const std::string& env, const std::string& args) {
  return testcmd::run(
      testcmd::test_dir("sweep"),
      env + " " + testcmd::program("MOEKIT_TEST_SWEEP", MOEKIT_SWEEP_PATH) + " " + args);
}

TEST(GemmSweepArgs, RefusesAnUnknownPreset) {
  const Ran r = sweep("", "16 qwen3-30b-a3b,llama9");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown preset 'llama9'"), std::string::npos) << r.err;
}

TEST(GemmSweepArgs, RefusesATokenCountThatIsNotAPositiveInteger) {
  for (const char* bad : {"0", "-8", "12x", "abc", "2000000", ""}) {  // "": a trailing comma
    const Ran r = sweep("", std::string("'1,") + bad + "'");
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find(std::string("token count '") + bad + "'"), std::string::npos) << r.err;
  }
}

TEST(GemmSweepArgs, RefusesAnUnknownRouting) {
  const Ran r = sweep("MOEKIT_SWEEP_ROUTING=skewed", "16");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("MOEKIT_SWEEP_ROUTING 'skewed'"), std::string::npos) << r.err;
}

TEST(GemmSweepArgs, RefusesATacticThatIsNotBuilt) {
  for (const char* bad : {"sm90.coop.512x512x64.c1x1", "sm90.coop.128x128x64.c1x1+act", ""}) {
    const Ran r =
        sweep(std::string("MOEKIT_SWEEP_TACTICS='sm90.coop.128x128x64.c1x1,") + bad + "'", "16");
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find(std::string("MOEKIT_SWEEP_TACTICS names '") + bad + "'"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("not a built tactic (sm90."), std::string::npos) << r.err;
  }
}

TEST(GemmSweepArgs, RefusesAnUnknownGemm) {
  const Ran r = sweep("MOEKIT_SWEEP_GEMMS=fc1,fc3", "16");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("MOEKIT_SWEEP_GEMMS names 'fc3', which is not a GEMM (fc1, fc1+act, fc2)"),
            std::string::npos)
      << r.err;
}

}  // namespace
