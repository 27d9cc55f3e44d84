// Tokens x hidden past 2^31 elements, for every device engine: 300000 tokens of 7168 (2.15e9
// elements, 4.3 GB of bf16 per activation tensor), one expert each (top_k 1) of the spec's few
// experts with a small intermediate, so the GEMMs stay cheap. Every index the forward forms from
// a token or a permuted row times H (the permute's gather and scatter, a quantizing gather, FC1's
// rows read by index, the per-group pointers of both GEMMs, the finalize) then passes 2^31 for
// the last tokens: the last 512 tokens go to the last expert, so that their permuted rows are
// the last rows too. The CPU reference runs for sampled tokens only (the first, some spread over
// the batch, those around token 299594, the first whose row starts past 2^31 elements, and the
// last); every output element is checked written (no NaN left of the poison) on the device.
// Included by the engines' *_test.cu files; its kernels are each file's own.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/registry.hpp"
#include "quant/quant.hpp"
#include "reference/reference.hpp"
#include "support/engine_check.hpp"
#include "support/gpu.hpp"

namespace moekit::devtest {
namespace {

constexpr int64_t kLargeBatchTokens = 300000, kLargeBatchHidden = 7168;

// bf16 bits of hidden element i, the same on host and device: sign and mantissa from a hash of
// i, magnitudes in [2^-6, 1). The host thus needs only the sampled rows.
__host__ __device__ inline uint16_t hashed_bf16(uint64_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  const uint32_t h = static_cast<uint32_t>(x);
  const uint32_t exponent = 121u + (h >> 8) % 6u;
  return static_cast<uint16_t>((h & 0x8000u) | (exponent << 7) | (h & 0x7fu));
}

__global__ void fill_hashed_bf16(uint16_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = hashed_bf16(static_cast<uint64_t>(i), seed);
}

// Adds the count of NaN bf16 elements of x[0, n) to *count.
__global__ void count_nan_bf16(const uint16_t* x, int64_t n, unsigned long long* count) {
  unsigned long long c = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    c += (x[i] & 0x7fffu) > 0x7f80u;
  if (c > 0) atomicAdd(count, c);
}

// The check for spec `s` (bf16 activations, hidden kLargeBatchHidden, top_k 1, external ids),
// once per variant: make(spec, weights, i) builds the engine of variants[i].
using VariantEngine =
    std::function<std::unique_ptr<Engine>(const MoeSpec&, const MoeWeights&, int)>;
void check_tokens_times_hidden_past_2_to_31(MoeSpec s, const std::vector<std::string>& variants,
                                            const VariantEngine& make) {
  if (sanitizer_run())
    GTEST_SKIP() << "4.3 GB per tensor; the sanitizers see the same kernels at "
                    "the other tests' sizes";
  constexpr int64_t T = kLargeBatchTokens, H = kLargeBatchHidden, kTail = 512;
  static_assert(T * H > (int64_t{1} << 31), "the batch must pass 2^31 elements");
  ASSERT_EQ(s.hidden, H);
  ASSERT_EQ(s.top_k, 1);
  const int64_t E = s.num_experts;
  const int64_t first_past = ((int64_t{1} << 31) + H - 1) / H;  // 299594
  const std::size_t tensor_bytes = static_cast<std::size_t>(T * H) * 2;
  // The caller's hidden and output, the engine's gathered (or quantized) rows and FC2's output,
  // and ~2 GB for the rest (weights, FC1's output [T, 2I], slots, GEMM arrays).
  const std::size_t need = 4 * tensor_bytes + (std::size_t{2} << 30);
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < need)
    GTEST_SKIP() << "needs about " << (need >> 30) << " GiB of free GPU memory, "
                 << (free_bytes >> 30) << " GiB free";

