// The routing weights' arithmetic, one definition for the host reference (routing_host.cpp) and
// the routing warp (routing_warp.cuh), so both give the same bits. Every step is a single IEEE
// operation (fmaf, float multiply, add, divide, rintf), which rounds the same on the CPU and the
// GPU; nothing is left for a compiler to contract.
// Why not exp() in double: on the one-token critical path a double exp and a double divide were
// 0.55-0.7 us of a token's routing; the fp32 softmax took 0.3-0.6 us off every softmax preset's
// decode rows.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/hd.hpp"

namespace moekit::routing {

// exp(d) for d <= 0 (d = logit - max logit), within ~2 fp32 ulps: Cephes' expf, its reduction
// and polynomial written as fmaf. Below -87 (and for NaN) it gives 0, so that every non-zero
// result is a normal float: a GPU build that flushed subnormals would then still match the host.
MOEKIT_HD float exp_nonpositive(float d) {
  if (!(d >= -87.0f)) return 0.0f;
  const float n = rintf(d * 1.44269504088896341f);  // n in [-126, 0]
  float r = fmaf(n, -0.693359375f, d);              // ln 2 = 0.693359375 - 2.12194440e-4
  r = fmaf(n, 2.12194440e-4f, r);
  float p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float r2 = r * r;
  const float e = fmaf(p, r2, r) + 1.0f;  // exp(r), |r| <= ln(2) / 2
  const uint32_t bits = static_cast<uint32_t>(static_cast<int>(n) + 127) << 23;  // 2^n
#if defined(__CUDA_ARCH__)
  const float two_n = __uint_as_float(bits);
#else
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
#endif
  return e * two_n;
}

// 1 / (1 + exp(-x)) through exp of -|x| only (nothing overflows); NaN gives 0, as -inf does.
MOEKIT_HD float sigmoid_fp32(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + exp_nonpositive(-x));
  const float t = exp_nonpositive(x);
  return t / (1.0f + t);
}

// One slot's weight from its term (softmax: exp(x - max); sigmoid methods: the sigmoid) and the
// sum it is normalized by (accumulated in double, so that the full softmax's sum, added in
// another order on the GPU, still rounds alike; 1 where nothing normalizes).
MOEKIT_HD float normalized_weight(float term, double denom, float scale) {
  return term / static_cast<float>(denom) * scale;
}

}  // namespace moekit::routing
