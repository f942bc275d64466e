#pragma once
// Software prefetch of the rows a tile, and a thread's next task, read
// first. Part of the one translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>

#include "cpu/attention/problem.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::attention_detail {

// The hardware prefetchers follow long sequential runs, but a head's rows are
// short runs (and strided ones when q, k, v are views of one packed
// projection): without help the kernels waited on memory for a quarter of
// their time at the GPT shape. So each task queues the rows its successor
// starts with and requests a slice of them after each of its own tiles, and
// the backward's key tiles request the next tile's keys and values.
//
// The forward's key tiles do not: they had requested the next tile's rows
// into L1, a few after each row group, and perf put a good share of the
// forward's samples on that loop (its instructions and waits for fill buffers) while a
// head's keys and values sit in L2 after its first query block. Without it
// the forward is as fast or faster, on contiguous heads and on the compact
// copies of long ones alike.

// Requests the lines of rows [t0, t0 + n) of (b, h), each line once.
template <typename T, int kLocality = 3>
AG_ALWAYS_INLINE void prefetch_rows(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
                                    std::int64_t D) {
  const std::int64_t bytes = D * static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t t = t0; t < t0 + n; ++t) {
    const auto row = reinterpret_cast<std::uintptr_t>(x.row(b, h, t));
    for (std::uintptr_t line = row & ~std::uintptr_t(63); line < row + bytes; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, kLocality);
  }
}

// Rows queued for prefetching, requested a few at a time.
template <typename T>
class PrefetchQueue {
 public:
  explicit PrefetchQueue(std::int64_t D) : D_(D) {}
  // Queues rows [t0, t0 + n) of (b, h).
  void add(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n) {
    if (n <= 0 || count_ == kMaxRuns) return;
    runs_[count_++] = {x, b, h, t0, n};
    rows_ += n;
  }
  std::int64_t rows() const { return rows_; }
  // Requests the next n queued rows into L2 (locality 1): they are the next
  // block's, needed only once this one's tiles are done with L1.
  void request(std::int64_t n) {
    while (n > 0 && current_ < count_) {
      const Run& run = runs_[current_];
      const std::int64_t take = std::min(n, run.n - done_);
      prefetch_rows<T, 1>(run.x, run.b, run.h, run.t0 + done_, take, D_);
      n -= take;
      done_ += take;
      if (done_ == run.n) ++current_, done_ = 0;
    }
  }

 private:
  static constexpr int kMaxRuns = 8;
  struct Run {
    Rows<T> x;
    std::int64_t b, h, t0, n;
  };
  std::int64_t D_;
  Run runs_[kMaxRuns] = {};
  int count_ = 0, current_ = 0;
  std::int64_t rows_ = 0, done_ = 0;
};

// The lines of one span of memory, requested into L2 a slice per step() over `steps` calls.
class SpanPrefetch {
 public:
  SpanPrefetch(const void* begin, std::int64_t bytes, std::int64_t steps)
      : next_(reinterpret_cast<std::uintptr_t>(begin) & ~std::uintptr_t(63)),
        end_(reinterpret_cast<std::uintptr_t>(begin) + static_cast<std::uintptr_t>(std::max<std::int64_t>(bytes, 0))),
        per_step_((static_cast<std::int64_t>(end_ - next_) / 64 + steps) / std::max<std::int64_t>(steps, 1)) {}
  AG_ALWAYS_INLINE void step() {
    for (std::int64_t n = 0; n < per_step_ && next_ < end_; ++n, next_ += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(next_), 0, 2);
  }

 private:
  std::uintptr_t next_, end_;
  std::int64_t per_step_;
};

// A task's successor is prefetched only when what it reads first is this
// small; bigger ones would push the current task's data out of L2.
constexpr std::int64_t kPrefetchBytes = 256 << 10;

}  // namespace attograd::cpu::attention_detail
