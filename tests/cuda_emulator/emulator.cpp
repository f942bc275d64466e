// Runs a grid on the CPU: the blocks one after the other, each block's
// threads on fibers that switch only at __syncthreads, a shuffle or a thread's
// end, each straight to the next fiber that can go on. A barrier counts every
// thread of the block, as CUDA requires: a thread that returns while others
// wait at __syncthreads leaves them waiting, and the launch stops with a line
// saying so instead of hanging.
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <vector>

#include "tests/cuda_emulator/cuda_runtime.h"
#include "tests/cuda_emulator/runtime_state.h"
#include "tests/cuda_emulator/scheduler.h"

#if defined(__SANITIZE_ADDRESS__)  // gcc
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang
#define EMU_ASAN 1
#endif
#endif
#if defined(EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

// Switching fibers: on x86-64 a switch of the callee-saved registers (glibc's
// swapcontext also saves the signal mask, a system call each time); elsewhere
// ucontext.
#if defined(__x86_64__)
extern "C" void emu_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl emu_switch_stack
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");
#endif

namespace emu {
namespace {

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
void switch_context(Context& from, Context& to) { emu_switch_stack(&from.sp, to.sp); }
// A context that starts entry() on the stack [bottom, bottom + bytes): the
// frame emu_switch_stack pops, with entry as its return address.
void make_context(Context& c, char* bottom, std::size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::uintptr_t>(bottom + bytes) & ~std::uintptr_t{15});
  std::uint64_t* sp = top - 9;
  std::uint32_t mxcsr = 0;
  std::uint16_t fpu_control = 0;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpu_control));
  sp[0] = mxcsr | static_cast<std::uint64_t>(fpu_control) << 32;
  for (int r = 1; r <= 6; ++r) sp[r] = 0;          // r15, r14, r13, r12, rbx, rbp
  sp[7] = reinterpret_cast<std::uint64_t>(entry);  // where `ret` goes: entry sees rsp = top - 8, as after a call
  sp[8] = 0;
  c.sp = sp;
}
#else
struct Context {
  ucontext_t context;
};
void switch_context(Context& from, Context& to) { swapcontext(&from.context, &to.context); }
void make_context(Context& c, char* bottom, std::size_t bytes, void (*entry)()) {
  getcontext(&c.context);
  c.context.uc_stack.ss_sp = bottom;
  c.context.uc_stack.ss_size = bytes;
  c.context.uc_link = nullptr;
  makecontext(&c.context, entry, 0);
}
#endif

// A switch AddressSanitizer follows: it is told the stack switched to, and
// `saved` keeps the leaving side's fake stack (its frames checked for use after
// return) until that side is switched back to.
void switch_fiber(Context& from, void** saved, Context& to, const void* to_bottom, std::size_t to_bytes) {
#if defined(EMU_ASAN)
  __sanitizer_start_switch_fiber(saved, to_bottom, to_bytes);
  switch_context(from, to);
  __sanitizer_finish_switch_fiber(*saved, nullptr, nullptr);
#else
  (void)saved, (void)to_bottom, (void)to_bytes;
  switch_context(from, to);
#endif
}

// Debug and sanitizer builds need deep stacks; kernels themselves need little.
#if defined(EMU_ASAN)
constexpr std::size_t kStackBytes = 512 * 1024;
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif
constexpr int kWarp = 32;
constexpr std::size_t kMaxThreads = 1024;  // per block
constexpr int kNamedBarriers = 16;         // bar.sync's ids; 0 is __syncthreads'

// ATTOGRAD_EMULATED_ORDER=reverse starts a block's threads from the last to
// the first, so its last warp runs ahead of the others instead of its first.
bool reversed() {
  static const bool reverse = [] {
    const char* order = std::getenv("ATTOGRAD_EMULATED_ORDER");
    if (!order || !*order || std::strcmp(order, "forward") == 0) return false;
    if (std::strcmp(order, "reverse") == 0) return true;
    std::fprintf(stderr, "emulated CUDA: ATTOGRAD_EMULATED_ORDER=%s is neither forward nor reverse\n", order);
    std::exit(2);
  }();
  return reverse;
}

