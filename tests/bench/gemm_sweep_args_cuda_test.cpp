// moekit_gemm_sweep refuses bad arguments and environment with one named line and exit code 2,
// before it touches the GPU (so these run on machines without one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

namespace {

struct Ran {
  int code = -1;
  std::string err;
};

Ran sweep(const std::string& env, const std::string& args) {
  const std::string d = std::string(MOEKIT_TEST_TMP) + "/sweep/" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(d);
  const std::string cmd =
      env + " " + std::string(MOEKIT_SWEEP_PATH) + " " + args + " >/dev/null 2>" + d + "/err.txt";
  const int status = std::system(cmd.c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(d + "/err.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  return r;
}

TEST(GemmSweepArgs, RefusesAnUnknownPreset) {
  const Ran r = sweep("", "16 qwen3-30b-a3b,llama9");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown preset 'llama9'"), std::string::npos) << r.err;
}

TEST(GemmSweepArgs, RefusesATokenCountThatIsNotAPositiveInteger) {
  for (const char* bad : {"0", "-8", "12x", "abc", "2000000"}) {
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

}  // namespace
