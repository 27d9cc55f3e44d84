// KernelTracer through CUPTI's activity API (concurrent-kernel records keep kernels
// concurrent; the plain kernel kind would serialize them).
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "kernel_trace.hpp"
#include "moekit/status.hpp"

namespace moekit::cli {
namespace {

std::mutex g_mutex;
std::vector<KernelRecord> g_records;
constexpr size_t kBufferBytes = 8 << 20;

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    g_records.push_back({demangle(k->name), k->graphId, k->graphNodeId,
                         static_cast<int64_t>(k->start), static_cast<int64_t>(k->end)});
  }
  std::free(buffer);
}

void check_cupti(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  throw Error(ErrorCode::kCuda, std::string("CUPTI ") + what + " failed: " + (s ? s : "?"));
}

}  // namespace

KernelTracer::KernelTracer() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
  }
  check_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
              "cuptiActivityRegisterCallbacks");
  check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
              "enabling kernel records");
}

KernelTracer::~KernelTracer() { cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); }

std::vector<KernelRecord> KernelTracer::collect() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    throw Error(ErrorCode::kCuda, std::string("trace: ") + cudaGetErrorString(e));
  check_cupti(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_records;
}

}  // namespace moekit::cli
