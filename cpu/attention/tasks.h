#pragma once
// The tasks one thread takes from the queue, each with its successor. Part of
// the one translation unit cpu/attention/attention.cpp.
#include <cstdint>

#include "cpu/vec_math.h"
#include "cpu/parallel.h"

namespace attograd::cpu::attention_detail {

// The tasks a TaskQueue hands this thread, one at a time, each with its
// successor: the task this thread runs next, or -1. With look_ahead the
// thread claims its next chunk as it starts the last task of the current
// one, so that task can request its successor's first rows; it then holds
// one chunk it has not started, so without a successor worth prefetching it
// claims only once it is free. (A class, not a loop taking a lambda: a
// lambda's body would be compiled for the baseline target, not the one of
// the kernel it serves.)
class ClaimedTasks {
 public:
  ClaimedTasks(TaskQueue& queue, bool look_ahead) : queue_(queue), look_ahead_(look_ahead) {}
  AG_ALWAYS_INLINE bool next(std::int64_t& task, std::int64_t& successor) {
    if (lo_ == hi_) {
      if (claimed_ahead_) {
        lo_ = ahead_lo_;
        hi_ = ahead_hi_;
        claimed_ahead_ = false;
      } else if (!queue_.next(lo_, hi_)) {
        return false;
      }
    }
    task = lo_++;
    if (lo_ < hi_)
      successor = lo_;
    else if (look_ahead_ && (claimed_ahead_ = queue_.next(ahead_lo_, ahead_hi_)))
      successor = ahead_lo_;
    else
      successor = -1;
    return true;
  }

 private:
  TaskQueue& queue_;
  const bool look_ahead_;
  std::int64_t lo_ = 0, hi_ = 0, ahead_lo_ = 0, ahead_hi_ = 0;
  bool claimed_ahead_ = false;
};

}  // namespace attograd::cpu::attention_detail
