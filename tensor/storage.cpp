#include "tensor/storage.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "cuda/runtime.h"
#include "cpu/host_memory.h"

namespace attograd {
namespace {

// A size-bucketed cache of CPU blocks: a training step allocates the same sizes
// every iteration, so once a step has run nearly every request is a cache hit
// and the system allocator (and its page faults on fresh memory) is out of the
// loop. A block serves only requests of its own size, so the cache is bounded
// by what the program has needed at once: a request it cannot serve first
// frees the blocks cached longest, until the memory held (in use and cached)
// stays within the peak in use plus a sixteenth. Memory a step held for one
// size and then needs for another goes back to the system in between (large
// blocks are mapped and unmapped: cpu/host_memory.h), rather than resident
// twice.
class CpuCache {
 public:
  void* get(std::size_t nbytes) {
    std::lock_guard lock(mutex_);
    stats_.bytes_in_use += nbytes;
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    peak_in_use_ever_ = std::max(peak_in_use_ever_, stats_.bytes_in_use);
    if (auto it = free_.upper_bound(nbytes); it != free_.begin() && std::prev(it)->first == nbytes) {
      it = std::prev(it);  // the last of that size cached: its lines may still be in a cache
      void* p = it->second.p;
      stats_.bytes_cached -= nbytes;
      free_.erase(it);
      ++stats_.reuses;
      return p;
    }
    const std::size_t limit = peak_in_use_ever_ + peak_in_use_ever_ / 16;
    while (!free_.empty() && stats_.bytes_in_use + stats_.bytes_cached > limit) evict_oldest();
    ++stats_.allocations;
    stats_.bytes_allocated += nbytes;
    stats_.peak_bytes_held = std::max(stats_.peak_bytes_held, stats_.bytes_in_use + stats_.bytes_cached);
    void* p = cpu::allocate_host(nbytes);
    if (!p) {
      release_locked();  // what the cache holds may be what the system lacks
      p = cpu::allocate_host(nbytes);
    }
    if (!p) {
      stats_.bytes_in_use -= nbytes;
      fail("alloc", "out of memory allocating {} bytes", nbytes);
    }
    return p;
  }
  void put(void* p, std::size_t nbytes) {
    std::lock_guard lock(mutex_);
    stats_.bytes_in_use -= nbytes;
    stats_.bytes_cached += nbytes;
    free_.emplace(nbytes, Cached{p, next_age_++});
  }
  void release() {
    std::lock_guard lock(mutex_);
    release_locked();
  }
  void reset_peaks() {
    std::lock_guard lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
    stats_.peak_bytes_held = stats_.bytes_in_use + stats_.bytes_cached;
  }
  CpuAllocStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  struct Cached {
    void* p;
    std::uint64_t age;  // when it was cached: a count of puts
  };
  void evict_oldest() {
    auto oldest = free_.begin();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second.age < oldest->second.age) oldest = it;
    cpu::free_host(oldest->second.p, oldest->first);
    stats_.bytes_cached -= oldest->first;
    free_.erase(oldest);
  }
  void release_locked() {  // and the bound counts the peak from here on
    for (const auto& [size, block] : free_) cpu::free_host(block.p, size);
    free_.clear();
    stats_.bytes_cached = 0;
    peak_in_use_ever_ = stats_.bytes_in_use;
  }
  std::mutex mutex_;
  std::multimap<std::size_t, Cached> free_;  // by size, equal sizes in the order cached
  std::uint64_t next_age_ = 0;
  std::size_t peak_in_use_ever_ = 0;
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
void cpu_reset_alloc_peaks() { cpu_cache().reset_peaks(); }

}  // namespace attograd
