// Asserting on a moekit::Error: its ErrorCode, and that its message names the values it should.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moekit/status.hpp"

namespace moekit::test {

// Runs `fn`, expecting Error(code) whose message holds each of `needles`.
template <class Fn>
void expect_error(ErrorCode code, const std::vector<std::string>& needles, Fn&& fn) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' lacks '" << n << "'";
  }
}

}  // namespace moekit::test
