// The host steps the CUTLASS grouped-GEMM tactics of src/gemm (GroupedGemm's, Fp8GroupedGemm's,
// IntGroupedGemm's) take alike: one device allocation for their per-group arrays, carved into
// aligned pieces and zeroed, with the strides that do not depend on a group's rows written once;
// can_implement, the workspace and initialize, once; and a run. C++17, CUDA translation units.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_status.hpp"
#include "cutlass/cutlass.h"
#include "moekit/status.hpp"

namespace moekit::gemm::detail {

// One allocation in 256-byte aligned pieces: take() each piece's size (its offset back), then
// allocate() once; zeroed, so that a kernel never reads bytes nothing wrote (initcheck).
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena() {
    if (base_ != nullptr) cudaFree(base_);
  }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  std::size_t take(std::size_t bytes) {
    const std::size_t at = used_;
    used_ += (bytes + 255) / 256 * 256;
    return at;
  }
  Status allocate(const std::string& what) {
    Status st = moekit::cuda_status(cudaMalloc(&base_, used_ ? used_ : 256),
                                    what + ": cudaMalloc(group arrays)");
    if (st.ok())
      st = moekit::cuda_status(cudaMemset(base_, 0, used_), what + ": cudaMemset(group arrays)");
    return st;
  }
  char* at(std::size_t offset) const { return static_cast<char*>(base_) + offset; }
  // `count` copies of `value` from `offset` on: a stride every group shares.
  template <class T>
  Status fill(std::size_t offset, const T& value, int count, const std::string& what) {
    std::vector<char> host(sizeof(T) * static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) std::memcpy(host.data() + i * sizeof(T), &value, sizeof(T));
    return moekit::cuda_status(
        cudaMemcpy(at(offset), host.data(), host.size(), cudaMemcpyHostToDevice),
        what + ": cudaMemcpy(strides)");
  }
  std::size_t bytes() const { return used_; }

 private:
  void* base_ = nullptr;
  std::size_t used_ = 0;
};

// can_implement, the workspace and initialize, once. `workspace` and `workspace_bytes` are the
// tactic's, freed by it. The workspace is zeroed once. Most of it holds the per-SM TMA
// descriptors of the ptr-array main loop (and of CUTLASS's TMA-store epilogue), which CUTLASS's
// initialize_workspace leaves as cudaMalloc returned them. The load warp copies a whole 128-byte
// descriptor there (tensormap.cp_fenceproxy, warp-wide: 4 bytes a lane) and fences it (a
// warp-wide acquire) before any TMA reads it, so the old contents never matter; but initcheck
// takes those warp-wide accesses for 4-byte reads of uninitialized memory, one per lane, on
// every block's first descriptor (reported at lane 1 of warp 0, the load warp, in the swap-AB and
// pair kernels alike). The dynamic orders' counters after them are zeroed here too, and again
// by their initialize_workspace.
template <class Gemm>
Status initialize_cutlass(Gemm& gemm, const typename Gemm::Arguments& args, void** workspace,
                          std::size_t* workspace_bytes, const std::string& what) {
  cutlass::Status cs = gemm.can_implement(args);
  if (cs != cutlass::Status::kSuccess)
    return Status(ErrorCode::kUnsupported,
                  what + ": CUTLASS can_implement failed: " + cutlassGetStatusString(cs));
  *workspace_bytes = Gemm::get_workspace_size(args);
  if (*workspace_bytes > 0) {
    Status st = moekit::cuda_status(cudaMalloc(workspace, *workspace_bytes),
                                    what + ": cudaMalloc(workspace)");
    if (st.ok())
      st = moekit::cuda_status(cudaMemset(*workspace, 0, *workspace_bytes),
                               what + ": cudaMemset(workspace)");
    if (!st.ok()) return st;
  }
  cs = gemm.initialize(args, *workspace);
  if (cs != cutlass::Status::kSuccess)
    return Status(ErrorCode::kCuda,
                  what + ": CUTLASS initialize failed: " + cutlassGetStatusString(cs) + " (" +
                      cudaGetErrorString(cudaGetLastError()) + ")");
  return {};
}

template <class Gemm>
Status run_cutlass(Gemm& gemm, cudaStream_t stream, const std::string& what) {
  const cutlass::Status cs = gemm.run(stream);
  if (cs != cutlass::Status::kSuccess)
    return Status(ErrorCode::kCuda, what + ": CUTLASS run failed: " + cutlassGetStatusString(cs) +
                                        " (" + cudaGetErrorString(cudaGetLastError()) + ")");
  return {};
}

// What a CUTLASS grouped tactic holds besides its per-group array views: the adapter, its
// workspace, the arena those arrays live in, and the tactic's name for messages. The set-up
// takes() the arena's pieces, allocates it, load()s the problem kernel and ends with
// initialize(); each run enqueues the problem kernel, then run().
template <class Gemm>
class CutlassGrouped {
 public:
  CutlassGrouped() = default;
  ~CutlassGrouped() {
    if (workspace_ != nullptr) cudaFree(workspace_);
  }
  CutlassGrouped(const CutlassGrouped&) = delete;
  CutlassGrouped& operator=(const CutlassGrouped&) = delete;

  // Loads the problem kernel now, not lazily inside a graph capture of the first forward.
  Status load(const void* problem_kernel) const {
    cudaFuncAttributes attr{};
    return moekit::cuda_status(cudaFuncGetAttributes(&attr, problem_kernel),
                               name + ": loading the problem kernel");
  }
  Status initialize(const typename Gemm::Arguments& args) {
    return initialize_cutlass(gemm_, args, &workspace_, &workspace_bytes_, name);
  }
  // The problem kernel's launch status, then the GEMM.
  Status run(cudaStream_t stream) {
    const Status st =
        moekit::cuda_status(cudaGetLastError(), name + ": launching the problem kernel");
    return st.ok() ? run_gemm(stream) : st;
  }
  // The GEMM alone (its per-group arrays written by a kernel of the caller's).
  Status run_gemm(cudaStream_t stream) { return run_cutlass(gemm_, stream, name); }
  std::size_t workspace_bytes() const { return workspace_bytes_ + arena.bytes(); }

  std::string name;
  DeviceArena arena;

 private:
  Gemm gemm_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace moekit::gemm::detail
