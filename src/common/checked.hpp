// Products of sizes (tokens, hidden, intermediate, experts, top-k, group size) in 64-bit
// arithmetic, checked: the one place a size product is guarded against overflow.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "moekit/status.hpp"

namespace moekit {

// The product of non-negative factors, or nullopt where a factor is negative or the product
// overflows int64.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return std::nullopt;
  }
  return p;
}

// "a x b x c", for messages that name the factors.
inline std::string factors_text(std::initializer_list<int64_t> factors) {
  std::string s;
  for (int64_t f : factors) s += (s.empty() ? "" : " x ") + std::to_string(f);
  return s;
}

// The product, or Error(kInvalidArgument) naming `what` and the factors where it overflows.
inline int64_t product_or_throw(std::initializer_list<int64_t> factors, const std::string& what) {
  const std::optional<int64_t> p = checked_product(factors);
  if (!p)
    throw Error(ErrorCode::kInvalidArgument, what + " (" + factors_text(factors) +
                                                 ") is negative or overflows 64-bit arithmetic");
  return *p;
}

}  // namespace moekit
