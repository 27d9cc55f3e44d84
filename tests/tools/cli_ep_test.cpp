// `moekit run --ep-size N` and `moekit bench --ep-size N` without --ep-rank read the launcher's
// environment and refuse, with the variable or the sizes named, when it is missing or
// inconsistent.
#include <gtest/gtest.h>

#include <string>

#include "support/command.hpp"

namespace {

testcmd::Ran moekit_with_env(const std::string& env, const std::string& args,
                             const std::string& command = "run") {
  const std::string dir = testcmd::test_dir("cli_ep");
  // env -u: the test's own launcher variables (if any) must not leak in.
  return testcmd::run(dir,
                      "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u OMPI_COMM_WORLD_RANK "
                      "-u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK -u MASTER_PORT " +
                          env + " " + testcmd::program("MOEKIT_TEST_CLI", MOEKIT_CLI_PATH) + " " +
                          command +
                          " --preset mixtral-8x7b --hidden 128 --intermediate 128 "
                          "--tokens 4 --backend reference " +
                          args);
}

TEST(CliEp, WithoutALauncherSaysHowToStartIt) {
  const auto r = moekit_with_env("", "--ep-size 2");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("world size 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("torchrun --no-python --nproc-per-node 2"), std::string::npos) << r.err;
}

TEST(CliEp, BenchWithoutALauncherSaysHowToStartIt) {
  const auto r = moekit_with_env("", "--ep-size 2", "bench");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("moekit bench --ep-size 2"), std::string::npos) << r.err;
}

TEST(CliEp, BenchJsonIsRefusedUnderALauncherForNow) {
  const auto r = moekit_with_env("", "--ep-size 2 --json out.json", "bench");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--json"), std::string::npos) << r.err;
}

TEST(CliEp, BadLauncherVariablesAreNamed) {
  struct Case {
    std::string env, named;
  } cases[] = {
      {"RANK=one WORLD_SIZE=2 LOCAL_RANK=0", "RANK='one'"},
      {"RANK=2 WORLD_SIZE=2 LOCAL_RANK=0", "RANK=2"},
      {"RANK=0 WORLD_SIZE=2", "LOCAL_RANK"},
      {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=x OMPI_COMM_WORLD_LOCAL_RANK=0",
       "OMPI_COMM_WORLD_SIZE='x'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.env);
    const auto r = moekit_with_env(c.env, "--ep-size 2");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(c.named), std::string::npos) << r.err;
  }
}

TEST(CliEp, FilesAreRefusedUnderALauncherForNow) {
  const auto r = moekit_with_env("", "--ep-size 2 --output out.safetensors");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--output"), std::string::npos) << r.err;
}

TEST(CliEp, PartialShareOfOneRankStillRunsWithEpRank) {
  const auto r = moekit_with_env("", "--ep-size 2 --ep-rank 1");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
}

}  // namespace
