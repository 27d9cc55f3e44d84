#include "pipeline/block_use.hpp"

#include <algorithm>

namespace moekit::pipeline {
namespace {
constexpr int kWarp = 32;
constexpr int kRegUnit = 256;           // registers allocated per warp in units of this
constexpr std::size_t kSmemUnit = 128;  // shared memory allocated per block in units of this

int warps(const BlockUse& b) { return (b.threads + kWarp - 1) / kWarp; }
int regs(const BlockUse& b) {
  const int per_warp = (b.regs_per_thread * kWarp + kRegUnit - 1) / kRegUnit * kRegUnit;
  return warps(b) * per_warp;
}
std::size_t smem(const BlockUse& b, const SmLimits& sm) {
  const std::size_t bytes = b.smem + sm.smem_reserved_per_block;
  return (bytes + kSmemUnit - 1) / kSmemUnit * kSmemUnit;
}
// How many of `b` fit in `left` of a resource each of them takes `each` of (no limit at 0).
template <typename T>
int fit(T left, T each) {
  return each > 0 ? static_cast<int>(left / each) : 1 << 30;
}
}  // namespace

int blocks_beside(const BlockUse& ours, int per_sm, const BlockUse& other, const SmLimits& sm) {
  if (other.threads <= 0) return per_sm;
  const int threads_left = sm.threads - warps(other) * kWarp;
  const int regs_left = sm.regs - regs(other);
  const std::size_t other_smem = smem(other, sm);
  if (threads_left < 0 || regs_left < 0 || other_smem > sm.smem) return 0;
  int n = std::min(per_sm, sm.blocks - 1);
  n = std::min(n, fit(threads_left, warps(ours) * kWarp));
  n = std::min(n, fit(regs_left, regs(ours)));
  n = std::min(n, fit(sm.smem - other_smem, smem(ours, sm)));
  return std::max(n, 0);
}

}  // namespace moekit::pipeline
