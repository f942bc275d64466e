// fma_peak/{avx512,avx2}: this machine's float32 FMA peak at the bench's thread
// count, the denominator of "fraction of FMA peak" for the attention kernels
// (issue 13 asks to report every attention kernel's fraction of peak;
// bench/compare prints it as "% of peak" against the case of the ISA the
// attention ran on, the JSON context's "attention_isa").
//
// Each of get_num_threads() threads (ATTOGRAD_THREADS, bench_common.h) runs its
// own loop of 12 independent FMA chains, a = a * x + y, on 512-bit (avx512) or
// 256-bit (avx2) registers: 12 chains hide the FMA latency (4 cycles) on two FMA
// ports, so the loop is bound by FMA throughput alone. The accumulators are
// plain locals, stored once after the loop: an array of them with an asm barrier
// made GCC spill them to the stack every iteration (half the rate). Check with
// `objdump -d --no-show-raw-insn attograd_bench | grep -A20 fma_chains_avx512`
// that the loop body is vfmadd on registers only.
//
// FLOPs per iteration: threads x kSteps x 12 chains x lanes (16 or 8) x 2.
// No bytes: the loop touches no memory. Before timing, each chain's lanes are
// checked bit for bit against the same chain in scalar std::fma (an FMA rounds
// once, so the two must agree exactly). A CPU without the ISA skips the case
// with an error naming it. Built for GCC and Clang on x86-64 only; elsewhere
// no case is registered.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.h"

