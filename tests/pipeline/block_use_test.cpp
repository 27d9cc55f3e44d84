// How many blocks of a kernel fit on an SM beside another kernel's block
// (pipeline/block_use.hpp), on an H200's limits.
#include <gtest/gtest.h>

#include "pipeline/block_use.hpp"

namespace {

using moekit::pipeline::blocks_beside;
using moekit::pipeline::BlockUse;
using moekit::pipeline::SmLimits;

constexpr SmLimits kH200{2048, 65536, 32, 233472, 1024};

// The case this exists for: three ring blocks of the TMA GEMV fill an SM's shared memory, so
// the permute's single block (16 warps, ~21 KB) leaves room for two.
TEST(BlocksBeside, SharedMemoryLeavesTwoOfThreeRingBlocks) {
  const BlockUse ring{160, 64, 75000};
  EXPECT_EQ(blocks_beside(ring, 3, BlockUse{512, 64, 21000}, kH200), 2);
  EXPECT_EQ(blocks_beside(ring, 3, BlockUse{64, 32, 1024}, kH200), 3);  // a small one fits
  EXPECT_EQ(blocks_beside(ring, 3, BlockUse{}, kH200), 3);              // none: all of them
}

TEST(BlocksBeside, RegistersAndThreadsBind) {
  // 512 threads of 128 registers hold all 65536: nothing fits beside them.
  EXPECT_EQ(blocks_beside(BlockUse{128, 32, 0}, 16, BlockUse{512, 128, 0}, kH200), 0);
  // 1024 threads beside 512: one more.
  EXPECT_EQ(blocks_beside(BlockUse{1024, 32, 0}, 2, BlockUse{512, 32, 0}, kH200), 1);
}

TEST(BlocksBeside, RegistersCountInUnitsPerWarp) {
  // 57 registers x 32 lanes = 1824, allocated as 2048: 16 one-warp blocks in the 32768 left
  // beside 1024 threads of 32 registers, not 17.
  EXPECT_EQ(blocks_beside(BlockUse{32, 57, 0}, 32, BlockUse{1024, 32, 0}, kH200), 16);
}

TEST(BlocksBeside, TheOtherBlockTakesABlockSlot) {
  EXPECT_EQ(blocks_beside(BlockUse{32, 16, 0}, 32, BlockUse{32, 16, 0}, kH200), 31);
}

TEST(BlocksBeside, AnOtherBlockLargerThanTheSmLeavesNone) {
  EXPECT_EQ(blocks_beside(BlockUse{32, 16, 0}, 32, BlockUse{4096, 16, 0}, kH200), 0);
  EXPECT_EQ(blocks_beside(BlockUse{32, 16, 0}, 32, BlockUse{32, 16, 240000}, kH200), 0);
}

}  // namespace
