// The test harness's program lookup: an environment variable, where set, names the program.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support/command.hpp"

namespace {

TEST(TestProgram, EnvironmentNamesTheProgramWhereSet) {
  const char* var = "MOEKIT_TEST_PROGRAM_LOOKUP";
  ASSERT_EQ(unsetenv(var), 0);
  EXPECT_EQ(testcmd::program(var, "/built/moekit"), "/built/moekit");
  ASSERT_EQ(setenv(var, "", 1), 0);  // empty counts as unset
  EXPECT_EQ(testcmd::program(var, "/built/moekit"), "/built/moekit");
  ASSERT_EQ(setenv(var, "/carried/moekit", 1), 0);
  EXPECT_EQ(testcmd::program(var, "/built/moekit"), "/carried/moekit");
  unsetenv(var);
}

}  // namespace
