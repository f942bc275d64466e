#pragma once
// This machine's float32 FMA peak, measured: the denominator of model FLOPs
// utilisation (`attograd train`'s progress line) and of the benchmarks'
// "fraction of peak" (bench/bench_peak.cpp). Each thread runs 12 independent
// chains a = a * x + y on the widest registers the CPU has: 12 chains hide the
// FMA latency on two FMA ports, so the loop is bound by FMA throughput alone.
#include <cstdint>
#include <vector>

namespace attograd::cpu {

struct FmaChains {
  static constexpr int kChains = 12;
  const char* isa;  // "avx512" or "avx2"
  int lanes;        // floats per register
  bool (*supported)();
  // Chain j's final value after `steps` trips, one per lane, into out[j * lanes + lane].
  void (*run)(std::int64_t steps, float x, float y, float* out);
};

// The chains' start (chain j) and the x, y that keep them finite however long they run (a -> 1).
float fma_chain_start(int j);
inline constexpr float kFmaX = 0.9990234375f, kFmaY = 0.0009765625f;  // 1 - 2^-10, 2^-10

// Every ISA the chains are built for, widest first (none off x86-64 or outside GCC and Clang).
const std::vector<FmaChains>& fma_chains();

// Float32 FLOP/s of the widest supported chains on `threads` threads, each on
// a core of its own: one core's rate, measured once (about 30 ms), times
// `threads`; 0 where no chains are supported.
double fma_peak_flops(int threads);

}  // namespace attograd::cpu
