// Device helper of the programmatic-dependent-launch tests: a "slow writer" kernel calls it first,
// so its dependent launches at once and runs its pre-wait part while the writer still holds the
// real data back for ~ns nanoseconds (then writes it).
#pragma once
#include <cstdint>

namespace moekit::devtest {

__device__ inline void launch_dependents_then_spin(long long ns) {
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < static_cast<uint64_t>(ns));
  }
  __syncthreads();
}

}  // namespace moekit::devtest
