// Device side of the CLI: copies, one timed forward, the benchmark loop and the machine floors.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "cli_ep.hpp"
#include "common/event_timing.hpp"
#include "common/numeric.hpp"
#include "moekit/status.hpp"

namespace moekit::cli {

// floor_kernels.cu
cudaError_t launch_empty_kernel(cudaStream_t stream);
cudaError_t launch_read_stream(const void* data, int64_t bytes, int blocks, uint32_t* sink,
                               cudaStream_t stream);

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kCuda, std::string(what) + " failed: " + cudaGetErrorString(e));
}

// A device buffer that frees itself.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    check(cudaMalloc(&ptr, std::max<std::size_t>(bytes, 16)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct DeviceInputs {
  DeviceBuffer hidden, logits, ids, weights, output;
  ForwardArgs args;
  DeviceInputs(const MoeSpec& spec, const HostInputs& in, int device)
      : hidden(in.hidden.size()),
        logits(in.router_logits.size() * 4),
        ids(in.topk_ids.size() * 4),
        weights(in.topk_weights.size() * 4),
        output(in.tokens * spec.hidden * dtype_size(spec.act_dtype)) {
    check(cudaMemcpy(hidden.ptr, in.hidden.data(), in.hidden.size(), cudaMemcpyHostToDevice),
          "copy hidden");
    const int64_t t = in.tokens;
    args.hidden = cuda_view(hidden.ptr, spec.act_dtype, {t, spec.hidden}, device);
    args.output = cuda_view(output.ptr, spec.act_dtype, {t, spec.hidden}, device);
    // By the routing method, not by emptiness: a batch of 0 tokens has empty inputs of shape [0,
    // n].
    if (spec.routing.method != RoutingMethod::kExternal) {
      check(cudaMemcpy(logits.ptr, in.router_logits.data(), in.router_logits.size() * 4,
                       cudaMemcpyHostToDevice),
            "copy logits");
      args.router_logits = cuda_view(logits.ptr, DType::kFloat32, {t, spec.num_experts}, device);
    } else {
      check(cudaMemcpy(ids.ptr, in.topk_ids.data(), in.topk_ids.size() * 4, cudaMemcpyHostToDevice),
            "copy ids");
      check(cudaMemcpy(weights.ptr, in.topk_weights.data(), in.topk_weights.size() * 4,
                       cudaMemcpyHostToDevice),
            "copy weights");
      args.topk_ids = cuda_view(ids.ptr, DType::kInt32, {t, spec.top_k}, device);
      args.topk_weights = cuda_view(weights.ptr, DType::kFloat32, {t, spec.top_k}, device);
    }
    // Poison: an element the forward forgets to write shows as NaN.
    check(cudaMemset(output.ptr, 0xff, in.tokens * spec.hidden * dtype_size(spec.act_dtype)),
          "poison output");
  }
};

std::vector<float> to_float(const std::vector<uint8_t>& raw, DType t) {
  const std::size_t n = raw.size() / dtype_size(t);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (t) {
      case DType::kBFloat16:
        std::memcpy(&h, &raw[2 * i], 2);
        out[i] = numeric::bf16_to_float(h);
        break;
      case DType::kFloat16:
        std::memcpy(&h, &raw[2 * i], 2);
        out[i] = numeric::fp16_to_float(h);
        break;
      default:
        std::memcpy(&out[i], &raw[4 * i], 4);
        break;
    }
  }
  return out;
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::kCuda, std::string(what) + " failed: cuBLAS status " +
                                      std::to_string(static_cast<int>(s)));
}

// The cuBLASLt objects of one FP8 GEMM, destroyed on every way out.
struct LtFp8Gemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtFp8Gemm() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

