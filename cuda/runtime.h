#pragma once
// The CUDA runtime as the rest of attograd sees it: raw device memory, copies
// and the device count. Built from runtime.cu when CUDA is enabled, and from
// no_cuda.cpp otherwise, where every entry point throws
// "[op] has no CUDA implementation in this build" (device_count() returns 0).
#include <cstddef>

namespace attograd::cuda {

bool built_with_cuda();
int device_count();  // 0 when built without CUDA or when no GPU is present

void* device_malloc(std::size_t nbytes, int device);
void device_free(void* ptr, std::size_t nbytes, int device);
void copy_host_to_device(void* dst, const void* src, std::size_t nbytes, int device);
void copy_device_to_host(void* dst, const void* src, std::size_t nbytes, int device);
void copy_device_to_device(void* dst, const void* src, std::size_t nbytes, int device);
void synchronize(int device);

}  // namespace attograd::cuda