  std::mt19937_64 rng(base_seed() ^ 0x900e);
  s.max_tokens = T;
  const MoeWeights weights = quant::make_random_weights(s, rng());
  std::vector<int32_t> ids(static_cast<std::size_t>(T));
  std::vector<float> route_weights(ids.size());
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    ids[t] = t >= T - kTail ? static_cast<int32_t>(E - 1) : static_cast<int32_t>(rng() % E);
    route_weights[t] = uw(rng);
  }
  const uint64_t seed = rng();

  std::vector<int64_t> sampled = {0, 1, 2, 3};
  for (int i = 1; i <= 12; ++i) sampled.push_back(static_cast<int64_t>(rng() % T));
  for (int64_t t = first_past - 4; t < first_past + 4; ++t) sampled.push_back(t);
  for (int64_t t = T - 24; t < T; ++t) sampled.push_back(t);
  std::sort(sampled.begin(), sampled.end());
  sampled.erase(std::unique(sampled.begin(), sampled.end()), sampled.end());
  const int64_t n = static_cast<int64_t>(sampled.size());
  std::vector<float> hidden(static_cast<std::size_t>(n * H));
  std::vector<int32_t> sampled_ids(static_cast<std::size_t>(n));
  std::vector<float> sampled_weights(sampled_ids.size());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = sampled[j];
    for (int64_t h = 0; h < H; ++h)
      hidden[j * H + h] =
          from_bits(s.act_dtype, hashed_bf16(static_cast<uint64_t>(t * H + h), seed));
    sampled_ids[j] = ids[t];
    sampled_weights[j] = route_weights[t];
  }
  std::vector<float> ref(hidden.size());
  const Status st = reference::forward(s, weights, n, hidden.data(), sampled_ids.data(),
                                       sampled_weights.data(), ref.data());
  ASSERT_TRUE(st.ok()) << st.message();

  DeviceBuffer d_hidden(tensor_bytes), d_out(tensor_bytes), d_ids(to_device(ids)),
      d_weights(to_device(route_weights)), d_count(sizeof(unsigned long long));
  fill_hashed_bf16<<<4096, 256>>>(d_hidden.as<uint16_t>(), T * H, seed);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ForwardArgs args;
  args.hidden = cuda_view(d_hidden.ptr, s.act_dtype, {T, H});
  args.output = cuda_view(d_out.ptr, s.act_dtype, {T, H});
  args.topk_ids = cuda_view(d_ids.ptr, DType::kInt32, {T, 1});
  args.topk_weights = cuda_view(d_weights.ptr, DType::kFloat32, {T, 1});
  for (std::size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE(variants[v]);
    std::unique_ptr<Engine> engine = make(s, weights, static_cast<int>(v));
    d_out.poison();
    engine->forward(args);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(engine->poll_errors().ok());
    ASSERT_EQ(cudaMemset(d_count.ptr, 0, d_count.bytes), cudaSuccess);
    count_nan_bf16<<<4096, 256>>>(d_out.as<uint16_t>(), T * H, d_count.as<unsigned long long>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(to_host<unsigned long long>(d_count.ptr, 1)[0], 0u)
        << "NaN outputs (unwritten or computed) in the " << T << " x " << H << " output";
    std::vector<uint16_t> out(static_cast<std::size_t>(n * H));
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(cudaMemcpy(out.data() + j * H, d_out.as<uint16_t>() + sampled[j] * H, H * 2,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
    // Each sampled token alone too, so that a wrong row past 2^31 cannot hide in the others.
    expect_close(s, out, ref, tolerance(s));
    for (int64_t j = 0; j < n; ++j) {
      if (sampled[j] < first_past) continue;
      SCOPED_TRACE("token " + std::to_string(sampled[j]) + " (its row starts past 2^31 elements)");
      expect_close(s, std::vector<uint16_t>(out.begin() + j * H, out.begin() + (j + 1) * H),
                   std::vector<float>(ref.begin() + j * H, ref.begin() + (j + 1) * H),
                   tolerance(s));
    }
  }
}

}  // namespace
}  // namespace moekit::devtest