// Seconds of one dense FP8 GEMM n^3 (the median of `time_median`'s runs): D [n, n] bf16 =
// A^T B with A and B e4m3 [n, n] column-major, as cuBLASLt's FP8 GEMMs want them ("TN": A
// transposed, B not), fp32 compute, per-tensor scales 1.0, fast accumulation. The data are
// random normal values rounded to e4m3 (zeros run faster and would flatter the floor).
template <class TimeMedian>
double time_fp8_gemm(int n, TimeMedian&& time_median) {
  const std::size_t elems = std::size_t(n) * n;
  std::vector<uint8_t> host(elems);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& v : host) v = numeric::float_to_e4m3(dist(rng));
  DeviceBuffer a(elems), b(elems), d(elems * 2), scale(sizeof(float));
  const std::size_t workspace_bytes = 64u << 20;
  DeviceBuffer workspace(workspace_bytes);
  check(cudaMemcpy(a.ptr, host.data(), elems, cudaMemcpyHostToDevice), "copy");
  std::shuffle(host.begin(), host.end(), rng);
  check(cudaMemcpy(b.ptr, host.data(), elems, cudaMemcpyHostToDevice), "copy");
  const float one = 1.f, zero = 0.f;
  check(cudaMemcpy(scale.ptr, &one, sizeof(one), cudaMemcpyHostToDevice), "copy");

  LtFp8Gemm g;
  check_lt(cublasLtCreate(&g.handle), "cublasLtCreate");
  check_lt(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  const int8_t fast_accum = 1;
  const void* scale_ptr = scale.ptr;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, std::size_t size) {
    check_lt(cublasLtMatmulDescSetAttribute(g.op, attr, value, size),
             "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb));
  set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_ptr, sizeof(scale_ptr));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_ptr, sizeof(scale_ptr));
  // A is stored [k, m] (ld k) and used transposed; B [k, n] (ld k); C and D [m, n] bf16 (ld m).
  check_lt(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_8F_E4M3, n, n, n), "cublasLtMatrixLayoutCreate");
  check_lt(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_8F_E4M3, n, n, n), "cublasLtMatrixLayoutCreate");
  check_lt(cublasLtMatrixLayoutCreate(&g.c, CUDA_R_16BF, n, n, n), "cublasLtMatrixLayoutCreate");
  check_lt(cublasLtMatmulPreferenceCreate(&g.pref), "cublasLtMatmulPreferenceCreate");
  check_lt(cublasLtMatmulPreferenceSetAttribute(g.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_bytes, sizeof(workspace_bytes)),
           "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  check_lt(
      cublasLtMatmulAlgoGetHeuristic(g.handle, g.op, g.a, g.b, g.c, g.c, g.pref, 1, &best, &found),
      "cublasLtMatmulAlgoGetHeuristic (FP8 e4m3 GEMM)");
  if (found == 0)
    throw Error(ErrorCode::kCuda, "cuBLASLt offers no algorithm for the FP8 e4m3 GEMM " +
                                      std::to_string(n) + "^3 on this GPU");
  return time_median(
      [&] {
        check_lt(cublasLtMatmul(g.handle, g.op, &one, a.ptr, g.a, b.ptr, g.b, &zero, d.ptr, g.c,
                                d.ptr, g.c, &best.algo, workspace.ptr, workspace_bytes, nullptr),
                 "cublasLtMatmul (FP8 e4m3 GEMM)");
      },
      10);
}

}  // namespace

namespace {

// One warm-up and one timed forward of a MoeLayer or an EpLayer on its GPU (the current one).
template <class Layer>
RunResult run_on_device(Layer& layer, const HostInputs& in) {
  const MoeSpec& spec = layer.spec();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  DeviceInputs d(spec, in, device);
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  d.args.stream = stream;
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  layer.forward(d.args);  // warm-up
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  layer.forward(d.args);
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaStreamSynchronize(stream), "forward");
  throw_if_error(layer.poll_errors());
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  std::vector<uint8_t> raw(in.tokens * spec.hidden * dtype_size(spec.act_dtype));
  check(cudaMemcpy(raw.data(), d.output.ptr, raw.size(), cudaMemcpyDeviceToHost), "copy output");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return RunResult{to_float(raw, spec.act_dtype), ms};
}

}  // namespace

RunResult run_layer_on_device(MoeLayer& layer, const HostInputs& in) {
  return run_on_device(layer, in);
}

RunResult run_ep_layer_on_device(EpLayer& layer, const HostInputs& in) {
  return run_on_device(layer, in);
}

EpBenchRow time_ep_layer_on_device(EpLayer& layer, const HostInputs& in, int reps) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  DeviceInputs d(layer.spec(), in, device);
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  d.args.stream = stream;
  layer.forward(d.args);  // warm-up
  check(cudaStreamSynchronize(stream), "forward");
  std::vector<double> dispatch, experts, combine;
  // The whole forward between two events; the stage times are the layer's own events.
  const std::vector<double> total = event_times_us(
      stream, 0, reps,
      [&] {
        layer.forward(d.args);
        const EpForwardStats& st = layer.last_forward_stats();
        dispatch.push_back(st.dispatch_ms * 1e3);
        experts.push_back(st.experts_ms * 1e3);
        combine.push_back(st.combine_ms * 1e3);
      },
      [] {});
  throw_if_error(layer.poll_errors());
  cudaStreamDestroy(stream);
  EpBenchRow row;
  row.dispatch_us = quantile(dispatch, 0.5);
  row.experts_us = quantile(experts, 0.5);
  row.combine_us = quantile(combine, 0.5);
  row.total_us = quantile(total, 0.5);
  row.bytes_sent = layer.last_forward_stats().bytes_sent;
  row.bytes_received = layer.last_forward_stats().bytes_received;
  return row;
}

