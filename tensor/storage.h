#pragma once
// A flat, owned allocation on one device. Views share one Storage; its version
// counter is bumped by every in-place write so autograd can tell when a tensor
// it saved for backward was modified afterwards.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/device.h"

namespace attograd {

struct Remake;  // autograd/node.h

class Storage {
 public:
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  std::uint64_t version() const { return version_; }
  void bump_version() { ++version_; }
  // How these contents can be made again, where autograd knows (a layer norm's
  // output from its input): a backward that reads them then makes them anew
  // instead of keeping them (autograd/node.h's Remake).
  const std::shared_ptr<const Remake>& remake() const { return remake_; }
  void set_remake(std::shared_ptr<const Remake> remake) { remake_ = std::move(remake); }

 private:
  Storage(void* data, std::size_t nbytes, Device device) : data_(data), nbytes_(nbytes), device_(device) {}
  void* data_;
  std::size_t nbytes_;
  Device device_;
  std::uint64_t version_ = 0;
  std::shared_ptr<const Remake> remake_;
};

// Live CPU allocation counters, for tests and benchmarks that check a steady-state
// training step allocates nothing new.
struct CpuAllocStats {
  std::uint64_t allocations = 0;  // calls that went to the system allocator
  std::uint64_t reuses = 0;       // calls served from the cache
  std::size_t bytes_allocated = 0;  // bytes of the calls that went to the system allocator
  std::size_t bytes_in_use = 0;
  std::size_t bytes_cached = 0;
  std::size_t peak_bytes_in_use = 0;  // the most bytes_in_use since the start or cpu_reset_alloc_peaks
  std::size_t peak_bytes_held = 0;    // the most bytes_in_use + bytes_cached, likewise
};
CpuAllocStats cpu_alloc_stats();
void cpu_release_cached();  // frees every cached block; the cache's bound counts the peak in use from here on
void cpu_reset_alloc_peaks();

}  // namespace attograd
