#include "moekit/status.hpp"

namespace moekit {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kInvalidSpec:
      return "invalid_spec";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kFormatMismatch:
      return "format_mismatch";
    case ErrorCode::kBadFile:
      return "bad_file";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kCuda:
      return "cuda";
    case ErrorCode::kComm:
      return "comm";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace moekit
