// bf16_peak/{amx,amx_tile_loads,avx512_bf16}: this machine's bfloat16 multiply-add peak at the
// bench's thread count, the denominator of "% of peak" for the bfloat16 matrix
// products (matmul_bf16/*: bench/compare takes the case of the kernel they ran
// on, the JSON context's "bf16_isa"). What fma_peak/* is for float32 (bench_peak.cpp).
//
// amx: each thread loops TDPBF16PS over the four (C, A, B) tile triples of the
// library's AMX kernel (cpu/matmul_bf16/amx.h, the very instructions):
// four independent accumulators, operands already in tiles, no memory in the
// loop. One instruction: 16 x 16 x 32 multiply-adds (on the Sapphire Rapids
// class Xeon here, one every 16 cycles or so: 2.5 TFLOP/s a thread).
// amx_tile_loads: the same with the kernel's tile loads (amx_loop<true>):
// the ceiling of the product's tile loop, not a peak of the instructions.
// avx512_bf16: 12 independent VDPBF16PS chains on 512-bit registers, as
// fma_peak's, so the loop is bound by throughput: 16 x 2 multiply-adds an
// instruction. Each chain starts from its own value: chains alike in every
// operand were one chain to GCC, which emitted a single VDPBF16PS a step and
// so timed its latency times 12 (the Sapphire Rapids class Xeon here then read
// 1.5x fma_peak/avx512's rate; it is 0.5x: one VDPBF16PS every 2 cycles or so).
//
// Before timing, each checks its result exactly: every product is a power of
// two and every partial sum fits float32's 24 bits, so the hardware must give
// the count of steps times the sum, bit for bit. A CPU (or build) without the
// kernel skips the case with an error naming it.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "cpu/matmul_bf16/amx.h"
#include "cpu/matmul_bf16/isa.h"

namespace attograd::bench {
namespace {

// A's values 1, B's 2^-16: one TDPBF16PS adds 32 x 2^-16 = 2^-11 to every C
// element, one VDPBF16PS 2^-15 to every lane: the check's 1000 steps are exact
// in float32, and a timed loop's at most 2^5 (no overflow, nothing denormal).
// The VDPBF16PS chain j starts at j (so, below 2^6, its sums stay exact too).
constexpr float kA = 1.0f, kB = 1.0f / 65536;

// Runs `steps` rounds of the four TDPBF16PS; writes C tile 0 to c (16 x 16).
// With kTileLoads each round first loads A's two tiles and B's two, as
// amx_strip does, from 8 rounds' tiles (32 KiB, in L1): what a product of
// 2 x 2 C tiles can reach with every operand in L1, one tile load for each
// TDPBF16PS. On the Xeon here (family 6 model 167) one thread read 3.3
// TFLOP/s so, against 3.8 without the loads: 87%.
// The operands, made once per thread: filling them inside the timed loop's
// call took some of its time.
struct AmxOperands {
  static constexpr int kRounds = 8, kTile = 16 * 32;
  alignas(64) bfloat16 a[2][kRounds][kTile], b[2][kRounds][kTile];
  AmxOperands() {
    for (int half = 0; half < 2; ++half)
      for (int r = 0; r < kRounds; ++r)
        for (int v = 0; v < kTile; ++v) a[half][r][v] = bfloat16(kA), b[half][r][v] = bfloat16(kB);
  }
};

template <bool kTileLoads>
void amx_loop(std::int64_t steps, float* c) {
  static thread_local const AmxOperands operands;
  const auto &a = operands.a, &b = operands.b;
  constexpr int kRounds = AmxOperands::kRounds;
  cpu::bf16_gemm::AmxTiles t;
  t.configure(cpu::bf16_gemm::kernel_tile_config());
  t.load<4>(a[0][0], 64), t.load<5>(a[1][0], 64), t.load<6>(b[0][0], 64), t.load<7>(b[1][0], 64);
  t.zero<0>(), t.zero<1>(), t.zero<2>(), t.zero<3>();
  for (std::int64_t i = 0; i < steps; ++i) {
    if constexpr (kTileLoads) {
      const std::int64_t r = i % kRounds;
      t.load<4>(a[0][r], 64), t.load<5>(a[1][r], 64), t.load<6>(b[0][r], 64), t.load<7>(b[1][r], 64);
    }
    t.dot<0, 4, 6>();
    t.dot<1, 4, 7>();
    t.dot<2, 5, 6>();
    t.dot<3, 5, 7>();
  }
  t.store<0>(c, 64);
  t.release();
}

// 12 chains of VDPBF16PS; writes chain j's 16 lanes to out[j * 16 ...].
__attribute__((target("avx512f,avx512bf16"))) void dpbf16_loop(std::int64_t steps, float* out) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(kA), _mm512_set1_ps(kA));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(kB), _mm512_set1_ps(kB));
  __m512 c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2), c3 = _mm512_set1_ps(3);
  __m512 c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5), c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7);
  __m512 c8 = _mm512_set1_ps(8), c9 = _mm512_set1_ps(9), c10 = _mm512_set1_ps(10), c11 = _mm512_set1_ps(11);
  for (std::int64_t i = 0; i < steps; ++i) {
    c0 = _mm512_dpbf16_ps(c0, a, b), c1 = _mm512_dpbf16_ps(c1, a, b), c2 = _mm512_dpbf16_ps(c2, a, b);
    c3 = _mm512_dpbf16_ps(c3, a, b), c4 = _mm512_dpbf16_ps(c4, a, b), c5 = _mm512_dpbf16_ps(c5, a, b);
    c6 = _mm512_dpbf16_ps(c6, a, b), c7 = _mm512_dpbf16_ps(c7, a, b), c8 = _mm512_dpbf16_ps(c8, a, b);
    c9 = _mm512_dpbf16_ps(c9, a, b), c10 = _mm512_dpbf16_ps(c10, a, b), c11 = _mm512_dpbf16_ps(c11, a, b);
  }
  const __m512 c[12] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};
  for (int j = 0; j < 12; ++j) _mm512_storeu_ps(out + j * 16, c[j]);
}

