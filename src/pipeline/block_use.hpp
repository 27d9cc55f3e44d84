#pragma once
// What one block of a kernel holds of an SM, and how many blocks of another kernel still fit
// beside it. A kernel launched with PDL that starts at an earlier kernel's flag shares one SM
// with that kernel's block until it ends: a grid sized for the whole device then leaves a block
// waiting for the earlier one's end (its first item starting late, on the critical path).
#include <cstddef>

#include "moekit/status.hpp"

namespace moekit::pipeline {

struct BlockUse {
  int threads = 0;  // 0: no block
  int regs_per_thread = 0;
  std::size_t smem = 0;  // static + dynamic shared memory, bytes
};

// One SM's resources, as the occupancy calculator counts them.
struct SmLimits {
  int threads = 0;
  int regs = 0;
  int blocks = 0;
  std::size_t smem = 0;
  std::size_t smem_reserved_per_block = 0;
};

// How many blocks like `ours` fit on one SM next to one block like `other`, at most `per_sm`
// (what fits without it). Registers are counted per warp in 256-register units and shared
// memory in 128-byte units, as the hardware allocates them.
int blocks_beside(const BlockUse& ours, int per_sm, const BlockUse& other, const SmLimits& sm);

#ifdef MOEKIT_WITH_CUDA
// A kernel's block at `threads` threads and `dynamic_smem` bytes (cudaFuncGetAttributes: no
// device sync).
Status block_use_of(const void* kernel, int threads, std::size_t dynamic_smem, BlockUse& out);
Status sm_limits(int device, SmLimits& out);
#endif

}  // namespace moekit::pipeline
