#pragma once
// attograd's one threading scheme on the CPU: a small pool of workers runs
// every parallel loop, GEMMs included; between jobs they wait actively for at
// most 50 us, then sleep (cpu/parallel.cpp). OpenBLAS is kept
// single-threaded (cpu/blas_setup.h) and called from our workers on
// slices of each product: its own pthread pool spins in sched_yield between
// calls, and beside ours on two cores that made 2 threads slower than 1 on a
// training step.
#include <atomic>
#include <cstdint>
#include <functional>

namespace attograd {

// Elements below which a loop is not worth splitting across threads.
inline constexpr std::int64_t kParallelGrain = 32768;

void set_num_threads(int n);  // n >= 1
int get_num_threads();

// Calls fn(begin, end) on disjoint chunks covering [begin, end), at least
// `grain` long, on up to get_num_threads() threads; returns when all are done.
// Nested calls run serially in the calling thread.
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

// The tasks [begin, end) in chunks of `grain`, handed out in order to
// whichever thread asks next. parallel_for gives each thread one fixed share,
// so the job lasts as long as its slowest thread; on a core shared with
// another program (or a virtual CPU the host takes back) that thread runs at
// a fraction of its speed. Here the others take over its chunks.
class TaskQueue {
 public:
  TaskQueue(std::int64_t begin, std::int64_t end, std::int64_t grain)
      : next_(begin), end_(end), grain_(grain < 1 ? 1 : grain) {}
  // Claims the next chunk [lo, hi); false when none is left.
  bool next(std::int64_t& lo, std::int64_t& hi) {
    lo = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (lo >= end_) return false;
    hi = lo + grain_ < end_ ? lo + grain_ : end_;
    return true;
  }

 private:
  std::atomic<std::int64_t> next_;
  const std::int64_t end_, grain_;
};

// Runs worker(queue) once on each of up to get_num_threads() threads (no more
// than there are chunks), all drawing from one queue over [begin, end); each
// keeps whatever per-thread state it needs across its chunks. Returns when
// all are done. Nested calls run serially in the calling thread.
void parallel_tasks(std::int64_t begin, std::int64_t end, std::int64_t grain,
                    const std::function<void(TaskQueue&)>& worker);

}  // namespace attograd