struct Barrier {
  int arrived = 0;
  std::uint64_t generation = 0;
  unsigned mask = 0;  // warps: the lanes taking part in this round
};

// What each lane of a warp published in one round of an exchange, lane after
// lane at the round's size (every lane of a round publishes as many bytes), so
// that all_gather hands them over in one copy.
using LaneValues = std::array<std::byte, kWarp * kMaxExchangeBytes>;

struct Warp {
  Barrier barrier;
  std::array<std::uint16_t, kWarp> waiters;  // the workers of the lanes waiting in this round
  LaneValues values[2] = {};  // by generation parity: a round's values stay until all lanes read them
  // A combining round's results, by parity as its values, and the round they
  // were made for plus one (0: none this block), so only its first lane on makes them.
  LaneValues results[2] = {};
  std::uint64_t combined[2] = {};
};

// A cp.async copy, made when its thread waits for its group.
struct AsyncCopy {
  void* destination;
  const void* source;
  std::size_t bytes, source_bytes;  // the rest of `bytes` past source_bytes is zero
};

// A wgmma product, made when its thread waits for its group.
struct PendingProduct {
  AsyncProduct make;
  std::array<std::byte, kMaxProductArgBytes> args;
};

// A thread's work that a GPU does in the background, in groups it commits and
// then waits for (cp.async's copies, wgmma's products): made when waited for.
template <typename Work>
struct AsyncGroups {
  std::vector<std::vector<Work>> committed;  // oldest first
  std::vector<Work> open;                    // since the last commit
  void commit() {
    committed.push_back(std::move(open));
    open.clear();
  }
  // Makes every group but the newest `pending`.
  template <typename Make>
  void wait(int pending, Make make) {
    const std::size_t done = committed.size() - std::min(committed.size(), static_cast<std::size_t>(pending));
    for (std::size_t g = 0; g < done; ++g)
      for (const Work& w : committed[g]) make(w);
    committed.erase(committed.begin(), committed.begin() + static_cast<std::ptrdiff_t>(done));
  }
};

// One CUDA thread of the block being run.
struct Thread {
  ThreadCoordinates where;
  std::size_t index = 0;  // in the block, x fastest: its warp is index / 32, its lane index % 32
  AsyncGroups<AsyncCopy> copies;
  AsyncGroups<PendingProduct> products;
  const char* waits_at = nullptr;
  bool done = false;
};

// A fiber that runs the block's threads one after the other until one of
// them waits; that one keeps the fiber, and the next thread gets another.
// So a kernel that never waits runs its whole block on one fiber. Workers
// outlive blocks (idle in between): starting a fiber costs AddressSanitizer a
// fake stack, mapped and unmapped, each time.
struct Worker {
  Context context;
  Thread* thread = nullptr;    // the one it runs now
  bool idle = false;           // no thread of this block left to take
  void* fake_stack = nullptr;  // AddressSanitizer's, while switched out
};

// A stack with a guard page below it: an overflow faults instead of writing
// into the next fiber's stack.
class Stack {
 public:
  Stack() {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    base_ = static_cast<char*>(
        mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED) {
      std::fprintf(stderr, "emulated CUDA: no memory for a thread's stack\n");
      std::abort();
    }
    mprotect(base_, page, PROT_NONE);
    bottom_ = base_ + page;
    mapped_ = kStackBytes + page;
  }
  ~Stack() { munmap(base_, mapped_); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* bottom() const { return bottom_; }

 private:
  char* base_ = nullptr;
  char* bottom_ = nullptr;
  std::size_t mapped_ = 0;
};

// Runs blocks on the calling host thread; one per host thread.
class BlockRunner {
 public:
  void run(const void* kernel, dim3 grid, dim3 block, uint3 block_index, std::size_t dynamic_smem,
           const std::function<void()>& body);

