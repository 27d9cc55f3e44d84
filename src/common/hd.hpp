// MOEKIT_HD marks functions shared by host code and CUDA kernels, so the CPU reference and the
// GPU kernels compute the same math from one definition.
#pragma once
#if defined(__CUDACC__)
#define MOEKIT_HD __host__ __device__ __forceinline__
#else
#define MOEKIT_HD inline
#endif
