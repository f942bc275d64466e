#pragma once
// Shared pieces of the benchmark cases: the design notes' shapes, the thread
// setting, the FLOP/byte counters and the one-time checks against a reference.
//
// Conventions every case follows:
//  - names are "<case>/<variant>/<shape>" (e.g. "attn_core_fwdbwd/fused/M",
//    "matmul/1024"), stable across versions and parsed by bench/compare;
//    Google Benchmark appends "/iterations:N" (fixed counts) and "/real_time",
//    which bench/compare drops when pairing cases;
//  - wall-clock time (UseRealTime), because the work runs on several threads
//    and the calling thread's CPU time would undercount it;
//  - counters "flops" and "bytes" are rates (benchmark::Counter::kIsRate): the
//    per-iteration counts written next to each case, divided by the time;
//  - before timing, each case checks its result once against an independent
//    reference and calls state.SkipWithError on a mismatch.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "autograd/attention.h"
#include "autograd/ops.h"
#include "cpu/parallel.h"
#include "tensor/tensor.h"

namespace attograd::bench {

// The design notes' attention shapes (B, T, C, H): batch, sequence, width, heads.
struct AttentionShape {
  const char* name;
  std::int64_t B, T, C, H;
  std::int64_t D() const { return C / H; }
};
inline constexpr AttentionShape kShapeS{"S", 8, 64, 128, 4};
inline constexpr AttentionShape kShapeM{"M", 4, 256, 256, 8};
inline constexpr AttentionShape kShapeL{"L", 2, 1024, 512, 8};
inline constexpr AttentionShape kAttentionShapes[] = {kShapeS, kShapeM, kShapeL};
// Long sequences, for the fused core attention only (heads of D = 64).
inline constexpr AttentionShape kLongShapes[] = {{"T2048", 1, 2048, 512, 8}, {"T4096", 1, 4096, 512, 8}};

// Threads for every case: ATTOGRAD_THREADS if set (>= 1), else the library's default.
// Read in each case's Setup so that `ATTOGRAD_THREADS=1 attograd_bench` and
// `ATTOGRAD_THREADS=2 attograd_bench` compare the same binary at 1 and 2 threads.
inline int requested_threads() {
  const char* env = std::getenv("ATTOGRAD_THREADS");
  if (env == nullptr || *env == '\0') return get_num_threads();
  const int n = std::atoi(env);
  return n >= 1 ? n : get_num_threads();
}
inline void apply_threads(const benchmark::State&) { set_num_threads(requested_threads()); }

// Registers a case under its exact name with the shared settings: threads
// from ATTOGRAD_THREADS, wall-clock time, milliseconds.
template <typename Fn>
benchmark::internal::Benchmark* register_case(const std::string& name, Fn&& fn) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Fn>(fn))
      ->Setup(apply_threads)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

// Sets the rate counters from per-iteration counts, plus the thread count used (num_threads).
inline void set_counters(benchmark::State& state, double flops_per_iter, double bytes_per_iter) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["flops"] = benchmark::Counter(flops_per_iter * iters, benchmark::Counter::kIsRate);
  state.counters["bytes"] = benchmark::Counter(bytes_per_iter * iters, benchmark::Counter::kIsRate);
  // Not "threads": Google Benchmark's JSON already has a key of that name (its own threads).
  state.counters["num_threads"] = get_num_threads();
}

// Largest |a - b| / (atol + rtol |b|) over all elements: <= 1 means close.
// Shapes must match (a mismatch counts as infinitely far).
double closeness(const Tensor& a, const Tensor& b, double atol, double rtol);

// Skips the case with a message naming what differed; returns false when it did.
bool check_close(benchmark::State& state, const std::string& what, const Tensor& got, const Tensor& want,
                 double atol = 1e-4, double rtol = 1e-3);

// Token ids in [0, vocab), (B, T) int64 on the CPU, from a fixed seed.
Tensor random_tokens(std::int64_t B, std::int64_t T, std::int64_t vocab, std::uint64_t seed);

// The core attention cases' operands (bench_attention.cpp on the CPU, bench_cuda.cpp on a GPU).
struct CoreInputs {
  Tensor q, k, v;  // (B, H, T, D), leaves requiring grad
  Tensor dout;     // (B, H, T, D)
};
// Causal attention of impl on in's q, k, v, and with backward_too its backward from in.dout; the output.
// With dropout_p, dropout on the weights drawn from a generator of a fixed seed: the same masks on every call.
Tensor run_core(const CoreInputs& in, AttentionImpl impl, bool backward_too, double dropout_p = 0.0);
// The inputs cast to dtype: q, k and v leaves of their own.
CoreInputs cast_inputs(const CoreInputs& in, DType dtype);
// The fused path on bfloat16 inputs against float32's fused path on the same
// (widened) values: a sanity check, within 2^-6 of the largest (a few
// bfloat16 roundings of values of order one; tests/test_attention_bf16.cpp
// holds the kernels to their derived bound). Skips the case when it fails.
bool check_bf16_core(benchmark::State& state, const CoreInputs& in, bool backward_too, double dropout_p = 0.0);

// A float32 N(0, 1) tensor from a fixed seed (optionally scaled), optionally a leaf requiring grad.
Tensor random_input(const Shape& sizes, std::uint64_t seed, double scale = 1.0, bool requires_grad = false);

}  // namespace attograd::bench
