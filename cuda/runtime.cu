// Device memory and copies for attograd. One stream per device; copies are
// issued on it and synchronised before returning host-visible data.
#include <mutex>
#include <vector>

#include "cuda/check.h"
#include "cuda/runtime.h"

namespace attograd::cuda {

bool built_with_cuda() { return true; }

int device_count() {
  // No driver or no GPU is not an error here: it means "no CUDA devices".
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error
      return 0;
    }
    return n;
  }();
  return count;
}

cudaStream_t stream(int device) {
  static std::mutex mutex;
  static std::vector<cudaStream_t> streams;
  std::lock_guard lock(mutex);
  if (streams.empty()) streams.assign(device_count(), nullptr);
  if (!streams[device]) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  }
  return streams[device];
}

void* device_malloc(std::size_t nbytes, int device) {
  AG_CHECK(device >= 0 && device < device_count(), "cuda malloc", "no CUDA device {} ({} present)", device,
           device_count());
  CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(nbytes, 1)));
  return p;
}

void device_free(void* ptr, std::size_t, int device) {
  if (!ptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);  // never throws from a destructor path
}

void copy_host_to_device(void* dst, const void* src, std::size_t nbytes, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream(device)));
  CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

void copy_device_to_host(void* dst, const void* src, std::size_t nbytes, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream(device)));
  CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

void copy_device_to_device(void* dst, const void* src, std::size_t nbytes, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream(device)));
}

void synchronize(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

}  // namespace attograd::cuda