  // The accessors a shuffle calls are inlined by force: under the sanitizers
  // their checks cost clang's -O1 more than it inlines, and every lane of every
  // round calls them.
  [[gnu::always_inline]] const Thread& current() const { return *running_->thread; }
  [[gnu::always_inline]] Thread& current() { return *running_->thread; }
  void* dynamic_shared() { return shared_; }
  std::size_t dynamic_shared_bytes() const { return shared_bytes_; }
  void syncthreads() { arrive(block_barrier_, block_waiters_.data(), thread_count_, "__syncthreads"); }
  void named_barrier(int id, int threads);
  // A thread's wait for something other threads do (an mbarrier's phase):
  // its worker leaves the others to run until resume(worker).
  std::size_t current_worker() const { return static_cast<std::size_t>(running_ - workers_.data()); }
  void suspend(const char* where);
  void resume(std::size_t worker) { set_runnable(worker, true); }
  std::uint64_t exchange(unsigned mask, std::uint64_t bits, int source);
  void all_gather(unsigned mask, const void* mine, std::size_t bytes, void* all);
  void combine(unsigned mask, const void* mine, std::size_t bytes, void* result, std::size_t result_bytes,
               CombineLanes combine_lanes);
  [[gnu::always_inline]] int lane() const { return static_cast<int>(current().index % kWarp); }

 private:
  static void worker_main();
  void arrive(Barrier& barrier, std::uint16_t* waiters, int expected, const char* where);
  [[gnu::always_inline]] void set_runnable(std::size_t worker, bool runs) {
    std::uint64_t& word = runnable_[worker / 64];
    word = runs ? word | std::uint64_t{1} << worker % 64 : word & ~(std::uint64_t{1} << worker % 64);
  }
  Worker* first_runnable();
  Worker* next_worker();
  Worker* start_worker();
  [[gnu::always_inline]] Warp& current_warp() { return warps_[current().index / kWarp]; }
  std::byte* join_round(Warp& warp, unsigned mask, std::size_t bytes, int source);
  const LaneValues& wait_round(Warp& warp, unsigned mask);
  [[noreturn]] void shuffle_fault(unsigned mask, const char* what) const;
  const void* stack_of(const Worker& worker) const {
    return stacks_[static_cast<std::size_t>(&worker - workers_.data())]->bottom();
  }
  void switch_to(Worker& worker);
  void switch_out(Worker& worker);
  [[noreturn]] void stuck();

