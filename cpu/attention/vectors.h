#pragma once
// Loads and stores of GCC's vectors, and the exponential of the online
// softmax on them. Part of the one translation unit cpu/attention/attention.cpp.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/attention/isa.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::attention_detail {

template <typename Vec, typename T>
AG_ALWAYS_INLINE void load(Vec& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}
template <typename T, typename Vec>
AG_ALWAYS_INLINE void store(T* p, const Vec& v) {
  std::memcpy(p, &v, sizeof v);
}

// x = exp(x) lane by lane, for the softmax's arguments s - max <= 0 (-inf
// gives 0, NaN stays NaN): the range reduction and polynomial of exp_fast
// (cpu/vec_math.h), with its values, written on vectors and without
// the overflow handling arbitrary arguments need: 17 vector instructions
// with AVX-512, under half of the auto-vectorised exp_fast's. Valid for
// x <= 88, where it equals exp_fast bit for bit. float64 serves gradcheck: it
// takes libm's exp, lane by lane.
template <typename Vec>
AG_ALWAYS_INLINE void exp_softmax(Vec& x) {
  using T = std::remove_cvref_t<decltype(x[0])>;
  constexpr std::int64_t kLanes = Simd<T, sizeof(Vec)>::kLanes;
  if constexpr (std::is_same_v<T, double>) {
    for (std::int64_t l = 0; l < kLanes; ++l) x[l] = std::exp(x[l]);
  } else {
    // No clamping: lanes below lo (-inf among them) are set to 0 at the end, whatever
    // they computed on the way, and a NaN makes er, so the result, NaN.
    const Vec lo = Vec{} + -87.33654f;
    // Adding 1.5 * 2^23 rounds to an integer n, which t then holds in its low mantissa bits.
    constexpr float kRound = 12582912.0f;
    const Vec t = x * 1.44269504088896341f + kRound;
    const Vec n = t - kRound;
    Vec r = x - n * 0.693359375f;  // ln 2 split in two for an exact product
    r = r - n * -2.12194440e-4f;
    Vec p = Vec{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const Vec er = p * r * r + r + 1.0f;
    // 2^n, n in [-126, 127], from t's bits: they are kRound's plus n, and kRound's
    // (0x4B400000) shifted left by 23 are 0, so 2^n's are (bits(t) + 127) << 23.
    // Cheaper than converting n to integers, and no conversion of a NaN.
    typedef std::uint32_t Bits __attribute__((vector_size(sizeof(Vec))));
    Bits bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;
    Vec two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    x = x < lo ? Vec{} : er * two_n;
  }
}

}  // namespace attograd::cpu::attention_detail
