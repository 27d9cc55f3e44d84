// `moekit bench --trace`: how kernel records of graph replays become per-kernel medians.
#include <gtest/gtest.h>

#include "kernel_trace.hpp"
#include "moekit/status.hpp"

namespace moekit::cli {
namespace {

// Replay r of a 3-kernel graph starting at r * 1000 ns: "a" [0, 100), "b" [90, 300) (it
// overlaps a by 10 ns, as through PDL), "c" [310 + r, 400 + r); a flush kernel outside the graph
// before each. Records arrive out of order, as CUPTI's buffers may deliver them.
std::vector<KernelRecord> three_kernel_replays(int replays) {
  std::vector<KernelRecord> v;
  for (int r = replays - 1; r >= 0; --r) {
    const int64_t t0 = r * 1000;
    v.push_back({"c", 7, 30, t0 + 310 + r, t0 + 400 + r});
    v.push_back({"flush", 0, 0, t0 - 50, t0 - 10});
    v.push_back({"a", 7, 10, t0, t0 + 100});
    v.push_back({"b", 7, 20, t0 + 90, t0 + 300});
  }
  return v;
}

TEST(KernelTrace, MediansPerKernelInStartOrder) {
  const ForwardTrace t = summarize_replays(three_kernel_replays(5), 5);
  EXPECT_EQ(t.replays, 5);
  ASSERT_EQ(t.kernels.size(), 3u);  // the flush is not the graph's
  EXPECT_EQ(t.kernels[0].name, "a");
  EXPECT_EQ(t.kernels[1].name, "b");
  EXPECT_EQ(t.kernels[2].name, "c");
  EXPECT_DOUBLE_EQ(t.kernels[0].median_us, 0.1);
  EXPECT_DOUBLE_EQ(t.kernels[0].median_gap_us, 0.0);
  EXPECT_DOUBLE_EQ(t.kernels[1].median_gap_us, -0.01);
  EXPECT_DOUBLE_EQ(t.kernels[2].median_gap_us, 0.012);  // replays' gaps 10..14 ns: median 12
  EXPECT_DOUBLE_EQ(t.median_span_us, 0.402);
}

TEST(KernelTrace, RefusesRecordsThatAreNotWholeReplays) {
  std::vector<KernelRecord> v = three_kernel_replays(4);
  v.pop_back();  // one "b" fewer
  try {
    summarize_replays(v, 4);
    FAIL() << "accepted a missing kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(summarize_replays(three_kernel_replays(4), 0), Error);
  EXPECT_THROW(summarize_replays({{"flush", 0, 0, 0, 10}}, 1), Error);  // no graph kernels
}

}  // namespace
}  // namespace moekit::cli
