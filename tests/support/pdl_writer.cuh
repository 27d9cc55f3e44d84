// Device helpers of the programmatic-dependent-launch tests: a "slow writer" kernel calls
// launch_dependents_then_spin first, so its dependent launches at once and runs its pre-wait part
// while the writer still holds the real data back for ~ns nanoseconds (then writes it).
#pragma once
#include <cstdint>

namespace moekit::devtest {

// Block 0's thread 0 spins ~ns nanoseconds while the block waits at a barrier.
__device__ inline void spin_ns(long long ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < static_cast<uint64_t>(ns));
  }
  __syncthreads();
}

__device__ inline void launch_dependents_then_spin(long long ns) {
  asm volatile("griddepcontrol.launch_dependents;");
  spin_ns(ns);
}

}  // namespace moekit::devtest
