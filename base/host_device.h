#pragma once
// AG_HOST_DEVICE marks the small inline functions of base/ that CUDA kernels
// call as well as host code: __host__ __device__ under nvcc, nothing elsewhere
// (the host compiler, and the CUDA emulator's build, which compiles cuda/*.cu
// as C++).
#if defined(__CUDACC__)
#define AG_HOST_DEVICE __host__ __device__
#else
#define AG_HOST_DEVICE
#endif
