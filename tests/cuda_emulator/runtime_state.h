#pragma once
// What the emulator's launch (emulator.cpp) asks of its runtime (runtime.cpp).
#include "tests/cuda_emulator/cuda_runtime.h"

namespace emu {

// cudaSuccess, or the error a GPU gives this launch configuration (block and
// grid sizes, shared memory against the kernel's attribute, the stream).
cudaError_t check_launch(const void* kernel, dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream);

// The error cudaGetLastError returns next on this host thread.
void set_last_error(cudaError_t error);

}  // namespace emu