  std::vector<Thread> threads_;
  std::vector<Worker> workers_ = std::vector<Worker>(kMaxThreads);  // never resized: a worker's address is its own
  std::vector<std::unique_ptr<Stack>> stacks_;                      // one per worker started so far
  std::size_t active_ = 0;  // the workers this block has used: workers_[0, active_)
  // Which workers can go on (not idle, not waiting in a round): the scheduler's
  // choice without a look at each worker, which took a quarter of the time.
  std::uint64_t runnable_[kMaxThreads / 64] = {};
  std::array<std::uint16_t, kMaxThreads> block_waiters_;  // the workers waiting at __syncthreads
  // bar.sync's barriers of a given count of threads (1 to 15; 0 is __syncthreads), and their waiters.
  std::array<Barrier, kNamedBarriers> named_;
  std::array<int, kNamedBarriers> named_threads_{};  // the count the round's first thread named
  std::vector<std::array<std::uint16_t, kMaxThreads>> named_waiters_ =
      std::vector<std::array<std::uint16_t, kMaxThreads>>(kNamedBarriers);
  std::vector<Warp> warps_;
  Barrier block_barrier_;
  Context scheduler_;
  Worker* running_ = nullptr;  // and the thread running now is running_->thread
  const std::function<void()>* body_ = nullptr;
  const void* kernel_ = nullptr;
  dim3 block_;
  int thread_count_ = 0, started_ = 0, finished_ = 0;
  void* shared_ = nullptr;
  std::size_t shared_bytes_ = 0;
  const void* scheduler_stack_ = nullptr;  // AddressSanitizer's view of the host thread's stack
  std::size_t scheduler_stack_size_ = 0;
};

// The host thread's runner while it runs a grid. A pointer, set at each launch:
// a thread_local object with a constructor costs a call that checks it is
// made at every use, and kernels use it at every shuffle.
thread_local BlockRunner* runner = nullptr;
thread_local bool in_kernel = false;

void BlockRunner::run(const void* kernel, dim3 grid, dim3 block, uint3 block_index, std::size_t dynamic_smem,
                      const std::function<void()>& body) {
  kernel_ = kernel, block_ = block, body_ = &body;
  thread_count_ = static_cast<int>(block.x * block.y * block.z);
  started_ = finished_ = 0;
  block_barrier_ = Barrier{};
  named_.fill(Barrier{});
  forget_mbarriers();
  // Only the barriers start afresh: every round writes a lane's values before any lane reads them,
  // so the warps' values and results need no clearing for each of a grid's many blocks.
  const auto warps = static_cast<std::size_t>((thread_count_ + kWarp - 1) / kWarp);
  if (warps_.size() < warps) warps_.resize(warps);
  for (std::size_t w = 0; w < warps; ++w) {
    warps_[w].barrier = Barrier{};
    warps_[w].combined[0] = warps_[w].combined[1] = 0;
  }
  threads_.assign(static_cast<std::size_t>(thread_count_), Thread{});
  for (int t = 0; t < thread_count_; ++t) {
    const unsigned ut = static_cast<unsigned>(t);
    threads_[ut].where = {{ut % block.x, ut / block.x % block.y, ut / (block.x * block.y)}, block_index, block, grid};
    threads_[ut].index = ut;
  }
  active_ = 0;
  std::fill(std::begin(runnable_), std::end(runnable_), 0);

  // Dynamic shared memory: exactly the bytes asked for (so AddressSanitizer
  // sees an overrun), filled with NaN bytes as fresh shared memory is garbage;
  // none (nullptr) when the launch asked for none.
  // Aligned to 1024 bytes, as far as the swizzles of wgmma's tiles repeat.
  shared_ = nullptr;
  shared_bytes_ = dynamic_smem;
  if (dynamic_smem > 0) {
    if (posix_memalign(&shared_, 1024, dynamic_smem) != 0) std::abort();
    std::memset(shared_, 0xff, dynamic_smem);
  }

  // The workers hand the block on among themselves (switch_out) and come back
  // here when its last thread has returned.
  while (finished_ < thread_count_) {
    Worker* next = next_worker();
    if (!next) stuck();
    switch_to(*next);
  }
  running_ = nullptr;
  std::free(shared_);
  shared_ = nullptr;
}

Worker* BlockRunner::first_runnable() {
  for (std::size_t i = 0; i < std::size(runnable_); ++i)
    if (runnable_[i] != 0) return &workers_[i * 64 + static_cast<std::size_t>(std::countr_zero(runnable_[i]))];
  return nullptr;
}

// Always the first worker that can go on: a warp runs as far as it can (to a
// __syncthreads, or its end) before the next one starts, as far ahead of the
// others as a GPU's warps may get. When every worker in use waits, the next
// thread takes another; none when every thread has started.
Worker* BlockRunner::next_worker() {
  if (Worker* next = first_runnable()) return next;
  return started_ < thread_count_ ? start_worker() : nullptr;
}

// Out of line: a fiber's first context takes the address of locals, which
// AddressSanitizer's check of use after return would make every caller pay for
// with a frame of its own.
[[gnu::noinline]] Worker* BlockRunner::start_worker() {
  Worker* next = &workers_[active_];
  if (stacks_.size() <= active_) {  // a fiber never started before
    stacks_.push_back(std::make_unique<Stack>());
    make_context(next->context, stacks_[active_]->bottom(), kStackBytes, &BlockRunner::worker_main);
  }
  set_runnable(active_, true);
  ++active_;
  next->idle = false, next->thread = nullptr;
  return next;
}

// From the scheduler (the host thread's own stack) into the block's workers.
void BlockRunner::switch_to(Worker& worker) {
  running_ = &worker;
  void* fake = nullptr;
  switch_fiber(scheduler_, &fake, worker.context, stack_of(worker), kStackBytes);
}

void BlockRunner::worker_main() {
  BlockRunner& r = *runner;
#if defined(EMU_ASAN)
  // A fiber's first start may come from another fiber; the host thread's stack
  // is the one the very first came from.
  const void* from_stack = nullptr;
  std::size_t from_stack_size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_stack, &from_stack_size);
  if (!r.scheduler_stack_) r.scheduler_stack_ = from_stack, r.scheduler_stack_size_ = from_stack_size;
#endif
  Worker& w = *r.running_;
  for (;;) {  // one round per block it is used in
    while (r.started_ < r.thread_count_) {
      const int next = r.started_++;
      Thread& t = r.threads_[static_cast<std::size_t>(reversed() ? r.thread_count_ - 1 - next : next)];
      w.thread = &t;
      (*r.body_)();
      t.done = true;
      ++r.finished_;
    }
    w.idle = true;
    r.set_runnable(static_cast<std::size_t>(&w - r.workers_.data()), false);
    r.switch_out(w);
  }
}

