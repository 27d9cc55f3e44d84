// Standalone device routing (routing_device.hpp): one warp per token.
#include <string>

#include "common/cuda_status.hpp"
#include "routing/routing_device.hpp"
#include "routing/routing_warp.cuh"

namespace moekit::routing {
namespace {

constexpr int kWarpsPerBlock = 8;

template <int kPerLane>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    route_kernel(DeviceRouting r, int64_t tokens, const float* __restrict__ logits,
                 int32_t* __restrict__ ids, float* __restrict__ weights, int smem_floats_per_warp) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31;
  const int warp_in_block = threadIdx.x >> 5;
  float* scores = smem + warp_in_block * smem_floats_per_warp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp_in_block; t < tokens;
       t += warps) {
    warp::Logits<kPerLane> x;
    x.load(r, logits + t * r.experts, lane);
    const warp::Slot s = warp::route_token<kPerLane>(r, x, scores, lane);
    if (lane < r.top_k) {
      ids[t * r.top_k + lane] = s.id;
      weights[t * r.top_k + lane] = s.weight;
    }
  }
}

using RouteKernel = void (*)(DeviceRouting, int64_t, const float*, int32_t*, float*, int);

RouteKernel pick_kernel(int per_lane) {
  switch (per_lane) {
    case 1:
      return route_kernel<1>;
    case 2:
      return route_kernel<2>;
    case 4:
      return route_kernel<4>;
    case 8:
      return route_kernel<8>;
    default:
      return route_kernel<16>;
  }
}

}  // namespace

Status make_device_routing(const RoutingParams& params, int64_t experts, int64_t top_k,
                           const float* correction_bias_device, DeviceRouting* out) {
  auto invalid = [](const std::string& m) { return Status(ErrorCode::kUnsupported, m); };
  if (experts < 1 || experts > kMaxDeviceExperts)
    return invalid("experts " + std::to_string(experts) +
                   " is outside the device routing range [1, " + std::to_string(kMaxDeviceExperts) +
                   "]");
  if (top_k < 1 || top_k > kMaxDeviceTopK || top_k > experts)
    return invalid("top_k " + std::to_string(top_k) + " is outside [1, min(" +
                   std::to_string(kMaxDeviceTopK) + ", experts " + std::to_string(experts) + ")]");
  DeviceRouting r;
  r.method = static_cast<int>(params.method);
  r.experts = static_cast<int>(experts);
  r.top_k = static_cast<int>(top_k);
  r.scale = params.routed_scaling_factor;
  r.renormalize = params.renormalize;
  if (params.method == RoutingMethod::kDeepSeekV3) {
    const int g = params.n_group, tg = params.topk_group;
    if (g < 1 || g > kMaxDeviceGroups || experts % g != 0)
      return invalid("n_group " + std::to_string(g) + " must divide experts " +
                     std::to_string(experts) + " and be at most " +
                     std::to_string(kMaxDeviceGroups) + " for device routing");
    if (tg < 1 || tg > g || static_cast<int64_t>(tg) * (experts / g) < top_k)
      return invalid("topk_group " + std::to_string(tg) + " of n_group " + std::to_string(g) +
                     " leaves fewer than top_k " + std::to_string(top_k) + " experts");
    r.n_group = g;
    r.topk_group = tg;
    if (params.correction_bias) {
      if (correction_bias_device == nullptr)
        return Status(ErrorCode::kInvalidArgument,
                      "routing asks for a correction bias but none was given");
      r.correction_bias = correction_bias_device;
    }
  } else if (params.method != RoutingMethod::kSoftmaxTopK &&
             params.method != RoutingMethod::kTopKSoftmax &&
             params.method != RoutingMethod::kLlama4 && params.method != RoutingMethod::kExternal) {
    return invalid("routing method " + std::to_string(r.method) + " has no device kernel");
  }
  const int lanes = static_cast<int>((experts + 31) / 32);
  r.per_lane = lanes <= 1 ? 1 : lanes <= 2 ? 2 : lanes <= 4 ? 4 : lanes <= 8 ? 8 : 16;
  *out = r;
  return {};
}

std::size_t routing_smem_per_warp(const DeviceRouting& r) {
  if (r.method != static_cast<int>(RoutingMethod::kDeepSeekV3) || r.n_group <= 1) return 0;
  return static_cast<std::size_t>(r.experts + r.experts / 32 + 1) * sizeof(float);
}

Status prepare_route_device(const DeviceRouting& r) {
  cudaFuncAttributes attr;
  return cuda_status(cudaFuncGetAttributes(&attr, pick_kernel(r.per_lane)),
                     "loading the routing kernel");
}

Status route_device(const DeviceRouting& r, int64_t tokens, const float* logits, int32_t* ids,
                    float* weights, cudaStream_t stream) {
  if (r.method == static_cast<int>(RoutingMethod::kExternal))
    return Status(ErrorCode::kInvalidArgument,
                  "route_device cannot route kExternal (ids are given)");
  if (tokens <= 0) return {};
  const std::size_t per_warp = routing_smem_per_warp(r);
  const int64_t blocks64 = (tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int blocks = static_cast<int>(blocks64 < 65536 ? blocks64 : 65536);
  pick_kernel(r.per_lane)<<<blocks, kWarpsPerBlock * 32, per_warp * kWarpsPerBlock, stream>>>(
      r, tokens, logits, ids, weights, static_cast<int>(per_warp / sizeof(float)));
  return cuda_status(cudaGetLastError(), "launching the routing kernel");
}

}  // namespace moekit::routing
