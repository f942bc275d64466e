#pragma once
// attograd's one threading scheme on the CPU: a small pool of blocking (never
// spinning) workers for our own loops, and OpenBLAS told to use the same
// number of threads for GEMMs. Our loops never call BLAS from inside a
// parallel region, so the two pools never run at once and never fight.
#include <cstdint>
#include <functional>

namespace attograd {

// Elements below which a loop is not worth splitting across threads.
inline constexpr std::int64_t kParallelGrain = 32768;

void set_num_threads(int n);  // our pool and OpenBLAS; n >= 1
int get_num_threads();

// Calls fn(begin, end) on disjoint chunks covering [begin, end), at least
// `grain` long, on up to get_num_threads() threads; returns when all are done.
// Nested calls run serially in the calling thread.
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

}  // namespace attograd