// From a worker that waits or is idle: straight to the next worker that can
// go on (one switch, not two through the scheduler), or back to the scheduler
// when the block's last thread has returned.
void BlockRunner::switch_out(Worker& w) {
  if (Worker* next = next_worker()) {
    running_ = next;
    return switch_fiber(w.context, &w.fake_stack, next->context, stack_of(*next), kStackBytes);
  }
  if (finished_ < thread_count_) stuck();
  running_ = nullptr;
  switch_fiber(w.context, &w.fake_stack, scheduler_, scheduler_stack_, scheduler_stack_size_);
}

void BlockRunner::arrive(Barrier& barrier, std::uint16_t* waiters, int expected, const char* where) {
  if (++barrier.arrived == expected) {  // the last one in lets everyone go
    for (int i = 0; i + 1 < expected; ++i) set_runnable(waiters[i], true);
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  const auto me = static_cast<std::size_t>(running_ - workers_.data());
  waiters[barrier.arrived - 1] = static_cast<std::uint16_t>(me);
  set_runnable(me, false);
  Thread& t = *running_->thread;
  t.waits_at = where;
  switch_out(*running_);
  t.waits_at = nullptr;
}

void BlockRunner::suspend(const char* where) {
  set_runnable(current_worker(), false);
  Thread& t = *running_->thread;
  t.waits_at = where;
  switch_out(*running_);
  t.waits_at = nullptr;
}

void BlockRunner::named_barrier(int id, int threads) {
  if (id < 1 || id >= kNamedBarriers) device_fault("bar.sync: a barrier id outside 1 to 15");
  if (threads <= 0 || threads % kWarp != 0 || threads > thread_count_)
    device_fault("bar.sync: a thread count that is not a multiple of 32 within the block");
  Barrier& barrier = named_[static_cast<std::size_t>(id)];
  int& expected = named_threads_[static_cast<std::size_t>(id)];
  if (barrier.arrived == 0)
    expected = threads;
  else if (expected != threads)
    device_fault("bar.sync: a thread count other than the round's first thread named");
  arrive(barrier, named_waiters_[static_cast<std::size_t>(id)].data(), threads, "bar.sync");
}

// A round of lane exchange in two steps, so that no caller's value needs an
// address (which AddressSanitizer gives a frame of its own, at each call): the
// lane joins the warp's round (the mask checked) and writes its `bytes` where
// join_round says, then waits for the other lanes of `mask`, after which the
// round's values are every lane's.
std::byte* BlockRunner::join_round(Warp& warp, unsigned mask, std::size_t bytes, int source) {
  const int lane = this->lane();
  if (!(mask >> lane & 1u)) shuffle_fault(mask, "by a lane outside its own mask");
  if (source >= 0 && !(mask >> source & 1u)) shuffle_fault(mask, "reads a lane outside the mask");
  if (warp.barrier.arrived == 0)
    warp.barrier.mask = mask;
  else if (warp.barrier.mask != mask)
    shuffle_fault(mask, "whose mask differs from the other lanes'");
  return warp.values[warp.barrier.generation & 1u].data() + static_cast<std::size_t>(lane) * bytes;
}

const LaneValues& BlockRunner::wait_round(Warp& warp, unsigned mask) {
  const LaneValues& values = warp.values[warp.barrier.generation & 1u];
  arrive(warp.barrier, warp.waiters.data(), std::popcount(mask), "a shuffle");
  return values;
}

void BlockRunner::shuffle_fault(unsigned mask, const char* what) const {
  const uint3 t = current().where.thread, b = current().where.block;
  std::fprintf(stderr, "emulated CUDA: kernel %p, block (%u,%u,%u), thread (%u,%u,%u): a shuffle %s (mask %#x)\n",
               kernel_, b.x, b.y, b.z, t.x, t.y, t.z, what, mask);
  std::abort();
}

std::uint64_t BlockRunner::exchange(unsigned mask, std::uint64_t bits, int source) {
  Warp& warp = current_warp();
  std::memcpy(join_round(warp, mask, sizeof bits, source), &bits, sizeof bits);
  const LaneValues& values = wait_round(warp, mask);
  if (source >= 0) std::memcpy(&bits, values.data() + static_cast<std::size_t>(source) * sizeof bits, sizeof bits);
  return bits;
}

void BlockRunner::all_gather(unsigned mask, const void* mine, std::size_t bytes, void* all) {
  Warp& warp = current_warp();
  std::memcpy(join_round(warp, mask, bytes, -1), mine, bytes);
  std::memcpy(all, wait_round(warp, mask).data(), kWarp * bytes);
}

void BlockRunner::combine(unsigned mask, const void* mine, std::size_t bytes, void* result, std::size_t result_bytes,
                          CombineLanes combine_lanes) {
  Warp& warp = current_warp();
  const std::uint64_t round = warp.barrier.generation;
  std::memcpy(join_round(warp, mask, bytes, -1), mine, bytes);
  const LaneValues& values = wait_round(warp, mask);
  LaneValues& results = warp.results[round & 1u];
  if (warp.combined[round & 1u] != round + 1) {
    combine_lanes(values.data(), results.data());
    warp.combined[round & 1u] = round + 1;
  }
  std::memcpy(result, results.data() + static_cast<std::size_t>(lane()) * result_bytes, result_bytes);
}

void BlockRunner::stuck() {
  const uint3 b = threads_.front().where.block;
  std::fprintf(stderr,
               "emulated CUDA: kernel %p, block (%u,%u,%u) of %d threads can go no further: %d have returned, and",
               kernel_, b.x, b.y, b.z, thread_count_, finished_);
  int shown = 0;
  for (const Thread& t : threads_) {
    if (t.done || shown++ >= 4) continue;
    std::fprintf(stderr, " thread (%u,%u,%u) waits at %s;", t.where.thread.x, t.where.thread.y, t.where.thread.z,
                 t.waits_at ? t.waits_at : "its start");
  }
  std::fprintf(stderr, " a __syncthreads, bar.sync or shuffle that not all threads reach, or an mbarrier phase that never completes\n");
  std::abort();
}

}  // namespace

