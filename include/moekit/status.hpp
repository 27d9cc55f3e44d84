// Errors as values with reasons, and the one exception type thrown at the API boundary.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace moekit {

// Closed list of error kinds; tests assert on these, never on message text.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a value the caller passed is out of range or inconsistent
  kInvalidSpec = 2,      // MoeSpec::validate() found violations
  kUnsupported = 3,      // no implementation can run this (resolver said why)
  kFormatMismatch = 4,   // weights of another format than the layer was built for
  kBadFile = 5,          // a file is malformed, truncated, or lacks a tensor
  kIo = 6,               // the OS refused to read or write a file
  kCuda = 7,             // a CUDA runtime call failed
  kComm = 8,             // a collective failed
  kNotFound = 9,         // a name (preset, implementation, tactic) is unknown
  kInternal = 10,        // a bug in moekit
};

const char* to_string(ErrorCode code);

// A status: ok, or an error code with one sentence naming the offending value.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Thrown by the public API; carries the same code and sentence as the Status it came from.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  explicit Error(const Status& s) : Error(s.code(), s.message()) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error when `s` is not ok.
inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw Error(s);
}

}  // namespace moekit
