#include "tensor/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "tensor/error.h"

namespace attograd {
namespace {

thread_local bool in_parallel_region = false;

// Workers sleep on a condition variable between jobs: a spinning pool beside
// OpenBLAS's own threads would steal the cores BLAS needs.
class Pool {
 public:
  explicit Pool(int threads) { resize(threads); }
  ~Pool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }  // + the calling thread

  void resize(int threads) {
    stop();
    std::lock_guard lock(mutex_);
    quit_ = false;
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  // Runs task(worker_index) on every thread, the caller being worker 0.
  void run(int n, const std::function<void(int)>& task) {
    {
      std::lock_guard lock(mutex_);
      task_ = &task;
      participants_ = n;
      active_ = n - 1;
      ++generation_;
      error_ = nullptr;
    }
    wake_.notify_all();
    run_guarded(0, task);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run_guarded(int index, const std::function<void(int)>& task) {
    in_parallel_region = true;
    try {
      task(index);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    in_parallel_region = false;
  }

  void work(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        task = task_;
        // A job of fewer threads than the pool leaves the higher-numbered workers idle.
        if (index >= participants_ || !task) continue;
      }
      run_guarded(index, *task);
      std::lock_guard lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* task_ = nullptr;
  std::uint64_t generation_ = 0;
  int participants_ = 0;  // threads taking part in the current job, caller included
  int active_ = 0;        // participating workers still running
  bool quit_ = false;
  std::exception_ptr error_;
};

int default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

Pool& pool() {
  static Pool p(default_threads());
  return p;
}
std::mutex run_mutex;  // one parallel job at a time from outside the pool

}  // namespace

void set_num_threads(int n) {
  AG_CHECK(n >= 1, "set_num_threads", "thread count must be >= 1, got {}", n);
  std::lock_guard lock(run_mutex);
  pool().resize(n);
}

void ensure_blas_single_threaded() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

int get_num_threads() { return pool().size(); }

void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (begin >= end) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t chunks = std::min<std::int64_t>(get_num_threads(), (end - begin + grain - 1) / grain);
  if (chunks <= 1 || in_parallel_region) {
    fn(begin, end);
    return;
  }
  std::lock_guard lock(run_mutex);
  const std::int64_t step = (end - begin + chunks - 1) / chunks;
  pool().run(static_cast<int>(chunks), [&](int index) {
    const std::int64_t lo = begin + index * step, hi = std::min(end, lo + step);
    if (lo < hi) fn(lo, hi);
  });
}

}  // namespace attograd
