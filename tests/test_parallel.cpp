// The thread pool: coverage of the range, exceptions, nesting, thread counts,
// and the allocation cache that makes steady-state steps allocation-free.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <thread>

#include "helpers.h"
#include "cpu/host_memory.h"
#include "cpu/parallel.h"

using namespace attograd;
using namespace attograd::test;

TEST_CASE("parallel_for covers the range exactly once, in chunks of at least the grain", "[parallel]") {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    CHECK(get_num_threads() == threads);
    std::vector<std::atomic<int>> hits(1001);
    parallel_for(0, 1001, 10, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) REQUIRE(h.load() == 1);
  }
  set_num_threads(2);
}

TEST_CASE("parallel_for rethrows a worker's exception and stays usable", "[parallel]") {
  set_num_threads(2);
  REQUIRE_THROWS_WITH(parallel_for(0, 100, 1,
                                   [](std::int64_t b, std::int64_t) {
                                     if (b > 0) fail("worker", "boom at {}", b);
                                   }),
                      Catch::Contains("boom"));
  std::atomic<int> total{0};
  parallel_for(0, 100, 1, [&](std::int64_t b, std::int64_t e) { total += static_cast<int>(e - b); });
  CHECK(total == 100);
}

TEST_CASE("nested parallel_for runs serially inside a worker", "[parallel]") {
  set_num_threads(2);
  std::atomic<int> total{0};
  parallel_for(0, 4, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      parallel_for(0, 10, 1, [&](std::int64_t lo, std::int64_t hi) { total += static_cast<int>(hi - lo); });
  });
  CHECK(total == 40);
  REQUIRE_THROWS_WITH(set_num_threads(0), Catch::Contains("[set_num_threads]"));
}

TEST_CASE("parallel_tasks hands out every task once, to at most one worker call per thread", "[parallel]") {
  for (int threads : {1, 2, 3}) {
    for (std::int64_t grain : {1, 7}) {
      set_num_threads(threads);
      std::vector<std::atomic<int>> hits(1001);
      std::atomic<int> calls{0}, oversized{0};  // counted, not CHECKed: Catch2 asserts from one thread only
      parallel_tasks(3, 1001, grain, [&](TaskQueue& tasks) {
        ++calls;
        for (std::int64_t lo, hi; tasks.next(lo, hi);) {
          if (hi - lo > grain) ++oversized;
          for (std::int64_t i = lo; i < hi; ++i) hits[i]++;
        }
      });
      for (std::int64_t i = 0; i < 1001; ++i) REQUIRE(hits[i].load() == (i < 3 ? 0 : 1));
      CHECK(oversized.load() == 0);
      CHECK(calls.load() >= 1);
      CHECK(calls.load() <= threads);
    }
  }
  set_num_threads(2);
}

TEST_CASE("parallel_tasks: while one thread is held up, the others take every other task", "[parallel]") {
  // With fixed shares (parallel_for) the held thread's share would wait for
  // it: here the thread that drew task 0 waits until all the others are
  // done, which only happens if the rest went to the other thread.
  set_num_threads(2);
  constexpr int kTasks = 64;
  std::atomic<int> done{0};
  bool others_finished = false;
  parallel_tasks(0, kTasks, 1, [&](TaskQueue& tasks) {
    for (std::int64_t lo, hi; tasks.next(lo, hi);) {
      if (lo == 0) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (done.load() < kTasks - 1 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        others_finished = done.load() == kTasks - 1;
      }
      ++done;
    }
  });
  CHECK(others_finished);
  CHECK(done.load() == kTasks);
}

TEST_CASE("parallel_tasks rethrows a worker's exception, and nested runs in the calling thread", "[parallel]") {
  set_num_threads(2);
  REQUIRE_THROWS_WITH(parallel_tasks(0, 100, 1,
                                     [](TaskQueue& tasks) {
                                       for (std::int64_t lo, hi; tasks.next(lo, hi);)
                                         if (lo == 50) fail("worker", "boom at {}", lo);
                                     }),
                      Catch::Contains("boom at 50"));
  std::atomic<int> total{0}, elsewhere{0};
  parallel_for(0, 4, 1, [&](std::int64_t b, std::int64_t e) {
    const auto outer = std::this_thread::get_id();
    for (std::int64_t i = b; i < e; ++i)
      parallel_tasks(0, 10, 1, [&](TaskQueue& tasks) {
        if (std::this_thread::get_id() != outer) ++elsewhere;
        for (std::int64_t lo, hi; tasks.next(lo, hi);) total += static_cast<int>(hi - lo);
      });
  });
  CHECK(total == 40);
  CHECK(elsewhere == 0);
}

