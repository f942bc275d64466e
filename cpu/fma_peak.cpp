#include "cpu/fma_peak.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>


#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define ATTOGRAD_FMA_CHAINS 1
#endif

namespace attograd::cpu {

float fma_chain_start(int j) { return 0.5f + 0.0625f * static_cast<float>(j); }

#ifdef ATTOGRAD_FMA_CHAINS
namespace {

// The accumulators are plain locals, stored once after the loop: an array of
// them made GCC spill them to the stack every trip (half the rate).
#define ATTOGRAD_FMA_CHAIN_BODY(vec, set1, fmadd, storeu, lanes)                                   \
  const vec x = set1(x_value), y = set1(y_value);                                                  \
  vec a0 = set1(fma_chain_start(0)), a1 = set1(fma_chain_start(1)), a2 = set1(fma_chain_start(2)); \
  vec a3 = set1(fma_chain_start(3)), a4 = set1(fma_chain_start(4)), a5 = set1(fma_chain_start(5)); \
  vec a6 = set1(fma_chain_start(6)), a7 = set1(fma_chain_start(7)), a8 = set1(fma_chain_start(8)); \
  vec a9 = set1(fma_chain_start(9)), a10 = set1(fma_chain_start(10)), a11 = set1(fma_chain_start(11)); \
  for (std::int64_t i = 0; i < steps; ++i) {                                                       \
    a0 = fmadd(a0, x, y), a1 = fmadd(a1, x, y), a2 = fmadd(a2, x, y), a3 = fmadd(a3, x, y);        \
    a4 = fmadd(a4, x, y), a5 = fmadd(a5, x, y), a6 = fmadd(a6, x, y), a7 = fmadd(a7, x, y);        \
    a8 = fmadd(a8, x, y), a9 = fmadd(a9, x, y), a10 = fmadd(a10, x, y), a11 = fmadd(a11, x, y);    \
  }                                                                                                \
  const vec a[FmaChains::kChains] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};            \
  for (int j = 0; j < FmaChains::kChains; ++j) storeu(out + j * (lanes), a[j]);

__attribute__((target("avx512f"))) void chains_avx512(std::int64_t steps, float x_value, float y_value, float* out) {
  ATTOGRAD_FMA_CHAIN_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps, 16)
}

__attribute__((target("avx2,fma"))) void chains_avx2(std::int64_t steps, float x_value, float y_value, float* out) {
  ATTOGRAD_FMA_CHAIN_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps, 8)
}
#undef ATTOGRAD_FMA_CHAIN_BODY

}  // namespace

const std::vector<FmaChains>& fma_chains() {
  static const std::vector<FmaChains> all = {
      {"avx512", 16, [] { return __builtin_cpu_supports("avx512f") != 0; }, chains_avx512},
      {"avx2", 8, [] { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }, chains_avx2},
  };
  return all;
}
#else
const std::vector<FmaChains>& fma_chains() {
  static const std::vector<FmaChains> none;
  return none;
}
#endif

double fma_peak_flops(int threads) {
  static std::mutex mutex;
  static std::map<int, double> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = measured.find(threads); it != measured.end()) return it->second;
  double flops = 0;
  for (const FmaChains& c : fma_chains()) {
    if (!c.supported()) continue;
    // One core's rate times the threads, each thread having a core of its own: measured on the
    // calling thread alone, since a run's start may still keep another core busy (at the pool's
    // first use the two-thread figure read one core's). About 5 ms a pass at AVX-512 peak; the
    // fastest of several (the first raise the core's clock).
    constexpr std::int64_t kSteps = 1 << 20;
    constexpr int kPasses = 6;
    std::vector<float> out(static_cast<std::size_t>(FmaChains::kChains * c.lanes));
    double best = 0;
    for (int pass = 0; pass < kPasses; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      c.run(kSteps, kFmaX, kFmaY, out.data());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * kSteps * FmaChains::kChains * c.lanes / seconds);
    }
    flops = best * threads;
    break;
  }
  measured[threads] = flops;
  return flops;
}

}  // namespace attograd::cpu
