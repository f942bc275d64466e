#pragma once
// float32 -> bfloat16 rounding on the CPU, bit for bit base/bfloat16.h's
// bfloat16_bits (round to nearest even, a NaN kept a quiet NaN), by AVX512_BF16's
// VCVTNE2PS2BF16 where the CPU has it: 32 values an instruction, where
// bfloat16_bits' integer arithmetic, vectorised, took some 28 instructions per
// 32 values (2.5% of a bfloat16 training step in the casts, as much again in
// the product's rounding of its float32 sums into C).
// The instruction differs in one place: it flushes a denormal input to a signed
// zero. 32 values holding one (rare: below 2^-126) are rounded by bfloat16_bits
// instead, so results never depend on which CPU ran them.
#include <cstdint>

#include "base/bfloat16.h"
#include "tensor/cpu/matmul_bf16/isa.h"
#include "tensor/cpu/vec_math.h"

namespace attograd::cpu {

// y[i] = bfloat16_bits(x[i]) for i < n.
void round_to_bf16(std::uint16_t* y, const float* x, std::int64_t n);

// Whether round_to_bf16 runs on VCVTNE2PS2BF16 here (tests say which path they checked).
bool rounds_bf16_by_instruction();

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

// out[j] = bfloat16(in[j] + (bias ? float(bias[j]) : 0)) for j < n <= 32.
AG_TARGET_AVX512_BF16 AG_ALWAYS_INLINE void round_bf16_avx512(std::uint16_t* out, const float* in,
                                                               const std::uint16_t* bias, std::int64_t n) {
  const __mmask32 all = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
  const __mmask16 lo_mask = static_cast<__mmask16>(all), hi_mask = static_cast<__mmask16>(all >> 16);
  __m512 lo = _mm512_maskz_loadu_ps(lo_mask, in), hi = _mm512_maskz_loadu_ps(hi_mask, in + 16);
  if (bias) {
    lo = _mm512_add_ps(lo, widen_bf16x16(_mm256_maskz_loadu_epi16(lo_mask, bias)));
    hi = _mm512_add_ps(hi, widen_bf16x16(_mm256_maskz_loadu_epi16(hi_mask, bias + 16)));
  }
  if ((denormal_lanes(lo) | denormal_lanes(hi)) != 0) {
    alignas(64) float sums[32];
    _mm512_store_ps(sums, lo);
    _mm512_store_ps(sums + 16, hi);
    for (std::int64_t j = 0; j < n; ++j) out[j] = bfloat16_bits(sums[j]);
    return;
  }
  const __m512bh rounded = _mm512_cvtne2ps_pbh(hi, lo);  // lanes 0-15 from lo
  _mm512_mask_storeu_epi16(out, all, reinterpret_cast<__m512i>(rounded));
}

#pragma GCC diagnostic pop

}  // namespace attograd::cpu
#endif
