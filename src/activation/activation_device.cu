// Activation kernel (activation_device.hpp): one thread per 8 output elements, 16-byte loads
// and stores, fp32 math from activation_math.hpp.
#include <algorithm>
#include <string>

#include "activation/activation_device.hpp"
#include "pipeline/elem8.cuh"
#include "pipeline/pdl.cuh"

namespace moekit::activation {
namespace {

using pipeline::add8;
using pipeline::pack8;
using pipeline::unpack8;

enum Mode : int { kPlain = 0, kGated = 1 };

struct Args {
  Params p;
  const uint4* in;    // [rows, fc1_rows] as 16-byte vectors
  uint4* out;         // [rows, intermediate]
  const float* bias;  // [L, fc1_rows] or null
  const int32_t* row_expert;
  const int32_t* rows_end;  // &offsets[L]: rows filled by the permutation
  int64_t in_vecs;          // vectors per input row
  int64_t out_vecs;         // vectors per output row
  int64_t fc1_rows;
};

template <class T, int kMode>
__global__ void __launch_bounds__(256) activation_kernel(Args a) {
  pipeline::pdl_wait();  // FC1's output and the offsets come from earlier kernels
  pipeline::pdl_launch_dependents();
  const int64_t rows = *a.rows_end;
  const int64_t n = rows * a.out_vecs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / a.out_vecs, v = idx - row * a.out_vecs;
    const uint4* in = a.in + row * a.in_vecs;
    const float* bias =
        a.bias ? a.bias + static_cast<int64_t>(a.row_expert[row]) * a.fc1_rows : nullptr;
    float y[8];
    if (kMode == kPlain) {
      unpack8<T>(in[v], y);
      if (bias) add8(bias + 8 * v, y);
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = apply_plain(a.p, y[i]);
    } else {
      // Blocked order: vector 2v holds the gates of outputs [8v, 8v + 8), vector 2v + 1 their ups.
      float g[8], u[8];
      unpack8<T>(in[2 * v], g);
      unpack8<T>(in[2 * v + 1], u);
      if (bias) {
        add8(bias + 16 * v, g);
        add8(bias + 16 * v + 8, u);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = apply_gated(a.p, g[i], u[i]);
    }
    a.out[row * a.out_vecs + v] = pack8<T>(y);
  }
}

using KernelFn = void (*)(Args);

template <class T>
KernelFn pick_for(bool gated) {
  return gated ? activation_kernel<T, kGated> : activation_kernel<T, kPlain>;
}

KernelFn pick(const DeviceActivation& a) {
  const bool gated = is_gated(a.params.kind);
  return a.elem == DType::kFloat16 ? pick_for<__half>(gated) : pick_for<__nv_bfloat16>(gated);
}

Status check(const DeviceActivation& a) {
  if (a.elem != DType::kBFloat16 && a.elem != DType::kFloat16)
    return Status(ErrorCode::kUnsupported, std::string("activation element type ") +
                                               to_string(a.elem) + " has no device kernel");
  if (a.intermediate <= 0 || a.intermediate % 8 != 0)
    return Status(ErrorCode::kUnsupported, "intermediate " + std::to_string(a.intermediate) +
                                               " is not a positive multiple of 8");
  return {};
}

}  // namespace

Status prepare_device(const DeviceActivation& a) {
  Status s = check(a);
  if (!s.ok()) return s;
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, pick(a));
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("loading the activation kernel failed: ") + cudaGetErrorString(e));
  return {};
}

Status run_device(const DeviceActivation& a, const void* fc1_out, void* out,
                  const int32_t* row_expert, const int32_t* offsets, int64_t max_rows,
                  cudaStream_t stream) {
  Status s = check(a);
  if (!s.ok()) return s;
  if (max_rows <= 0) return {};
  Args k{};
  k.p = a.params;
  k.in = static_cast<const uint4*>(fc1_out);
  k.out = static_cast<uint4*>(out);
  k.bias = a.fc1_bias;
  k.row_expert = row_expert;
  k.rows_end = offsets + a.local_experts;
  k.fc1_rows = a.fc1_rows();
  k.in_vecs = k.fc1_rows / 8;
  k.out_vecs = a.intermediate / 8;
  const int64_t work = max_rows * k.out_vecs;
  const int blocks = static_cast<int>(std::clamp<int64_t>((work + 255) / 256, 1, 132 * 16));
  const cudaError_t e = pipeline::launch_pdl(pick(a), blocks, 256, 0, stream, k);
  if (e != cudaSuccess)
    return Status(ErrorCode::kCuda,
                  std::string("launching the activation kernel failed: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace moekit::activation