struct Peak {
  const char* name;                  // the case's: a kernel's peak as cpu::bf16_kernel_name names it ("bf16_isa")
  cpu::Bf16Kernel kernel;            // runs here only where bf16_kernel_runs_here says so
  double per_step;                   // multiply-adds a thread does per loop step
  int outputs;                       // floats the loop writes
  double sum_per_step;               // what each output gains per step
  float (*start)(int output);        // and what it starts from
  void (*loop)(std::int64_t, float*);
  std::int64_t steps;  // per thread and iteration: a few milliseconds at peak
};

const Peak kPeaks[] = {
    {"amx", cpu::Bf16Kernel::amx, 4.0 * 16 * 16 * 32, 256, 32 * kA * kB, [](int) { return 0.0f; }, amx_loop<false>,
     1 << 16},
    {"amx_tile_loads", cpu::Bf16Kernel::amx, 4.0 * 16 * 16 * 32, 256, 32 * kA * kB, [](int) { return 0.0f; },
     amx_loop<true>, 1 << 15},
    {"avx512_bf16", cpu::Bf16Kernel::avx512_bf16, 12.0 * 16 * 2, 12 * 16, 2 * kA * kB,
     [](int output) { return static_cast<float>(output / 16); }, dpbf16_loop, 1 << 20},
};

void bf16_peak_case(benchmark::State& state, const Peak& peak) {
  if (!cpu::bf16_kernel_runs_here(peak.kernel)) {  // the CPU's instructions, and the library's kernel built
    state.SkipWithError((std::string("this CPU or build has no ") + cpu::bf16_kernel_name(peak.kernel) +
                         " (bf16_peak/" + peak.name + " needs it)").c_str());
    return;
  }
  // Check: every output is exactly its start plus steps x its gain per step.
  constexpr std::int64_t kCheckSteps = 1000;
  std::vector<float> got(static_cast<std::size_t>(peak.outputs));
  peak.loop(kCheckSteps, got.data());
  for (int i = 0; i < peak.outputs; ++i)
    if (const float want = static_cast<float>(peak.start(i) + kCheckSteps * peak.sum_per_step);
        got[static_cast<std::size_t>(i)] != want) {
      state.SkipWithError(("check failed: bf16_peak/" + std::string(peak.name) + " output " + std::to_string(i) +
                           " is " + std::to_string(got[static_cast<std::size_t>(i)]) + ", want " +
                           std::to_string(want)).c_str());
      return;
    }

  const int threads = get_num_threads();
  std::vector<std::vector<float>> out(static_cast<std::size_t>(threads), got);
  for (auto _ : state) {
    parallel_for(0, threads, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) peak.loop(peak.steps, out[static_cast<std::size_t>(t)].data());
    });
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.0 * threads * peak.steps * peak.per_step, 0);
}

const bool registered = [] {
  for (const Peak& peak : kPeaks)
    register_case(std::string("bf16_peak/") + peak.name, [&peak](benchmark::State& st) { bf16_peak_case(st, peak); });
  return true;
}();

}  // namespace
}  // namespace attograd::bench

#endif
