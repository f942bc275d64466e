#pragma once
// CUDA_CHECK(expr): every CUDA runtime call and every launch goes through it;
// a failure throws attograd::Error naming the expression, file, line and CUDA's message.
#include <cuda_runtime.h>

#include "base/error.h"

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t cuda_check_status_ = (expr);                                                \
    if (cuda_check_status_ != cudaSuccess)                                                        \
      throw ::attograd::Error(fmt::format("[cuda] {} failed at {}:{}: {}", #expr, __FILE__, __LINE__, \
                                          cudaGetErrorString(cuda_check_status_)));               \
  } while (0)

// After a kernel launch: catches bad launch configurations immediately.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