// Empties the L2 before a timed replay (see L2Flush). The read flush is a cuBLAS GEMV over a
// 256 MiB matrix: it reads every byte and writes 32 KiB.
class L2Flusher {
 public:
  L2Flusher(L2Flush mode, cudaStream_t stream) : mode_(mode), stream_(stream), buffer_(kBytes) {
    check(cudaMemset(buffer_.ptr, 0, kBytes), "L2 flush buffer");
    if (mode_ != L2Flush::kRead) return;
    if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS)
      throw Error(ErrorCode::kCuda, "cublasCreate failed");
    if (cublasSetStream(handle_, stream) != CUBLAS_STATUS_SUCCESS)
      throw Error(ErrorCode::kCuda, "cublasSetStream failed");
  }
  ~L2Flusher() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;

  void run(int rep) {
    if (mode_ == L2Flush::kWrite) {
      check(cudaMemsetAsync(buffer_.ptr, rep & 0xff, kBytes, stream_), "L2 flush");
    } else if (mode_ == L2Flush::kRead) {
      const float one = 1.f, zero = 0.f;
      float* m = static_cast<float*>(buffer_.ptr);
      // y = M^T x over all but the last 16 columns: x is the first column, y (32 KiB) lies in
      // the last 16.
      if (cublasSgemv(handle_, CUBLAS_OP_T, kN, kN - 16, &one, m, kN, m, 1, &zero,
                      m + std::size_t(kN) * (kN - 16), 1) != CUBLAS_STATUS_SUCCESS)
        throw Error(ErrorCode::kCuda, "the L2 read flush (cublasSgemv) failed");
    }
  }

 private:
  static constexpr int kN = 8192;  // 8192^2 fp32 = 256 MiB
  static constexpr std::size_t kBytes = std::size_t(kN) * kN * 4;
  L2Flush mode_;
  cudaStream_t stream_;
  DeviceBuffer buffer_;
  cublasHandle_t handle_ = nullptr;
};

// What `body` launches on `stream`, captured into an instantiated graph (one forward of a layer).
class ReplayGraph {
 public:
  template <class Body>
  ReplayGraph(cudaStream_t stream, Body&& body) : stream_(stream) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    body();
    check(cudaStreamEndCapture(stream, &graph_), "end capture");
    check(cudaGraphInstantiate(&exec_, graph_, 0), "graph instantiate");
  }
  ~ReplayGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  ReplayGraph(const ReplayGraph&) = delete;
  ReplayGraph& operator=(const ReplayGraph&) = delete;
  void launch() { check(cudaGraphLaunch(exec_, stream_), "graph launch"); }

 private:
  cudaStream_t stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Times replays of each of `graphs` on `stream`, interleaved round by round (each replay after
// an L2 flush, between two events): at least 30 rounds and at most 500, until each graph's
// replays add up to `budget_us`. The times per graph, in microseconds.
std::vector<std::vector<double>> time_replays(const std::vector<ReplayGraph*>& graphs,
                                              L2Flusher& flush, cudaStream_t stream,
                                              double budget_us) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<std::vector<double>> us(graphs.size());
  std::vector<double> total(graphs.size(), 0.0);
  const auto least_total = [&] { return *std::min_element(total.begin(), total.end()); };
  for (int rep = 0; !graphs.empty() && rep < 500 && (rep < 30 || least_total() < budget_us); ++rep)
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      flush.run(rep);
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      graphs[i]->launch();
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "graph replay");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      us[i].push_back(ms * 1e3);
      total[i] += ms * 1e3;
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return us;
}

// A layer's inputs on the device and a stream of its own, for timed forwards: warm_up() runs
// one eager forward (loading its kernels) and checks the layer's device errors.
class TimedForward {
 public:
  TimedForward(MoeLayer& layer, const HostInputs& in)
      : layer_(layer), d_(layer.spec(), in, current_device()) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    d_.args.stream = stream_;
  }
  ~TimedForward() { cudaStreamDestroy(stream_); }
  TimedForward(const TimedForward&) = delete;
  TimedForward& operator=(const TimedForward&) = delete;
  void operator()() { layer_.forward(d_.args); }
  void warm_up() {
    (*this)();
    check(cudaStreamSynchronize(stream_), "warm-up forward");
    throw_if_error(layer_.poll_errors());
  }
  cudaStream_t stream() const { return stream_; }

 private:
  static int current_device() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    return device;
  }
  MoeLayer& layer_;
  DeviceInputs d_;
  cudaStream_t stream_ = nullptr;
};

