#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"

namespace attograd {
namespace {

thread_local bool in_parallel_region = false;

// How long a thread waits actively for the next job (worker) or for the
// others to finish (caller) before it sleeps. A training step runs hundreds
// of parallel loops a few microseconds apart; waking a sleeping thread costs
// tens of microseconds on a VM (the idle virtual CPU is halted), a large part
// of a small attention's forward + backward. A bounded spin keeps that latency
// off the critical path.
constexpr auto kSpin = std::chrono::microseconds(50);

// But when other programs want the cores, a spinning thread takes the time
// slices they (and our other thread) need, and loses the scheduler's wake-up
// priority: with one core busy elsewhere, spinning made that MHA step much
// slower than sleeping at once. So spinning stops while more threads are
// runnable than there are cores (the instantaneous count in /proc/loadavg,
// read at most every 10 ms), and resumes when fewer are.
class SpinPolicy {
 public:
  bool allowed() {
    const std::int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    std::int64_t last = last_check_us_.load(std::memory_order_relaxed);
    if (now - last > 10000 && last_check_us_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      const int running = runnable_threads();
      if (running > cores_) allowed_.store(false, std::memory_order_relaxed);
      if (running >= 0 && running < cores_) allowed_.store(true, std::memory_order_relaxed);
    }
    return allowed_.load(std::memory_order_relaxed);
  }

 private:
  // The 4th field of /proc/loadavg, "running/total": runnable threads now, this one included; -1 if unknown.
  static int runnable_threads() {
    std::FILE* f = std::fopen("/proc/loadavg", "r");
    if (!f) return -1;
    double l1, l5, l15;
    int running = -1, total;
    if (std::fscanf(f, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5) running = -1;
    std::fclose(f);
    return running;
  }

  const int cores_ = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<std::int64_t> last_check_us_{0};
  std::atomic<bool> allowed_{true};
};

SpinPolicy& spin_policy() {
  static SpinPolicy policy;
  return policy;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until pred() or kSpin elapses (at once when spinning is not allowed); returns pred().
template <typename Pred>
bool spin_until(Pred pred) {
  if (pred() || !spin_policy().allowed()) return pred();
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return pred();
  }
}

// Workers wait for a job by spinning briefly, then sleeping on a condition
// variable; OpenBLAS has no threads of its own here to compete with.
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
      active_.store(n - 1, std::memory_order_relaxed);
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_guarded(0, task);
    if (!spin_until([&] { return active_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
    }
    std::lock_guard lock(mutex_);
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
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return quit_ || generation_.load(std::memory_order_relaxed) != seen; });
        if (quit_) return;
        seen = generation_.load(std::memory_order_relaxed);
        task = task_;
        // A job of fewer threads than the pool leaves the higher-numbered workers idle.
        if (index >= participants_ || !task) continue;
      }
      run_guarded(index, *task);
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // Under the mutex, so a caller between its check and its wait cannot miss this.
        std::lock_guard lock(mutex_);
        done_.notify_one();
      }
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
  std::atomic<std::uint64_t> generation_{0};
  int participants_ = 0;         // threads taking part in the current job, caller included
  std::atomic<int> active_{0};   // participating workers still running
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

void parallel_tasks(std::int64_t begin, std::int64_t end, std::int64_t grain,
                    const std::function<void(TaskQueue&)>& worker) {
  if (begin >= end) return;
  TaskQueue queue(begin, end, grain);
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t threads = std::min<std::int64_t>(get_num_threads(), (end - begin + grain - 1) / grain);
  if (threads <= 1 || in_parallel_region) {
    worker(queue);
    return;
  }
  std::lock_guard lock(run_mutex);
  pool().run(static_cast<int>(threads), [&](int) { worker(queue); });
}

}  // namespace attograd
