// Programmatic dependent launch (PDL) for the decode chain of kernels: a kernel launched with
// launch_pdl() may start while the kernel before it on the stream still runs, so its launch and
// prologue overlap that kernel's tail. The protocol every kernel here follows:
//   - before pdl_wait(), read nothing the previous kernel may write;
//   - call pdl_launch_dependents() only after pdl_wait() (or never).
// Then, when a kernel starts, the kernel two launches back has completed, so its outputs may be
// read before pdl_wait(): the decode GEMV does that with FC2's row offsets (offsets_ready). A
// kernel launched normally (the single-block permute, first of a forward) has nothing to wait
// for and may let its dependent start at once; that dependent (FC1) may learn of the offsets
// the permute writes from a flag it sets (store_release / load_acquire), before the permute
// ends. Both instructions are no-ops when the kernel was launched without the attribute.
// Stream capture records the launches as programmatic graph edges.
#pragma once
#include <cstdint>
#include <utility>

#include <cuda_runtime.h>

namespace moekit::pipeline {

// Waits until the previous kernel has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the next kernel start once every block has called this or exited.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// A flag between kernels that run at once: the writer stores its data, then store_release(flag,
// 1), whose release also covers other threads' stores ordered before it by a barrier; the
// reader's loads after load_acquire(flag) reads 1 see the data.
__device__ __forceinline__ void store_release(uint32_t* flag, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* flag) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
// counter += v as a release: what this thread saw written (its own stores, and others' ordered
// before it, e.g. by a __syncwarp) is visible to whoever load_acquire()s the sum.
__device__ __forceinline__ void add_release(uint32_t* counter, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(counter), "r"(v) : "memory");
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace moekit::pipeline
