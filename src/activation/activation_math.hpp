// The activation between FC1 and FC2, one definition for the CPU reference and the kernels.
// C++17, no public headers: CUDA translation units include this.
#pragma once
#include <cmath>

#include "common/hd.hpp"

namespace moekit::activation {

// Mirrors moekit::ActivationKind (same numeric ids).
enum class Kind : int {
  kSwiGLU = 1,
  kSwiGLUClamped = 2,
  kGeGLUTanh = 3,
  kGeGLUErf = 4,
  kSiLU = 5,
  kGeLUTanh = 6,
  kGeLUErf = 7,
  kReLU2 = 8,
  kIdentity = 9,
};

// Everything a kernel needs, as plain values (limit = +inf when there is no clamp).
struct Params {
  Kind kind = Kind::kSwiGLU;
  float limit = INFINITY;
  float alpha = 1.0f;
  float beta = 0.0f;
};

MOEKIT_HD bool is_gated(Kind k) { return static_cast<int>(k) <= 4; }

// The sm90 engine's FC1 row order for gated kinds, whatever the checkpoint's GateUpLayout:
// blocks of 16 rows, the 8 gate rows of outputs [8b, 8b + 8) followed by their 8 up rows. One
// 16-byte vector then holds 8 gates and the next one their ups (activation kernel), and a
// wgmma accumulator fragment holds each gate and its up in the same thread, 8 columns (or 8
// rows, swap-AB) apart (the fused FC1 epilogue). Needs intermediate % 8 == 0.
constexpr int kGateUpBlock = 8;
MOEKIT_HD long long blocked_gate_row(long long j) {
  return (j / kGateUpBlock) * 2 * kGateUpBlock + j % kGateUpBlock;
}
MOEKIT_HD long long blocked_up_row(long long j) { return blocked_gate_row(j) + kGateUpBlock; }

// On the device: the fast exp and divide (a few fp32 ulps, far below a bf16 ulp), so the
// kernels' activation stays short (the fused FC1 epilogue's SwiGLU kinds go further:
// x_sigmoid_fast). The exp flushes subnormal results to zero (ex2 .ftz): __expf's non-ftz ex2
// costs three more instructions per value to rescale them, and 1 / (1 + e) is 1 either way.
// 1 / (1 + inf) = 0 and a NaN stays NaN in both forms.
MOEKIT_HD float sigmoid(float x) {
#ifdef __CUDA_ARCH__
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  return __fdividef(1.0f, 1.0f + e);
#else
  return 1.0f / (1.0f + expf(-x));
#endif
}
MOEKIT_HD float silu(float x) { return x * sigmoid(x); }
// Both GELUs are written without 1 + tanh / 1 + erf, which cancel for negative x: there host
// and device libm differing by one ulp gave results 15% apart. 0.5 (1 + tanh u) = sigmoid(2u)
// and 1 + erf(z) = erfc(-z) are exact identities, accurate on both sides.
MOEKIT_HD float gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
  return x * sigmoid(2.0f * k0 * (x + 0.044715f * x * x * x));
}
MOEKIT_HD float gelu_erf(float x) { return 0.5f * x * erfcf(-x * 0.7071067811865476f); }

// Non-gated activation of one value.
MOEKIT_HD float apply_plain(const Params& p, float x) {
  switch (p.kind) {
    case Kind::kSiLU:
      return silu(x);
    case Kind::kGeLUTanh:
      return gelu_tanh(x);
    case Kind::kGeLUErf:
      return gelu_erf(x);
    case Kind::kReLU2: {
      float r = x > 0.0f ? x : 0.0f;
      return r * r;
    }
    default:
      return x;  // kIdentity
  }
}

// x * sigmoid(a x) through one MUFU operation: with h = x / 2, sigmoid(2 a h) equals
// (1 + tanh(a h)) / 2, so x * sigmoid(a x) = h + h * tanh(a h). On the H200 the result measured
// within 2^-18 |x| of the exact value over [-40, 40] (PTX promises tanh.approx.f32 only to about
// 2^-11); ActivationDeviceTest.FastXSigmoidWithinItsBound holds it to 2^-14 |x|, far below a
// bf16 ulp of x. The exact form takes two MUFU operations (ex2, rcp): the fused FC1 epilogue's
// bound (sm90_epilogues.cuh). The host, which has no tanh.approx, computes the exact form.
MOEKIT_HD float x_sigmoid_fast(float x, float a) {
#ifdef __CUDA_ARCH__
  const float h = 0.5f * x;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(a * h));
  return fmaf(h, t, h);
#else
  return x * sigmoid(a * x);
#endif
}

// Gated activation of one (gate, up) pair; kFast: x_sigmoid_fast for the SwiGLU kinds (the fused
// FC1 epilogue; everything else takes the exact form, apply_gated).
template <bool kFast>
MOEKIT_HD float apply_gated_t(const Params& p, float gate, float up) {
  switch (p.kind) {
    case Kind::kSwiGLU:
      return (kFast ? x_sigmoid_fast(gate, 1.0f) : silu(gate)) * up;
    case Kind::kSwiGLUClamped: {
      // gpt-oss: gate clamped from above only, up on both sides, a NaN input kept NaN (as
      // torch.clamp does; fminf/fmaxf would return the other operand). On the device min.NaN /
      // max.NaN do that in one instruction each (two, compare and select, otherwise).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      float g, u;
      asm("min.NaN.f32 %0, %1, %2;" : "=f"(g) : "f"(gate), "f"(p.limit));
      asm("min.NaN.f32 %0, %1, %2;" : "=f"(u) : "f"(up), "f"(p.limit));
      asm("max.NaN.f32 %0, %0, %1;" : "+f"(u) : "f"(-p.limit));
#else
      float g = gate > p.limit ? p.limit : gate;
      float u = up > p.limit ? p.limit : (up < -p.limit ? -p.limit : up);
#endif
      return (kFast ? x_sigmoid_fast(g, p.alpha) : g * sigmoid(p.alpha * g)) * (u + p.beta);
    }
    case Kind::kGeGLUTanh:
      return gelu_tanh(gate) * up;
    default:
      return gelu_erf(gate) * up;  // kGeGLUErf
  }
}
MOEKIT_HD float apply_gated(const Params& p, float gate, float up) {
  return apply_gated_t<false>(p, gate, up);
}

}  // namespace moekit::activation