TEST_CASE("large elementwise ops split across threads give the serial result", "[parallel]") {
  Generator gen(5);
  Tensor a = randn({300, 1000}, {}, gen), b = randn({1000}, {}, gen);
  set_num_threads(1);
  const Tensor serial = gelu(a * b + 1.0);
  set_num_threads(2);
  const Tensor threaded = gelu(a * b + 1.0);
  CHECK(max_abs_diff(serial, threaded) == 0);
}

TEST_CASE("a repeated computation is served from the allocation cache", "[parallel][alloc]") {
  auto step = [] {
    Tensor x = ones({64, 64});
    return sum(matmul(x, x) * 2.0).item();
  };
  step();
  const CpuAllocStats before = cpu_alloc_stats();
  for (int i = 0; i < 3; ++i) step();
  const CpuAllocStats after = cpu_alloc_stats();
  CHECK(after.allocations == before.allocations);
  CHECK(after.reuses > before.reuses);
}

TEST_CASE("the allocation cache holds no more than the peak in use and a sixteenth", "[parallel][alloc]") {
  cpu_release_cached();
  constexpr std::int64_t n = 8 << 20;  // 32 MiB of float32
  { const Tensor a = empty({n}); }
  CHECK(cpu_alloc_stats().bytes_cached >= n * sizeof(float));
  cpu_reset_alloc_peaks();
  const std::size_t before = cpu_alloc_stats().bytes_in_use, b_bytes = (n + 1024) * sizeof(float);
  const std::uint64_t allocations = cpu_alloc_stats().allocations;
  { const Tensor b = empty({n + 1024}); }  // another size: a's block is freed before b's is made
  const CpuAllocStats s = cpu_alloc_stats();
  CHECK(s.allocations == allocations + 1);
  CHECK(s.peak_bytes_held <= (before + b_bytes) + (before + b_bytes) / 16);
  { const Tensor again = empty({n + 1024}); }  // b's size again: served from the cache
  CHECK(cpu_alloc_stats().allocations == allocations + 1);
}

TEST_CASE("a large host block leaves the resident set when freed", "[parallel][alloc]") {
  if (!cpu::large_blocks_mapped()) {
    WARN("skipped: blocks come from the system allocator here (AddressSanitizer's build)");
    return;
  }
  const auto resident_bytes = [] {
    std::ifstream statm("/proc/self/statm");
    std::size_t size = 0, resident = 0;
    statm >> size >> resident;
    return resident * 4096;
  };
  constexpr std::size_t bytes = std::size_t{64} << 20;
  void* p = cpu::allocate_host(bytes);
  REQUIRE(p != nullptr);
  std::memset(p, 1, bytes);
  const std::size_t touched = resident_bytes();
  cpu::free_host(p, bytes);
  CHECK(touched - resident_bytes() >= bytes - (std::size_t{4} << 20));
}

TEST_CASE("host blocks start on a cache line, and from 2 MiB on a huge page's boundary", "[parallel][alloc]") {
  constexpr std::size_t huge = cpu::kHugePageBytes;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, huge - 64, huge, 3 * huge + 100}) {
    void* p = cpu::allocate_host(n);
    REQUIRE(p != nullptr);
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    CHECK(address % 64 == 0);
    CHECK((n < huge || address % huge == 0));
    std::memset(p, 1, n);  // all of it usable: ASan's build checks the bounds
    cpu::free_host(p, n);
  }
  // A tensor's storage is such a block, from the cache or fresh.
  for (int i = 0; i < 2; ++i) {
    const Tensor big = empty({std::int64_t(huge)});  // 8 MiB of float32
    CHECK(reinterpret_cast<std::uintptr_t>(big.raw_data()) % huge == 0);
  }
}