namespace {
void require_kernel(const char* what) {
  if (in_kernel) return;
  std::fprintf(stderr, "emulated CUDA: %s outside a kernel\n", what);
  std::abort();
}
}  // namespace

const ThreadCoordinates& coordinates() {
  require_kernel("threadIdx, blockIdx, blockDim or gridDim read");
  return runner->current().where;
}
void syncthreads() {
  require_kernel("__syncthreads");
  runner->syncthreads();
}
void* dynamic_shared_memory() {
  require_kernel("dynamic shared memory asked for");
  return runner->dynamic_shared();
}
void named_barrier(int id, int threads) {
  require_kernel("bar.sync");
  runner->named_barrier(id, threads);
}
namespace scheduler {
std::size_t current_worker() { return runner->current_worker(); }
void suspend(const char* where) { runner->suspend(where); }
void resume(std::size_t worker) { runner->resume(worker); }
bool last_warp_ahead() { return reversed(); }
}  // namespace scheduler
std::uint64_t exchange(unsigned mask, std::uint64_t bits, int source_lane) {
  require_kernel("a shuffle");
  return runner->exchange(mask, bits, source_lane);
}
namespace {
void require_exchange_bytes(std::size_t bytes) {
  if (bytes <= kMaxExchangeBytes) return;
  std::fprintf(stderr, "emulated CUDA: a warp's exchange of %zu bytes a lane, more than %zu\n", bytes,
               kMaxExchangeBytes);
  std::abort();
}
}  // namespace
void all_gather(unsigned mask, const void* mine, std::size_t bytes, void* all) {
  require_kernel("a warp's exchange");
  require_exchange_bytes(bytes);
  runner->all_gather(mask, mine, bytes, all);
}
void combine(unsigned mask, const void* mine, std::size_t bytes, void* result, std::size_t result_bytes,
             CombineLanes combine_lanes) {
  require_kernel("a warp's exchange");
  require_exchange_bytes(bytes);
  require_exchange_bytes(result_bytes);
  runner->combine(mask, mine, bytes, result, result_bytes, combine_lanes);
}
int lane() {
  require_kernel("a shuffle");
  return runner->lane();
}
namespace {
void make_copy(const AsyncCopy& c) {
  std::memcpy(c.destination, c.source, c.source_bytes);
  std::memset(static_cast<std::byte*>(c.destination) + c.source_bytes, 0, c.bytes - c.source_bytes);
}
}  // namespace

