#pragma once
// The part of CUDA that attograd's kernels and runtime code use, for the
// emulated build (cmake -DATTOGRAD_CUDA=EMULATE): cuda/*.cu is compiled by the
// host compiler against this header instead of the CUDA Toolkit's, and runs on
// the CPU (tests/cuda_emulator/emulator.h says how, and what that cannot show).
// It is a test tool: the [cuda] tests then check every kernel against the CPU
// on a machine with no GPU. Its devices' PCI bus ids read "emulated:00" and on,
// which is how a program built with it names its GPU (ATTOGRAD_EMULATED_GPUS
// of them, 1 by default).
//
// Device memory is host memory handed out by cudaMalloc: filled with 0xff bytes
// (float NaN, integer -1) when allocated and again when freed, so a kernel that
// reads what nothing wrote, or what was freed, gives NaNs the tests see. Copies
// and memsets are checked against the allocations they touch.
#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tests/cuda_emulator/emulator.h"

#define ATTOGRAD_CUDA_EMULATION 1

// ---- the language's keywords and built-ins ---------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
// One copy per block: blocks run one at a time on each host thread.
#define __shared__ static thread_local

#define threadIdx (::emu::coordinates().thread)
#define blockIdx (::emu::coordinates().block)
#define blockDim (::emu::coordinates().block_dim)
#define gridDim (::emu::coordinates().grid_dim)
constexpr int warpSize = 32;

struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(8) uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

inline void __syncthreads() { ::emu::syncthreads(); }
// The lanes in `mask` meet: an exchange in which each keeps its own value.
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::emu::exchange(mask, 0, -1); }

// Shuffles within segments of `width` lanes; a source outside the lane's
// segment gives the lane its own value, as CUDA documents.
template <typename T>
T __shfl_sync(unsigned mask, T value, int source, int width = warpSize) {
  const int lane = ::emu::lane();
  return ::emu::shuffle(mask, value, (lane & ~(width - 1)) + (source & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  const int lane = ::emu::lane(), source = lane ^ lane_mask;
  return ::emu::shuffle(mask, value, source / width == lane / width ? source : -1);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  const int lane = ::emu::lane();
  return ::emu::shuffle(mask, value, lane % width >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : -1);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  const int lane = ::emu::lane();
  return ::emu::shuffle(mask, value,
                        lane % width + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : -1);
}

// A block's threads never run at the same time, and blocks run one after the
// other on the launching thread, so a read-modify-write is atomic here.
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

// CUDA's min and max of two numbers, in the global namespace as in device code.
template <typename A, typename B>
requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B> std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <typename A, typename B>
requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B> std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

// ---- the runtime API ---------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchOutOfResources = 701,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97, cudaDevAttrMultiProcessorCount = 16 };

constexpr unsigned cudaStreamNonBlocking = 0x01;
constexpr unsigned cudaEventDisableTiming = 0x02;

using cudaEvent_t = struct EmulatedEvent*;

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetPCIBusId(char* id, int length, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** pointer, std::size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

namespace emu {
cudaError_t set_function_attribute(const void* kernel, cudaFuncAttribute attribute, int value);
}
template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute, int value) {
  return ::emu::set_function_attribute(reinterpret_cast<const void*>(kernel), attribute, value);
}
