// MoeLayer::warmup on a device engine (tune/warmup.hpp): forwards at every token bucket on
// scratch inputs, so that whatever the driver loads lazily (modules, the first launch of each
// kernel the buckets reach) is done before the caller captures a graph.
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "pipeline/engine_support.hpp"
#include "tune/warmup.hpp"

namespace moekit::tune {

void warm_up_device_engine(Engine& engine, const MoeSpec& spec, int device) {
  DeviceGuard guard(device);
  const int64_t T = spec.max_tokens, H = spec.hidden, E = spec.num_experts, k = spec.top_k;
  const std::size_t elem = dtype_size(spec.act_dtype);
  const bool external = spec.routing.method == RoutingMethod::kExternal;
  // Zeros: finite inputs whatever the dtype (0 is 0 in bf16, fp16 and fp32).
  pipeline::DeviceMemory hidden = pipeline::device_alloc(T * H * elem, "warm-up hidden rows");
  pipeline::DeviceMemory output = pipeline::device_alloc(T * H * elem, "warm-up output rows");
  check_cuda(cudaMemset(hidden.get(), 0, T * H * elem), "clearing the warm-up rows");
  pipeline::DeviceMemory logits, ids, weights;
  if (external) {
    // Token t's slot j routes to expert (t + j) mod E: distinct within a token (k <= E).
    std::vector<int32_t> host_ids(static_cast<std::size_t>(T * k));
    std::vector<float> host_weights(host_ids.size(), 1.0f / static_cast<float>(k));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) host_ids[t * k + j] = static_cast<int32_t>((t + j) % E);
    ids = pipeline::device_alloc(host_ids.size() * sizeof(int32_t), "warm-up expert ids");
    weights = pipeline::device_alloc(host_weights.size() * sizeof(float), "warm-up weights");
    check_cuda(cudaMemcpy(ids.get(), host_ids.data(), host_ids.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice),
               "uploading the warm-up expert ids");
    check_cuda(cudaMemcpy(weights.get(), host_weights.data(), host_weights.size() * sizeof(float),
                          cudaMemcpyHostToDevice),
               "uploading the warm-up weights");
  } else {
    logits = pipeline::device_alloc(T * E * sizeof(float), "warm-up router logits");
    check_cuda(cudaMemset(logits.get(), 0, T * E * sizeof(float)), "clearing the warm-up logits");
  }
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
             "creating the warm-up stream");
  struct StreamOwner {
    cudaStream_t s;
    ~StreamOwner() { cudaStreamDestroy(s); }
  } owner{stream};
  check_cuda(cudaDeviceSynchronize(), "finishing the warm-up's uploads");
  for (const int64_t tokens : tuning_buckets(T)) {
    ForwardArgs args;
    args.hidden = cuda_view(hidden.get(), spec.act_dtype, {tokens, H}, device);
    args.output = cuda_view(output.get(), spec.act_dtype, {tokens, H}, device);
    if (external) {
      args.topk_ids = cuda_view(ids.get(), DType::kInt32, {tokens, k}, device);
      args.topk_weights = cuda_view(weights.get(), DType::kFloat32, {tokens, k}, device);
    } else {
      args.router_logits = cuda_view(logits.get(), DType::kFloat32, {tokens, E}, device);
    }
    args.stream = stream;
    engine.forward(args);
  }
  check_cuda(cudaStreamSynchronize(stream), "finishing the warm-up forwards");
}

}  // namespace moekit::tune
