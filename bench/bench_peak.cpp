// fma_peak/{avx512,avx2}: this machine's float32 FMA peak at the bench's thread
// count, the denominator of "fraction of FMA peak" for the attention kernels
// (issue 13 asks to report every attention kernel's fraction of peak;
// bench/compare prints it as "% of peak" against the case of the ISA the
// attention ran on, the JSON context's "attention_isa").
//
// Each of get_num_threads() threads (ATTOGRAD_THREADS, bench_common.h) runs its
// own loop of cpu/fma_peak.h's chains (the trainer measures its MFU denominator
// with the same loops). Check with
// `objdump -d --no-show-raw-insn attograd_bench | grep -A20 chains_avx512`
// that the loop body is vfmadd on registers only.
//
// FLOPs per iteration: threads x kSteps x 12 chains x lanes (16 or 8) x 2.
// No bytes: the loop touches no memory. Before timing, each chain's lanes are
// checked bit for bit against the same chain in scalar std::fma (an FMA rounds
// once, so the two must agree exactly). A CPU without the ISA skips the case
// with an error naming it. Built for GCC and Clang on x86-64 only; elsewhere
// no case is registered (cpu::fma_chains() is empty).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.h"
#include "cpu/fma_peak.h"

namespace attograd::bench {
namespace {

constexpr std::int64_t kSteps = 1 << 20;  // loop trips per thread and iteration: ~3 ms at AVX-512 peak

void fma_peak_case(benchmark::State& state, const cpu::FmaChains& isa) {
  if (!isa.supported()) {
    state.SkipWithError((std::string("this CPU has no ") + isa.isa + " (fma_peak/" + isa.isa + " needs it)").c_str());
    return;
  }
  // Check: a short run against scalar std::fma, chain by chain, lane by lane.
  constexpr std::int64_t kCheckSteps = 1000;
  constexpr int kChains = cpu::FmaChains::kChains;
  std::vector<float> got(static_cast<std::size_t>(kChains * isa.lanes));
  isa.run(kCheckSteps, cpu::kFmaX, cpu::kFmaY, got.data());
  for (int j = 0; j < kChains; ++j) {
    float want = cpu::fma_chain_start(j);
    for (std::int64_t i = 0; i < kCheckSteps; ++i) want = std::fma(want, cpu::kFmaX, cpu::kFmaY);
    for (int lane = 0; lane < isa.lanes; ++lane)
      if (const float g = got[static_cast<std::size_t>(j * isa.lanes + lane)]; g != want) {
        state.SkipWithError(("check failed: " + std::string(isa.isa) + " FMA chain " + std::to_string(j) + " lane " +
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
      for (std::int64_t t = begin; t < end; ++t)
        isa.run(kSteps, cpu::kFmaX, cpu::kFmaY, out[static_cast<std::size_t>(t)].data());
    });
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.0 * threads * kSteps * kChains * isa.lanes, 0);
}

const bool registered = [] {
  for (const cpu::FmaChains& isa : cpu::fma_chains())
    register_case(std::string("fma_peak/") + isa.isa, [&isa](benchmark::State& st) { fma_peak_case(st, isa); });
  return true;
}();

}  // namespace
}  // namespace attograd::bench
