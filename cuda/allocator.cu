// A caching allocator for device memory. cudaMalloc and cudaFree cost tens of
// microseconds and cudaFree synchronises the whole device, so freed blocks are
// kept in free lists keyed by their rounded size and handed out again: after
// the first training step every request is a reuse. (PyTorch's allocator also
// splits and merges blocks; exact size classes are enough for a training loop
// that repeats the same shapes, and much shorter to read.)
//
// Reuse is safe without events because all work on a device runs on its one
// stream (cuda/stream.h): a kernel that still reads a freed block was queued
// before any kernel that the block's next owner queues.
//
// ATTOGRAD_CUDA_NO_CACHE=1 turns the cache off (every free is a cudaFree) and
// the rounding with it (every block its exact size), so compute-sanitizer's
// memcheck can see a use after free that reuse would hide, and an overrun
// that the rounding would.
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "cuda/check.h"
#include "cuda/runtime.h"

namespace attograd::cuda {
namespace {

// Small blocks round up to 512 bytes, large ones to 2 MiB: a few size classes
// cover the shapes of a model, and a large block wastes at most 2 MiB.
std::size_t round_size(std::size_t nbytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t(2) << 20, kLargeFrom = std::size_t(1) << 20;
  if (nbytes < kLargeFrom) return (std::max<std::size_t>(nbytes, 1) + kSmall - 1) / kSmall * kSmall;
  return (nbytes + kLarge - 1) / kLarge * kLarge;
}

// Makes a device current for its scope and then restores the caller's, so
// that a free (run by a destructor, anywhere) does not leave the launches that
// follow it pointed at another GPU.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device) status_ = cudaSetDevice(device);
  }
  ~OnDevice() {
    if (status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  cudaError_t status_;
};

class DeviceCache {
 public:
  explicit DeviceCache(int device) : device_(device) {}

  void* get(std::size_t nbytes) {
    const std::size_t size = block_size(nbytes);
    std::lock_guard lock(mutex_);
    void* p = nullptr;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      stats_.cached -= size;
      ++stats_.reuses;
    } else {
      p = fresh(size);
      ++stats_.cuda_mallocs;
    }
    stats_.allocated += size;
    stats_.peak = std::max(stats_.peak, stats_.allocated);
    return p;
  }

  void put(void* p, std::size_t nbytes) {
    const std::size_t size = block_size(nbytes);
    std::lock_guard lock(mutex_);
    stats_.allocated -= size;
    if (!caching_) {
      // Called from destructors: a failure here cannot be thrown, and is reported by the next checked call.
      const OnDevice on(device_);
      cudaFree(p);
      return;
    }
    stats_.cached += size;
    free_[size].push_back(p);
  }

  void release() {
    std::lock_guard lock(mutex_);
    release_locked();
  }

  MemoryStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  std::size_t block_size(std::size_t nbytes) const {
    return caching_ ? round_size(nbytes) : std::max<std::size_t>(nbytes, 1);
  }

  // cudaMalloc, and on failure once more after giving every cached block back.
  void* fresh(std::size_t size) {
    const OnDevice on(device_);
    CUDA_CHECK(on.status());
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, size);
    if (status == cudaErrorMemoryAllocation && stats_.cached > 0) {
      cudaGetLastError();  // clear it before retrying
      release_locked();
      status = cudaMalloc(&p, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail("cuda malloc", "out of memory allocating {} bytes on cuda:{} ({} bytes in use, peak {})", size, device_,
           stats_.allocated, stats_.peak);
    }
    CUDA_CHECK(status);
    return p;
  }

  void release_locked() {
    const OnDevice on(device_);
    CUDA_CHECK(on.status());
    // The lists are emptied before any cudaFree, so that a failing one cannot
    // leave freed blocks in them to be handed out again; the rest are still
    // freed, and the first failure is reported after.
    std::map<std::size_t, std::vector<void*>> blocks;
    blocks.swap(free_);
    stats_.cached = 0;
    cudaError_t first_error = cudaSuccess;
    // cudaFree waits for the device, so no queued kernel can still be using a block.
    for (auto& [size, list] : blocks)
      for (void* p : list) {
        const cudaError_t status = cudaFree(p);
        if (first_error == cudaSuccess) first_error = status;
      }
    CUDA_CHECK(first_error);
  }

  const int device_;
  const bool caching_ = std::getenv("ATTOGRAD_CUDA_NO_CACHE") == nullptr;
  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // rounded size -> free blocks
  MemoryStats stats_;
};

DeviceCache& cache(int device) {
  // Leaked on purpose, the list too: tensors may be destroyed during static
  // destruction, after the CUDA runtime is gone (and after a static list would
  // be); returning a block to a free list is still safe then.
  static const std::vector<DeviceCache*>& caches = *[] {
    auto* all = new std::vector<DeviceCache*>;
    for (int d = 0; d < device_count(); ++d) all->push_back(new DeviceCache(d));
    return all;
  }();
  AG_CHECK(device >= 0 && device < static_cast<int>(caches.size()), "cuda malloc", "no CUDA device {} ({} present)",
           device, caches.size());
  return *caches[device];
}

}  // namespace

void* device_malloc(std::size_t nbytes, int device) { return cache(device).get(nbytes); }

void device_free(void* ptr, std::size_t nbytes, int device) {
  if (ptr) cache(device).put(ptr, nbytes);
}

MemoryStats memory_stats(int device) {
  if (device < 0 || device >= device_count()) return {};
  return cache(device).stats();
}

void release_cached(int device) { cache(device).release(); }

}  // namespace attograd::cuda