namespace attograd::bench {
namespace {

constexpr int kChains = 12;
constexpr std::int64_t kSteps = 1 << 20;  // loop trips per thread and iteration: ~3 ms at AVX-512 peak

// The chains' starting values and x, y: a converges to y / (1 - x) = 1, so no
// value overflows or turns denormal however long the loop runs.
float chain_start(int j) { return 0.5f + 0.0625f * static_cast<float>(j); }
constexpr float kX = 0.9990234375f, kY = 0.0009765625f;  // 1 - 2^-10, 2^-10

// Writes chain j's final value, one per lane, to out[j * 16 + lane].
__attribute__((target("avx512f"))) void fma_chains_avx512(std::int64_t steps, float x_value, float y_value,
                                                          float* out) {
  const __m512 x = _mm512_set1_ps(x_value), y = _mm512_set1_ps(y_value);
  __m512 a0 = _mm512_set1_ps(chain_start(0)), a1 = _mm512_set1_ps(chain_start(1));
  __m512 a2 = _mm512_set1_ps(chain_start(2)), a3 = _mm512_set1_ps(chain_start(3));
  __m512 a4 = _mm512_set1_ps(chain_start(4)), a5 = _mm512_set1_ps(chain_start(5));
  __m512 a6 = _mm512_set1_ps(chain_start(6)), a7 = _mm512_set1_ps(chain_start(7));
  __m512 a8 = _mm512_set1_ps(chain_start(8)), a9 = _mm512_set1_ps(chain_start(9));
  __m512 a10 = _mm512_set1_ps(chain_start(10)), a11 = _mm512_set1_ps(chain_start(11));
  for (std::int64_t i = 0; i < steps; ++i) {
    a0 = _mm512_fmadd_ps(a0, x, y), a1 = _mm512_fmadd_ps(a1, x, y), a2 = _mm512_fmadd_ps(a2, x, y);
    a3 = _mm512_fmadd_ps(a3, x, y), a4 = _mm512_fmadd_ps(a4, x, y), a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y), a7 = _mm512_fmadd_ps(a7, x, y), a8 = _mm512_fmadd_ps(a8, x, y);
    a9 = _mm512_fmadd_ps(a9, x, y), a10 = _mm512_fmadd_ps(a10, x, y), a11 = _mm512_fmadd_ps(a11, x, y);
  }
  const __m512 a[kChains] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
  for (int j = 0; j < kChains; ++j) _mm512_storeu_ps(out + j * 16, a[j]);
}

// Writes chain j's final value, one per lane, to out[j * 8 + lane].
__attribute__((target("avx2,fma"))) void fma_chains_avx2(std::int64_t steps, float x_value, float y_value,
                                                         float* out) {
  const __m256 x = _mm256_set1_ps(x_value), y = _mm256_set1_ps(y_value);
  __m256 a0 = _mm256_set1_ps(chain_start(0)), a1 = _mm256_set1_ps(chain_start(1));
  __m256 a2 = _mm256_set1_ps(chain_start(2)), a3 = _mm256_set1_ps(chain_start(3));
  __m256 a4 = _mm256_set1_ps(chain_start(4)), a5 = _mm256_set1_ps(chain_start(5));
  __m256 a6 = _mm256_set1_ps(chain_start(6)), a7 = _mm256_set1_ps(chain_start(7));
  __m256 a8 = _mm256_set1_ps(chain_start(8)), a9 = _mm256_set1_ps(chain_start(9));
  __m256 a10 = _mm256_set1_ps(chain_start(10)), a11 = _mm256_set1_ps(chain_start(11));
  for (std::int64_t i = 0; i < steps; ++i) {
    a0 = _mm256_fmadd_ps(a0, x, y), a1 = _mm256_fmadd_ps(a1, x, y), a2 = _mm256_fmadd_ps(a2, x, y);
    a3 = _mm256_fmadd_ps(a3, x, y), a4 = _mm256_fmadd_ps(a4, x, y), a5 = _mm256_fmadd_ps(a5, x, y);
    a6 = _mm256_fmadd_ps(a6, x, y), a7 = _mm256_fmadd_ps(a7, x, y), a8 = _mm256_fmadd_ps(a8, x, y);
    a9 = _mm256_fmadd_ps(a9, x, y), a10 = _mm256_fmadd_ps(a10, x, y), a11 = _mm256_fmadd_ps(a11, x, y);
  }
  const __m256 a[kChains] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
  for (int j = 0; j < kChains; ++j) _mm256_storeu_ps(out + j * 8, a[j]);
}

struct Isa {
  const char* name;  // as the JSON context's "attention_isa"
  int lanes;         // floats per register
  bool (*supported)();
  void (*chains)(std::int64_t steps, float x, float y, float* out);
};

const Isa kIsas[] = {
    {"avx512", 16, [] { return __builtin_cpu_supports("avx512f") != 0; }, fma_chains_avx512},
    {"avx2", 8, [] { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }, fma_chains_avx2},
};

void fma_peak_case(benchmark::State& state, const Isa& isa) {
  if (!isa.supported()) {
    state.SkipWithError((std::string("this CPU has no ") + isa.name + " (fma_peak/" + isa.name + " needs it)").c_str());
    return;
  }
  // Check: a short run against scalar std::fma, chain by chain, lane by lane.
  constexpr std::int64_t kCheckSteps = 1000;
  std::vector<float> got(static_cast<std::size_t>(kChains * isa.lanes));
  isa.chains(kCheckSteps, kX, kY, got.data());
  for (int j = 0; j < kChains; ++j) {
    float want = chain_start(j);
    for (std::int64_t i = 0; i < kCheckSteps; ++i) want = std::fma(want, kX, kY);
    for (int lane = 0; lane < isa.lanes; ++lane)
      if (const float g = got[static_cast<std::size_t>(j * isa.lanes + lane)]; g != want) {
        state.SkipWithError(("check failed: " + std::string(isa.name) + " FMA chain " + std::to_string(j) + " lane " +
                             std::to_string(lane) + " is " + std::to_string(g) + ", scalar std::fma gives " +
                             std::to_string(want))
                                .c_str());
        return;
      }
  }

  // One independent loop per thread, each with its own output.
  const int threads = get_num_threads();
  std::vector<std::vector<float>> out(static_cast<std::size_t>(threads), got);
  for (auto _ : state) {
    parallel_for(0, threads, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) isa.chains(kSteps, kX, kY, out[static_cast<std::size_t>(t)].data());
    });
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.0 * threads * kSteps * kChains * isa.lanes, 0);
}

const bool registered = [] {
  for (const Isa& isa : kIsas)
    register_case(std::string("fma_peak/") + isa.name, [&isa](benchmark::State& st) { fma_peak_case(st, isa); });
  return true;
}();

}  // namespace
}  // namespace attograd::bench

#endif