void async_copy(void* destination, const void* source, std::size_t bytes, std::size_t source_bytes) {
  require_kernel("cp.async");
  if (source_bytes > bytes) device_fault("cp.async: a source size past the copy's");
  const AsyncCopy copy{destination, source, bytes, source_bytes};
  if (reversed())
    make_copy(copy);  // at once: a copy into memory other warps still read shows
  else
    runner->current().copies.open.push_back(copy);  // when waited for: reading it sooner shows
}
void async_commit() {
  require_kernel("cp.async.commit_group");
  runner->current().copies.commit();
}
void async_wait(int pending) {
  require_kernel("cp.async.wait_group");
  runner->current().copies.wait(pending, make_copy);
}
std::uint32_t shared_address(const void* p) {
  require_kernel("a shared memory address");
  const auto* base = static_cast<const std::byte*>(runner->dynamic_shared());
  const auto* at = static_cast<const std::byte*>(p);
  if (base == nullptr || at < base || at >= base + runner->dynamic_shared_bytes())
    device_fault("a shared memory address of a pointer outside the block's dynamic shared memory");
  return static_cast<std::uint32_t>(at - base);
}
void* shared_pointer(std::uint32_t address) {
  require_kernel("a shared memory address");
  if (address >= runner->dynamic_shared_bytes()) device_fault("a shared memory address past the block's");
  return static_cast<std::byte*>(runner->dynamic_shared()) + address;
}

void async_product(AsyncProduct make, const void* args, std::size_t bytes) {
  require_kernel("wgmma.mma_async");
  if (bytes > kMaxProductArgBytes) device_fault("wgmma.mma_async: arguments past the emulator's room");
  PendingProduct p{make, {}};
  std::memcpy(p.args.data(), args, bytes);
  if (reversed())
    make(p.args.data());  // at once: an operand overwritten before the wait shows in the other order
  else
    runner->current().products.open.push_back(p);  // when waited for: accumulators read sooner show
}
void async_product_commit() {
  require_kernel("wgmma.commit_group");
  runner->current().products.commit();
}
void async_product_wait(int pending) {
  require_kernel("wgmma.wait_group");
  runner->current().products.wait(pending, [](const PendingProduct& p) { p.make(p.args.data()); });
}

void device_fault(const char* what) {
  require_kernel(what);
  const uint3 t = runner->current().where.thread, b = runner->current().where.block;
  std::fprintf(stderr, "emulated CUDA: block (%u,%u,%u), thread (%u,%u,%u): %s\n", b.x, b.y, b.z, t.x, t.y, t.z, what);
  std::abort();
}

namespace {
std::atomic<std::uint64_t> grids{0};
}  // namespace
std::uint64_t grids_run() { return grids; }

void run_grid(const void* kernel, dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream,
              const std::function<void()>& body) {
  const cudaError_t refused = check_launch(kernel, grid, block, dynamic_smem, stream);
  if (refused != cudaSuccess) return set_last_error(refused);
  ++grids;
  if (in_kernel) {
    std::fprintf(stderr, "emulated CUDA: a kernel launched from inside a kernel\n");
    std::abort();
  }
  static thread_local BlockRunner host_thread_runner;
  runner = &host_thread_runner;
  in_kernel = true;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) runner->run(kernel, grid, block, {x, y, z}, dynamic_smem, body);
  in_kernel = false;
}

}  // namespace emu
