#pragma once
// Vectorisable float32 exp and tanh for the CPU kernels. libm's expf/tanhf are
// scalar calls, so a loop over them never vectorises and GELU/softmax ran at
// ~20 ns per element; these are branch-free polynomials the compiler turns
// into SIMD code. float64 keeps libm: it serves gradcheck and references,
// where exactness matters more than speed.
//
// exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then Cephes'
// degree-6 polynomial for e^r (max relative error ~1.5e-7, about 1-2 ulp),
// scaled by 2^n through the exponent bits.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace attograd::cpu {

// e^x for x in [kExpMin, kExpMax], with no checks: the caller clamps.
inline constexpr float kExpMin = -87.33654f, kExpMax = 88.72283f;
inline float exp_in_range(float xc) {
  // Round to nearest by the 1.5 * 2^23 trick: SSE2 has no vector floor, and a
  // floor call would stop the loop from vectorising.
  constexpr float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;  // ln2 split in two for an exact product
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // 2^n, with n in [-126, 128]: build the float from its exponent field; n = 128
  // is split as 2 * 2^127 so the exponent never overflows.
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;
  std::int32_t b1 = (half + 127) << 23, b2 = (ni - half + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  return er * s1 * s2;
}

inline float exp_fast(float x) {
  // Below kExpMin e^x is subnormal in float32; flushing it to 0 keeps the bit
  // trick simple (softmax of masked -inf entries must give exactly 0).
  const bool underflow = x < kExpMin, overflow = x > kExpMax;
  // Written so NaN clamps to kExpMin (every comparison with NaN is false): converting
  // a NaN n to int would be undefined behaviour (UBSan); the NaN itself is
  // returned at the end.
  const float xc = x > kExpMin ? (x < kExpMax ? x : kExpMax) : kExpMin;
  const float y = exp_in_range(xc);
  return x != x ? x : (underflow ? 0.0f : (overflow ? INFINITY : y));
}

// 1 / d for d in [1, 2^100], with no checks and no division (a vector
// division issues several times less often than a multiply-add). An estimate
// from the bits (the "magic constant" 0x7EF311C7 minus them, within 12%), then three
// Newton steps, each squaring the relative error, the last written as a
// correction r + r (1 - d r) so that d = 1 gives exactly 1 (GELU's s = 1 for
// large x, where 1 - s is multiplied by x^3 in its gradient): within 1 ulp of
// the division at every float in the range, with FMA contraction or without
// (checked exhaustively). Past 2^126 the estimate would turn denormal.
inline constexpr float kReciprocalMax = 0x1p100f;
inline float reciprocal_in_range(float d) {
  std::uint32_t bits;
  std::memcpy(&bits, &d, 4);
  bits = 0x7EF311C7u - bits;
  float r;
  std::memcpy(&r, &bits, 4);
  r = r * (2.0f - d * r);
  r = r * (2.0f - d * r);
  return r + r * (1.0f - d * r);
}

// tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|}): no cancellation for large
// |x|; for |x| < 0.0625 a short odd Taylor series keeps the relative error small.
inline float tanh_fast(float x) {
  const float ax = std::fabs(x);
  const float e = exp_fast(-2.0f * ax);
  const float big = (1.0f - e) / (1.0f + e);
  const float x2 = x * x;
  const float small = ax * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
  const float t = ax < 0.0625f ? small : big;
  return x != x ? x : (x < 0 ? -t : t);
}

// Overloads so templated kernels pick the fast float32 path and libm for float64.
inline float exp_of(float x) { return exp_fast(x); }
inline double exp_of(double x) { return std::exp(x); }
inline float tanh_of(float x) { return tanh_fast(x); }
inline double tanh_of(double x) { return std::tanh(x); }

}  // namespace attograd::cpu

// AG_SIMD_CLONES on a hot loop function compiles it for AVX-512 (x86-64-v4),
// AVX2+FMA (x86-64-v3) and the baseline, and picks the best at load time (GCC
// function multi-versioning), so one binary runs on any x86-64 and still uses
// the wide vectors where they exist. Loops only vectorise when built with
// -fno-trapping-math (set in CMakeLists.txt): the clamps above are selects.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define AG_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AG_SIMD_CLONES
#endif

// Code called from an AG_SIMD_CLONES function (or one with a target attribute)
// is compiled for that function's level only where it is inlined into it: a
// helper, or a lambda's body, left out of line runs as baseline code (in the
// fused attention that once made a loop an order of magnitude slower). AG_ALWAYS_INLINE forces
// the inlining.
#if defined(__GNUC__)
#define AG_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define AG_ALWAYS_INLINE inline
#endif
