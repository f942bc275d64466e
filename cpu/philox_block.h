#pragma once
// Dropout factors from the Philox stream of base/philox.h, many counters at a
// time. philox4x32 is ten rounds of two 32 x 32 -> 64-bit products and a few
// xors on one counter; one counter per call leaves the vector units idle and
// cost about 7 ns an element (dropout was a third of the char-LM training
// step). Here the rounds run on a block of counters, one array per word, so
// each round is a handful of vector multiplies (vpmuludq with AVX2, vpmullq
// with AVX-512) and xors. Every
// value is bit for bit philox_uniform's: the draws, and so every mask, stay
// what the CUDA kernels and older checkpoints' runs drew.
//
// Header-only and always inlined, so it is compiled for the instruction set
// of its caller: attention.cpp's per-ISA entry points, random.cpp's
// AG_SIMD_CLONES.
#include <algorithm>
#include <cstdint>

#include "base/philox.h"

namespace attograd::cpu {

constexpr int kPhiloxCounters = 16;                  // counters per block
constexpr int kPhiloxElements = 4 * kPhiloxCounters;  // 4 words, 4 elements, per counter

// words[4 i + w] = philox4x32(first + i, key).v[w] for i < kPhiloxCounters:
// element 4 i + w of the block whose first counter is `first`.
inline __attribute__((always_inline)) void philox4x32_block(std::uint64_t first, std::uint64_t key,
                                                             std::uint32_t* words) {
  std::uint32_t c0[kPhiloxCounters], c1[kPhiloxCounters], c2[kPhiloxCounters], c3[kPhiloxCounters];
  for (int i = 0; i < kPhiloxCounters; ++i) {
    const std::uint64_t counter = first + static_cast<std::uint64_t>(i);
    c0[i] = static_cast<std::uint32_t>(counter);
    c1[i] = static_cast<std::uint32_t>(counter >> 32);
    c2[i] = 0;
    c3[i] = 0;
  }
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {  // base/philox.h's philox4x32, lane by lane
    // Not unrolled: GCC then vectorises this loop across the counters; unrolled, it went scalar.
#pragma GCC unroll 1
    for (int i = 0; i < kPhiloxCounters; ++i) philox_round(c0[i], c1[i], c2[i], c3[i], k0, k1);
    k0 += kPhiloxKeyStep0;
    k1 += kPhiloxKeyStep1;
  }
  for (int i = 0; i < kPhiloxCounters; ++i) {
    words[4 * i] = c0[i];
    words[4 * i + 1] = c1[i];
    words[4 * i + 2] = c2[i];
    words[4 * i + 3] = c3[i];
  }
}

// out[j] = the dropout factor of element first + j of the stream (seed,
// offset), j < n: 0 when philox_uniform(seed, offset, first + j) < threshold,
// else keep. Whole blocks of counters; a block that starts or ends part-way
// into the range is drawn whole and partly used.
template <typename T>
inline __attribute__((always_inline)) void philox_dropout_factors(std::uint64_t seed, std::uint64_t offset,
                                                                   std::uint64_t first, std::int64_t n,
                                                                   float threshold, T keep, T* out) {
  std::uint32_t words[kPhiloxElements];
  std::int64_t j = 0;
  while (j < n) {
    const std::uint64_t element = first + static_cast<std::uint64_t>(j);
    philox4x32_block(offset + element / 4, seed, words);
    const std::int64_t skip = static_cast<std::int64_t>(element % 4);  // the counter's words before `element`
    const std::int64_t take = std::min<std::int64_t>(n - j, kPhiloxElements - skip);
    for (std::int64_t t = 0; t < take; ++t)
      out[j + t] = uniform_from_bits(words[skip + t]) < threshold ? T(0) : keep;
    j += take;
  }
}

}  // namespace attograd::cpu
