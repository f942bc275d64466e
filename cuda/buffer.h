#pragma once
// Scratch device memory for a launcher (partial sums, counters), from the
// caching allocator and given back when the buffer goes out of scope. Giving
// it back before the kernels that use it have run is safe: the next owner's
// kernels queue behind them on the same stream (cuda/stream.h).
#include <cstddef>

#include "cuda/check.h"
#include "cuda/runtime.h"

namespace attograd::cuda {

class DeviceBuffer {
 public:
  // On the current device (the one the caller's stream belongs to).
  explicit DeviceBuffer(std::size_t nbytes) : nbytes_(nbytes) {
    CUDA_CHECK(cudaGetDevice(&device_));
    ptr_ = device_malloc(nbytes_, device_);
  }
  ~DeviceBuffer() { device_free(ptr_, nbytes_, device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  std::size_t nbytes_;
  int device_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace attograd::cuda
