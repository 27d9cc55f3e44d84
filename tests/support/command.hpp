// Running a built program from a test: its exit code and what it printed.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

namespace testcmd {

struct Ran {
  int code = -1;  // the exit status, -1 if it did not exit
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The program a test runs: the path in environment variable `env` where it is set (binaries
// built on another machine and carried: scripts/device.sh prebuilt), else where CMake built it.
inline std::string program(const char* env, const char* built) {
  const char* path = std::getenv(env);
  return path != nullptr && *path != '\0' ? path : built;
}

// One folder per test under MOEKIT_TEST_TMP/<area>: ctest runs tests in parallel processes.
inline std::string test_dir(const std::string& area) {
  const std::string d = std::string(MOEKIT_TEST_TMP) + "/" + area + "/" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(d);
  return d;
}

// Runs the shell command `cmd` with its output in `dir` (out.txt, err.txt).
inline Ran run(const std::string& dir, const std::string& cmd) {
  const int status = std::system((cmd + " >" + dir + "/out.txt 2>" + dir + "/err.txt").c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir + "/out.txt");
  r.err = slurp(dir + "/err.txt");
  return r;
}

}  // namespace testcmd
