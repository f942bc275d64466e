// The emulator's mbarriers and TMA copies (emulator.h says what they model).
// A barrier's state lives here, keyed by its shared memory address; its 8
// bytes in shared memory are left as they are.
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "tests/cuda_emulator/cuda_runtime.h"
#include "tests/cuda_emulator/scheduler.h"

namespace emu {
namespace {

struct PendingCopy {
  TensorMap map;
  std::uint32_t destination;
  int coordinates[3];
};

struct MBarrier {
  int count = 0, pending = 0;                // arrivals a phase needs, and those still to come
  std::int64_t transaction_bytes = 0;        // expected and not yet come
  std::uint64_t completed = 0;               // phases
  std::vector<PendingCopy> copies;           // issued, not made yet (first warp ahead)
  std::vector<std::size_t> waiters;          // workers
};

// This host thread's block's barriers: blocks run one at a time on it.
thread_local std::map<std::uint32_t, MBarrier> barriers;

MBarrier& barrier_at(std::uint32_t address, const char* what) {
  const auto found = barriers.find(address);
  if (found == barriers.end()) {
    char line[160];
    std::snprintf(line, sizeof line, "%s on shared address %u, where no mbarrier.init made a barrier", what, address);
    device_fault(line);
  }
  return found->second;
}

std::uint64_t box_bytes(const TensorMap& map) {
  std::uint64_t bytes = static_cast<std::uint64_t>(map.element_bytes);
  for (int d = 0; d < map.rank; ++d) bytes *= map.box[d];
  return bytes;
}

// The box's elements, row after row of the box, zeros outside the tensor.
void make_copy(const PendingCopy& c) {
  const TensorMap& m = c.map;
  const std::uint32_t e = static_cast<std::uint32_t>(m.element_bytes);
  std::uint32_t box[3] = {1, 1, 1};
  for (int d = 0; d < m.rank; ++d) box[d] = m.box[d];
  std::uint32_t offset = 0;
  for (std::uint32_t i2 = 0; i2 < box[2]; ++i2)
    for (std::uint32_t i1 = 0; i1 < box[1]; ++i1)
      for (std::uint32_t i0 = 0; i0 < box[0]; ++i0, offset += e) {
        const std::int64_t at[3] = {std::int64_t{c.coordinates[0]} + i0, std::int64_t{c.coordinates[1]} + i1,
                                    std::int64_t{c.coordinates[2]} + i2};
        bool inside = true;
        std::uint64_t source = 0;
        for (int d = 0; d < m.rank; ++d) {
          inside = inside && at[d] >= 0 && static_cast<std::uint64_t>(at[d]) < m.dims[d];
          source += static_cast<std::uint64_t>(at[d]) * m.strides[d];
        }
        std::uint32_t physical = c.destination + offset;
        if (m.swizzle_128) physical ^= (physical >> 7 & 7u) << 4;
        void* to = shared_pointer(physical);
        if (inside)
          std::memcpy(to, static_cast<const std::byte*>(m.base) + source, e);
        else
          std::memset(to, 0, e);
      }
}

// The phase completes when its arrivals and bytes are all in; copies waited
// for are made once the arrivals are in (their bytes are the rest).
void settle(MBarrier& b) {
  if (b.pending == 0 && !b.waiters.empty()) {
    std::vector<PendingCopy> copies;
    copies.swap(b.copies);
    for (const PendingCopy& c : copies) {
      make_copy(c);
      b.transaction_bytes -= static_cast<std::int64_t>(box_bytes(c.map));
    }
  }
  if (b.pending != 0 || b.transaction_bytes != 0) return;
  ++b.completed;
  b.pending = b.count;
  for (std::size_t w : b.waiters) scheduler::resume(w);
  b.waiters.clear();
}

}  // namespace

void forget_mbarriers() { barriers.clear(); }

void mbarrier_init(std::uint32_t address, int count) {
  if (address % 8 != 0) device_fault("mbarrier.init: an address not aligned to 8 bytes");
  if (count < 1) device_fault("mbarrier.init: a count below 1");
  shared_pointer(address);  // inside the block's shared memory
  MBarrier& b = barriers[address];
  b = MBarrier{};
  b.count = b.pending = count;
}

void mbarrier_arrive(std::uint32_t address, std::uint32_t expect_bytes) {
  MBarrier& b = barrier_at(address, "mbarrier.arrive");
  if (b.pending == 0) device_fault("mbarrier.arrive: more arrivals than the barrier's count in one phase");
  b.transaction_bytes += expect_bytes;
  --b.pending;
  settle(b);
}

void mbarrier_wait(std::uint32_t address, int parity) {
  MBarrier& b = barrier_at(address, "mbarrier.try_wait");
  if ((b.completed & 1u) != static_cast<std::uint64_t>(parity & 1)) return;  // that parity's phase is complete
  b.waiters.push_back(scheduler::current_worker());
  settle(b);
  if ((b.completed & 1u) != static_cast<std::uint64_t>(parity & 1)) return;
  scheduler::suspend("an mbarrier's phase");
}

void tma_load(const TensorMap& map, std::uint32_t destination, std::uint32_t barrier, const int (&coordinates)[3]) {
  MBarrier& b = barrier_at(barrier, "cp.async.bulk.tensor");
  if (destination % 128 != 0) device_fault("cp.async.bulk.tensor: a shared memory destination not aligned to 128 bytes");
  shared_pointer(destination + static_cast<std::uint32_t>(box_bytes(map)) - 1);  // the box fits
  const PendingCopy copy{map, destination, {coordinates[0], coordinates[1], coordinates[2]}};
  if (scheduler::last_warp_ahead()) {
    make_copy(copy);  // at once: a copy into a stage other warps still read shows
    b.transaction_bytes -= static_cast<std::int64_t>(box_bytes(map));
  } else {
    b.copies.push_back(copy);  // when waited for: reading the tile sooner shows
  }
  settle(b);
}

}  // namespace emu
