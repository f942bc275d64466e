#pragma once
// attograd's one threading scheme on the CPU: a small pool of workers runs
// every parallel loop, GEMMs included; between jobs they wait actively for at
// most 50 us, then sleep (tensor/parallel.cpp). OpenBLAS is kept
// single-threaded and called from our workers on slices of each product: its
// own pthread pool spins in sched_yield between calls, and beside ours on two
// cores that made 2 threads 2.3x slower than 1 on a training step.
#include <cstdint>
#include <functional>

namespace attograd {

// Elements below which a loop is not worth splitting across threads.
inline constexpr std::int64_t kParallelGrain = 32768;

void set_num_threads(int n);  // n >= 1
// Keeps OpenBLAS single-threaded; called before any BLAS call (cheap after the first).
void ensure_blas_single_threaded();
int get_num_threads();

// Calls fn(begin, end) on disjoint chunks covering [begin, end), at least
// `grain` long, on up to get_num_threads() threads; returns when all are done.
// Nested calls run serially in the calling thread.
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

}  // namespace attograd
