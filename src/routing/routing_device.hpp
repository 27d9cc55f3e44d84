// Routing on the device: the same semantics as routing::route_host (routing.hpp), one warp per
// token. The engine runs the per-token routing fused into its permute kernels (permute.hpp);
// route_device() is the standalone form, used by tests and by callers that only want ids.
// C++17, no CUDA device code: host code and CUDA translation units include this.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "moekit/spec.hpp"
#include "moekit/status.hpp"

namespace moekit::routing {

// Limits of the warp-per-token kernels: each lane holds experts lane, lane + 32, ... (at most
// 16), slot s of the result lives in lane s, and group selection keeps one group per lane.
inline constexpr int kMaxDeviceExperts = 512;
inline constexpr int kMaxDeviceTopK = 32;
inline constexpr int kMaxDeviceGroups = 32;

// Everything a routing kernel reads, as plain values (copied into kernel arguments).
struct DeviceRouting {
  int method = 0;   // RoutingMethod numeric id
  int experts = 0;  // global expert count E
  int top_k = 0;
  int n_group = 1;  // DeepSeek-V3 only; 1 = no group selection
  int topk_group = 1;
  float scale = 1.0f;  // routed_scaling_factor (not applied to caller-supplied weights)
  bool renormalize = true;
  const float* correction_bias = nullptr;  // device [experts], DeepSeek-V3 only; null = none
  // Experts per lane (1, 2, 4, 8 or 16): the kernel specialisation, ceil(E / 32) rounded up.
  int per_lane = 1;
};

// Checks `params` against the kernels' limits and fills `out`. kExternal is accepted (the
// permute kernels then validate caller ids); route_device() refuses it.
Status make_device_routing(const RoutingParams& params, int64_t experts, int64_t top_k,
                           const float* correction_bias_device, DeviceRouting* out);

// Dynamic shared memory one warp needs for the per-token routing of `r` (group scores).
std::size_t routing_smem_per_warp(const DeviceRouting& r);

// logits [tokens, E] fp32 -> ids [tokens, k] int32 (global) and weights [tokens, k] fp32, all
// device pointers, enqueued on `stream`. Ties go to the lower expert id; NaN counts as -inf.
Status route_device(const DeviceRouting& r, int64_t tokens, const float* logits, int32_t* ids,
                    float* weights, cudaStream_t stream);

// Loads the kernel route_device() will launch for `r` (call once before any graph capture).
Status prepare_route_device(const DeviceRouting& r);

}  // namespace moekit::routing