void bench_layer_on_device(MoeLayer& layer, const HostInputs& in, L2Flush flush_mode, BenchRow& row,
                           int trace_replays, double budget_us) {
  TimedForward forward(layer, in);
  const cudaStream_t stream = forward.stream();
  forward.warm_up();  // the graph below replays the same work
  ReplayGraph graph(stream, [&] { forward(); });
  L2Flusher flush(flush_mode, stream);
  const std::vector<double> us = time_replays({&graph}, flush, stream, budget_us).front();
  throw_if_error(layer.poll_errors());
  if (trace_replays > 0) {
    KernelTracer tracer;
    ReplayGraph traced(stream, [&] { forward(); });  // captured under the tracer
    for (int rep = 0; rep < trace_replays; ++rep) {  // as the timed loop: flush, replay, wait
      flush.run(rep);
      traced.launch();
      check(cudaStreamSynchronize(stream), "traced replay");
    }
    row.trace = summarize_replays(tracer.collect(), trace_replays);
  }
  row.reps = static_cast<int>(us.size());
  row.median_us = quantile(us, 0.5);
  row.p10_us = quantile(us, 0.1);
  row.p90_us = quantile(us, 0.9);
}

std::vector<double> time_choices_on_device(MoeLayer& layer, const HostInputs& in,
                                           L2Flush flush_mode,
                                           const std::vector<TacticChoices>& choices,
                                           double budget_us) {
  TimedForward forward(layer, in);
  std::vector<std::unique_ptr<ReplayGraph>> graphs;
  std::vector<ReplayGraph*> replayed;
  for (const TacticChoices& c : choices) {  // the choice is read when the forward launches
    layer.set_tactics(c);
    forward.warm_up();  // this choice's kernels loaded before its capture
    graphs.push_back(std::make_unique<ReplayGraph>(forward.stream(), [&] { forward(); }));
    replayed.push_back(graphs.back().get());
  }
  layer.set_tactics(TacticChoices{});
  L2Flusher flush(flush_mode, forward.stream());
  const std::vector<std::vector<double>> us =
      time_replays(replayed, flush, forward.stream(), budget_us);
  throw_if_error(layer.poll_errors());
  std::vector<double> medians;
  for (const auto& u : us) medians.push_back(quantile(u, 0.5));
  return medians;
}

Floors measure_floors(L2Flush flush_mode) {
  Floors f;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  f.gpu_name = prop.name;
  // Seconds: the median of `reps` runs after one untimed.
  auto time_median = [&](auto&& body, int reps) {
    return quantile(event_times_us(nullptr, 1, reps, body), 0.5) * 1e-6;
  };
  {  // Device copy: 2 GiB, bytes read plus bytes written.
    const std::size_t bytes = 2ull << 30;
    DeviceBuffer a(bytes), b(bytes);
    check(cudaMemset(a.ptr, 1, bytes), "memset");
    double s = time_median(
        [&] { check(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice), "copy"); }, 10);
    f.copy_bytes_per_s = 2.0 * bytes / s;
    // Read-only stream of the same 2 GiB: what a forward's weight reads can reach.
    DeviceBuffer sink(sizeof(uint32_t));
    const int blocks = prop.multiProcessorCount * (prop.maxThreadsPerMultiProcessor / 512);
    s = time_median(
        [&] {
          check(launch_read_stream(a.ptr, bytes, blocks, static_cast<uint32_t*>(sink.ptr), nullptr),
                "the read stream");
        },
        10);
    f.read_bytes_per_s = bytes / s;
  }
  {  // Dense BF16 GEMM 8192^3 on random data (zeros run faster and would flatter the floor).
    const int n = 8192;
    const std::size_t elems = std::size_t(n) * n;
    std::vector<uint16_t> host(elems);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (auto& v : host) v = numeric::float_to_bf16(dist(rng));
    DeviceBuffer a(elems * 2), b(elems * 2), c(elems * 2);
    check(cudaMemcpy(a.ptr, host.data(), elems * 2, cudaMemcpyHostToDevice), "copy");
    check(cudaMemcpy(b.ptr, host.data(), elems * 2, cudaMemcpyHostToDevice), "copy");
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
      throw Error(ErrorCode::kCuda, "cublasCreate failed");
    const float one = 1.f, zero = 0.f;
    double s = time_median(
        [&] {
          cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a.ptr, CUDA_R_16BF, n, b.ptr,
                       CUDA_R_16BF, n, &zero, c.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT);
        },
        10);
    cublasDestroy(h);
    f.gemm_flops_per_s = 2.0 * n * double(n) * n / s;
    f.fp8_gemm_flops_per_s = 2.0 * n * double(n) * n / time_fp8_gemm(n, time_median);
  }
  {  // Launching a graph: one empty kernel, replayed as the rows are.
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    {
      ReplayGraph graph(stream, [&] { check(launch_empty_kernel(stream), "the empty kernel"); });
      L2Flusher flush(flush_mode, stream);
      f.launch_us = quantile(time_replays({&graph}, flush, stream, kBenchBudgetUs).front(), 0.5);
    }
    cudaStreamDestroy(stream);
  }
  return f;
}

}  // namespace moekit::cli
