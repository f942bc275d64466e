// Device count, streams and copies for attograd. One stream per device; copies
// are issued on it and synchronised before returning host-visible data.
// Device memory itself is in cuda/allocator.cu.
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/device_utils.cuh"
#include "cuda/runtime.h"
#include "cuda/stream.h"

namespace attograd::cuda {

bool built_with_cuda() { return true; }

namespace {
struct DeviceCount {
  int count = 0;
  cudaError_t status = cudaSuccess;
};

// No driver or no GPU is not an error here: it means "no CUDA devices". The
// runtime's reason is kept, since a driver older than the runtime also ends
// here and "no device" alone would hide it.
const DeviceCount& probe_devices() {
  static const DeviceCount probed = [] {
    DeviceCount d;
    d.status = cudaGetDeviceCount(&d.count);
    if (d.status != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error
      d.count = 0;
    }
    return d;
  }();
  return probed;
}
}  // namespace

int device_count() { return probe_devices().count; }

std::string no_device_reason() {
  const DeviceCount& d = probe_devices();
  if (d.count > 0) return "";
  if (d.status == cudaSuccess) return "the CUDA runtime counts 0 devices";
  return fmt::format("{}: {}", cudaGetErrorName(d.status), cudaGetErrorString(d.status));
}

namespace {
void check_device(int device) {
  AG_CHECK(device >= 0 && device < device_count(), "cuda", "no CUDA device {} ({} present)", device, device_count());
}
}  // namespace

std::string pci_bus_id(int device) {
  check_device(device);
  char id[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, device));
  return id;
}

int multiprocessor_count(int device) {
  check_device(device);
  int count = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

bool wgmma_kernels_run(int device) {
  check_device(device);
#if defined(ATTOGRAD_CUDA_EMULATION)
  return true;
#elif defined(ATTOGRAD_CUDA_SM90A)
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

cudaStream_t stream(int device) {
  check_device(device);
  static std::mutex mutex;
  static std::vector<cudaStream_t> streams;
  CUDA_CHECK(cudaSetDevice(device));
  std::lock_guard lock(mutex);
  if (streams.empty()) streams.assign(device_count(), nullptr);
  if (!streams[device]) CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  return streams[device];
}

void copy_host_to_device(void* dst, const void* src, std::size_t nbytes, int device) {
  const cudaStream_t s = stream(device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
  // The host buffer may be freed as soon as we return: wait for the copy.
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_device_to_host(void* dst, const void* src, std::size_t nbytes, int device) {
  const cudaStream_t s = stream(device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_device_to_device(void* dst, const void* src, std::size_t nbytes, int device) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream(device)));
}

void synchronize(int device) { CUDA_CHECK(cudaStreamSynchronize(stream(device))); }

namespace {
// A CUDA event that is destroyed with its scope.
class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};
}  // namespace

double time_gpu_ms(int device, const std::function<void()>& fn) {
  const cudaStream_t s = stream(device);  // makes `device` current: the events belong to it
  Event start, stop;
  CUDA_CHECK(cudaEventRecord(start.get(), s));
  fn();
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaEventRecord(stop.get(), s));
  CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

// ---- dynamic shared memory allowed per kernel (device_utils.cuh's allow_shared_memory) ----

namespace {
struct SharedMemoryAllowances {
  std::mutex mutex;
  std::map<std::pair<const void*, int>, std::size_t> bytes;  // (kernel, device): the most set
};
SharedMemoryAllowances& shared_memory_allowances() {
  static SharedMemoryAllowances allowances;
  return allowances;
}
int device_now() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}
}  // namespace

bool shared_memory_allowed(const void* kernel, std::size_t bytes) {
  SharedMemoryAllowances& a = shared_memory_allowances();
  const std::pair<const void*, int> key{kernel, device_now()};
  const std::lock_guard<std::mutex> lock(a.mutex);
  const auto found = a.bytes.find(key);
  return found != a.bytes.end() && found->second >= bytes;
}

void note_shared_memory_allowed(const void* kernel, std::size_t bytes) {
  SharedMemoryAllowances& a = shared_memory_allowances();
  const std::pair<const void*, int> key{kernel, device_now()};
  const std::lock_guard<std::mutex> lock(a.mutex);
  std::size_t& allowed = a.bytes[key];
  allowed = std::max(allowed, bytes);
}

}  // namespace attograd::cuda
