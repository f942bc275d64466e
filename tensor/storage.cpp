#include "tensor/storage.h"

#include <map>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "cuda/runtime.h"
#include "cpu/host_memory.h"

namespace attograd {
namespace {

// A size-bucketed cache of CPU blocks: a training step allocates the same sizes
// every iteration, so after the first step every request is a cache hit and
// the system allocator (and its page faults on fresh memory) is out of the loop.
class CpuCache {
 public:
  void* get(std::size_t nbytes) {
    std::lock_guard lock(mutex_);
    stats_.bytes_in_use += nbytes;
    auto it = free_.find(nbytes);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.bytes_cached -= nbytes;
      ++stats_.reuses;
      return p;
    }
    ++stats_.allocations;
    void* p = cpu::allocate_host(nbytes);
    if (!p) fail("alloc", "out of memory allocating {} bytes", nbytes);
    return p;
  }
  void put(void* p, std::size_t nbytes) {
    std::lock_guard lock(mutex_);
    stats_.bytes_in_use -= nbytes;
    if (stats_.bytes_cached + nbytes > kMaxCachedBytes) {
      cpu::free_host(p);  // the cache is full: sizes this varied are not a training loop's
      return;
    }
    stats_.bytes_cached += nbytes;
    free_[nbytes].push_back(p);
  }
  void release() {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) cpu::free_host(p);
    free_.clear();
    stats_.bytes_cached = 0;
  }
  CpuAllocStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  static constexpr std::size_t kMaxCachedBytes = std::size_t{4} << 30;  // 4 GiB
  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
  CpuAllocStats stats_;
};

CpuCache& cpu_cache() {
  static auto* cache = new CpuCache();  // leaked on purpose: storages may die during static destruction
  return *cache;
}

}  // namespace

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  void* p = device.is_cpu() ? cpu_cache().get(nbytes) : cuda::device_malloc(nbytes, device.index);
  return std::shared_ptr<Storage>(new Storage(p, nbytes, device));
}

Storage::~Storage() {
  if (device_.is_cpu())
    cpu_cache().put(data_, nbytes_);
  else
    cuda::device_free(data_, nbytes_, device_.index);
}

CpuAllocStats cpu_alloc_stats() { return cpu_cache().stats(); }
void cpu_release_cached() { cpu_cache().release(); }

}  // namespace attograd
