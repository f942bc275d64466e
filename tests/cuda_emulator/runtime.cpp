// The emulator's runtime API: devices, memory, copies, streams and events.
// Everything runs when it is called, so streams and events only keep order
// trivially; what this file checks is what a GPU would refuse or fault on:
// launch configurations, copies and memsets outside an allocation, frees of
// what cudaMalloc did not hand out, device numbers out of range.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>

#include "tests/cuda_emulator/runtime_state.h"

struct EmulatedStream {
  int device = 0;
};
struct EmulatedEvent {
  bool timing = true, recorded = false;
  std::chrono::steady_clock::time_point at;
};

namespace emu {
namespace {

constexpr std::size_t kDefaultSharedBytes = 48 * 1024;
constexpr std::size_t kMaxSharedBytes = 227 * 1024;  // an H100's opt-in maximum per block
constexpr unsigned char kGarbage = 0xff;             // float and double NaN, integer -1
// An H100's shared memory on fewer SMs (it has 132): the products choose their
// tiles to fill the SMs (cuda/gemm_common.cuh), so each choice (128 x 128
// tiles, 64 x 64, slices of K) is taken here at shapes some 16 times smaller,
// and the tests, which size such cases from the count, emulate that much less.
constexpr int kMultiprocessors = 8;

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

// ATTOGRAD_EMULATED_GPUS devices (1 by default), each with
// ATTOGRAD_EMULATED_GPU_MIB of memory (8 GiB by default).
int env_number(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
int device_total() {
  static const int n = env_number("ATTOGRAD_EMULATED_GPUS", 1);
  return n;
}
std::size_t device_capacity() {
  static const std::size_t bytes = static_cast<std::size_t>(env_number("ATTOGRAD_EMULATED_GPU_MIB", 8192)) << 20;
  return bytes;
}

struct Allocation {
  std::size_t bytes;
  int device;
};

class DeviceMemory {
 public:
  cudaError_t allocate(void** pointer, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    if (in_use_[current_device] + bytes > device_capacity()) return fail(cudaErrorMemoryAllocation);
    void* p = nullptr;
    if (posix_memalign(&p, 256, std::max<std::size_t>(bytes, 1)) != 0) return fail(cudaErrorMemoryAllocation);
    std::memset(p, kGarbage, bytes);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, current_device};
    in_use_[current_device] += bytes;
    *pointer = p;
    return cudaSuccess;
  }

  cudaError_t release(void* pointer) {
    if (!pointer) return cudaSuccess;
    std::lock_guard lock(mutex_);
    const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (it == blocks_.end()) {
      std::fprintf(stderr, "emulated CUDA: cudaFree(%p) of a pointer cudaMalloc did not return\n", pointer);
      return fail(cudaErrorInvalidValue);
    }
    std::memset(pointer, kGarbage, it->second.bytes);
    in_use_[it->second.device] -= it->second.bytes;
    blocks_.erase(it);
    std::free(pointer);
    return cudaSuccess;
  }

  // Whether [p, p + bytes) lies in one allocation.
  bool holds(const void* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return false;
    --it;
    return address - it->first + bytes <= it->second.bytes;
  }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, Allocation> blocks_;
  std::map<int, std::size_t> in_use_;
};

DeviceMemory& memory() {
  static DeviceMemory* m = new DeviceMemory;  // leaked: tensors may free during static destruction
  return *m;
}

cudaError_t check_range(const char* api, const char* which, const void* p, std::size_t bytes) {
  if (bytes == 0 || memory().holds(p, bytes)) return cudaSuccess;
  std::fprintf(stderr, "emulated CUDA: %s: %s [%p, +%zu bytes) is not inside one cudaMalloc allocation\n", api, which,
               p, bytes);
  return fail(cudaErrorInvalidValue);
}

struct Kernels {
  std::mutex mutex;
  std::map<const void*, std::size_t> max_dynamic_smem;
};
Kernels& kernels() {
  static Kernels* k = new Kernels;
  return *k;
}

}  // namespace

void set_last_error(cudaError_t error) { last_error = error; }

cudaError_t check_launch(const void* kernel, dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    std::fprintf(stderr, "emulated CUDA: kernel %p refused: grid (%u,%u,%u), block (%u,%u,%u)\n", kernel, grid.x,
                 grid.y, grid.z, block.x, block.y, block.z);
    return cudaErrorInvalidConfiguration;
  }
  std::size_t allowed = kDefaultSharedBytes;
  {
    std::lock_guard lock(kernels().mutex);
    const auto it = kernels().max_dynamic_smem.find(kernel);
    if (it != kernels().max_dynamic_smem.end()) allowed = std::max(allowed, it->second);
  }
  if (dynamic_smem > allowed) {
    std::fprintf(stderr,
                 "emulated CUDA: kernel %p refused: %zu bytes of dynamic shared memory, %zu allowed "
                 "(cudaFuncAttributeMaxDynamicSharedMemorySize)\n",
                 kernel, dynamic_smem, allowed);
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t set_function_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<std::size_t>(value) > kMaxSharedBytes)
    return fail(cudaErrorInvalidValue);
  std::lock_guard lock(kernels().mutex);
  kernels().max_dynamic_smem[kernel] = static_cast<std::size_t>(value);
  return cudaSuccess;
}

}  // namespace emu

using emu::fail;

namespace {
// Each error's name and CUDA's words for it.
struct ErrorText {
  cudaError_t error;
  const char *name, *text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
};
constexpr ErrorText kUnknownError = {cudaSuccess, "cudaErrorUnknown", "unknown error"};
const ErrorText& error_text(cudaError_t error) {
  for (const ErrorText& e : kErrors)
    if (e.error == error) return e;
  return kUnknownError;
}
}  // namespace

const char* cudaGetErrorName(cudaError_t error) { return error_text(error).name; }
const char* cudaGetErrorString(cudaError_t error) { return error_text(error).text; }

cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return emu::last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = emu::device_total();
  return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = emu::current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= emu::device_total()) return fail(cudaErrorInvalidDevice);
  emu::current_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int length, int device) {
  if (device < 0 || device >= emu::device_total() || length <= 0) return fail(cudaErrorInvalidValue);
  std::snprintf(id, static_cast<std::size_t>(length), "emulated:%02d", device);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device < 0 || device >= emu::device_total()) return fail(cudaErrorInvalidDevice);
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount:
      *value = emu::kMultiprocessors;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(emu::kMaxSharedBytes);
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) { return emu::memory().allocate(pointer, bytes); }
cudaError_t cudaFree(void* pointer) { return emu::memory().release(pointer); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  const bool device_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool device_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (device_dst && emu::check_range("cudaMemcpyAsync", "destination", dst, bytes) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (device_src && emu::check_range("cudaMemcpyAsync", "source", src, bytes) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t) {
  if (emu::check_range("cudaMemsetAsync", "destination", dst, bytes) != cudaSuccess) return cudaErrorInvalidValue;
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}

// Streams live in a list that is never freed, as a GPU's streams live in the
// driver: a program may keep one to its end (cuda/runtime.cu does) without
// LeakSanitizer calling it a leak.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  static std::mutex mutex;
  static auto* streams = new std::list<EmulatedStream>;
  std::lock_guard lock(mutex);
  *stream = &streams->emplace_back(EmulatedStream{emu::current_device});
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return stream ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
  return event ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  *event = new EmulatedEvent{!(flags & cudaEventDisableTiming), false, {}};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  event->recorded = true;
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return event ? cudaSuccess : fail(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end || !start->timing || !end->timing || !start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
