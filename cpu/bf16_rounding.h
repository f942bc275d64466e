#pragma once
// float32 -> bfloat16 rounding on the CPU (and widening back, below), bit for bit base/bfloat16.h's
// bfloat16_bits (round to nearest even, a NaN kept a quiet NaN), by AVX512_BF16's
// VCVTNE2PS2BF16 where the CPU has it (unless ATTOGRAD_BF16_ISA=widen asks for
// a CPU without bfloat16 instructions: isa.h): 32 values an instruction, where
// bfloat16_bits' integer arithmetic, vectorised, takes some 28 instructions per
// 32 values, in every cast and in the product's rounding of its float32 sums
// into C.
// The instruction differs in one place: it flushes a denormal input to a signed
// zero. 32 values holding one (rare: below 2^-126) are rounded by bfloat16_bits
// instead, so results never depend on which CPU ran them.
#include <cstdint>

#include "base/bfloat16.h"
#include "cpu/matmul_bf16/isa.h"
#include "cpu/vec_math.h"

namespace attograd::cpu {

// y[i] = bfloat16_bits(x[i]) for i < n.
void round_to_bf16(std::uint16_t* y, const float* x, std::int64_t n);

// Whether round_to_bf16 runs on VCVTNE2PS2BF16 here (tests say which path they checked).
bool rounds_bf16_by_instruction();

// y[i] = float(x[i]) for i < n: the way back, exact (each value's bits become a
// float32's upper half), by base/bfloat16.h's bit arithmetic, vectorised.
void widen_bf16(float* y, const std::uint16_t* x, std::int64_t n);

}  // namespace attograd::cpu

#if AG_BF16_AVX512_KERNEL
#include <immintrin.h>

namespace attograd::cpu {

// The helpers below are always inlined, into callers compiled for
// AVX512_BF16 (AG_TARGET_AVX512_BF16: the bfloat16 kernels' entry points).

// GCC 12's own _mm512_undefined_epi32 trips -Wuninitialized (GCC bug 105593, as in packing.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Lanes holding a float32 denormal: exponent bits all zero, fraction bits not.
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE __mmask16 denormal_lanes(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  return _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)) &
         _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007fffff));
}

// 16 bfloat16 values widened to float32 (exactly).
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE __m512 widen_bf16x16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// The first n <= 32 lanes of two vectors, as masks: all of them, lo's (the first 16), hi's.
struct Lanes32 {
  __mmask32 all;
  __mmask16 lo, hi;
  explicit Lanes32(std::int64_t n)
      : all(n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1),
        lo(static_cast<__mmask16>(all)),
        hi(static_cast<__mmask16>(all >> 16)) {}
};

// out[j] = bfloat16(lane j of lo, then hi) for the lanes `lanes` selects;
// lanes past them must hold zeros.
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE void round_bf16x32_avx512(std::uint16_t* out, __m512 lo, __m512 hi,
                                                                  const Lanes32& lanes) {
  if ((denormal_lanes(lo) | denormal_lanes(hi)) != 0) {
    alignas(64) float sums[32];
    _mm512_store_ps(sums, lo);
    _mm512_store_ps(sums + 16, hi);
    for (int j = 0; j < 32; ++j)
      if (lanes.all >> j & 1) out[j] = bfloat16_bits(sums[j]);
    return;
  }
  const __m512bh rounded = _mm512_cvtne2ps_pbh(hi, lo);  // lanes 0-15 from lo
  _mm512_mask_storeu_epi16(out, lanes.all, reinterpret_cast<__m512i>(rounded));
}

// out[j] = bfloat16(in[j] + (bias ? float(bias[j]) : 0)) for j < n <= 32.
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE void round_bf16_avx512(std::uint16_t* out, const float* in,
                                                               const std::uint16_t* bias, std::int64_t n) {
  const Lanes32 lanes(n);
  __m512 lo = _mm512_maskz_loadu_ps(lanes.lo, in), hi = _mm512_maskz_loadu_ps(lanes.hi, in + 16);
  if (bias) {
    lo = _mm512_add_ps(lo, widen_bf16x16(_mm256_maskz_loadu_epi16(lanes.lo, bias)));
    hi = _mm512_add_ps(hi, widen_bf16x16(_mm256_maskz_loadu_epi16(lanes.hi, bias + 16)));
  }
  round_bf16x32_avx512(out, lo, hi, lanes);
}

// out[j] = bfloat16(even[j]) | bfloat16(odd[j]) << 16 for j < 16: two rows of
// float32 rounded into VNNI pairs (a B panel's layout, packing.h).
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE void round_bf16_pairs_avx512(std::uint32_t* out, const float* even,
                                                                     const float* odd) {
  const __m512 lo = _mm512_loadu_ps(even), hi = _mm512_loadu_ps(odd);
  if ((denormal_lanes(lo) | denormal_lanes(hi)) != 0) {
    for (int j = 0; j < 16; ++j) out[j] = std::uint32_t{bfloat16_bits(even[j])} | std::uint32_t{bfloat16_bits(odd[j])} << 16;
    return;
  }
  const __m512i rounded = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // words 0-15 even's, 16-31 odd's
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(pairs, rounded));
}

// out[j] = bfloat16(in[j * stride]) for j < n <= 32: a column of float32 sums
// (stride floats apart) into a row of bfloat16, by two gathers.
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE void round_bf16_strided_avx512(std::uint16_t* out, const float* in,
                                                                       std::int32_t stride, std::int64_t n) {
  const Lanes32 lanes(n);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i at = _mm512_mullo_epi32(lane, _mm512_set1_epi32(stride));
  const __m512 zeros = _mm512_setzero_ps();
  const __m512 lo = _mm512_mask_i32gather_ps(zeros, lanes.lo, at, in, 4);
  const __m512 hi = _mm512_mask_i32gather_ps(zeros, lanes.hi, at, in + 16 * static_cast<std::int64_t>(stride), 4);
  round_bf16x32_avx512(out, lo, hi, lanes);
}

#pragma GCC diagnostic pop

}  // namespace attograd::cpu
#endif
