#pragma once
// bfloat16: the top half of a float32 (1 sign bit, 8 exponent bits, 7 stored
// significand bits, so 8 significant bits), the format mixed-precision
// training keeps activations and matrix-product operands in. Its range is
// float32's, so converting never overflows to infinity where float32 does not;
// only precision is lost.
//
// float32 -> bfloat16 rounds to nearest, ties to even, and keeps a NaN a
// (quiet) NaN, as PyTorch's and the hardware's conversions (VCVTNEPS2BF16,
// __float2bfloat16) do; bfloat16 -> float32 is exact. Arithmetic converts to
// float32, computes there and rounds once on the way back.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/host_device.h"

namespace attograd {

// The bfloat16 bits of x, rounded to nearest even.
AG_HOST_DEVICE inline std::uint16_t bfloat16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN: keep it, quiet
  const std::uint32_t round = 0x7fffu + ((u >> 16) & 1u);  // half an ulp, and one more when the kept bit is odd
  return static_cast<std::uint16_t>((u + round) >> 16);
}

// The float32 of bfloat16 bits: exact.
AG_HOST_DEVICE inline float bfloat16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  // Implicit both ways, as float16 and bfloat16 are in PyTorch and CUDA: a
  // kernel written for T computes `T(a * b)` in float32 and rounds once.
  AG_HOST_DEVICE bfloat16(float x) : bits(bfloat16_bits(x)) {}
  AG_HOST_DEVICE bfloat16(double x) : bits(bfloat16_bits(static_cast<float>(x))) {}  // via float32, as PyTorch
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  AG_HOST_DEVICE bfloat16(I x) : bits(bfloat16_bits(static_cast<float>(x))) {}
  AG_HOST_DEVICE operator float() const { return bfloat16_to_float(bits); }

  AG_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 r;
    r.bits = b;
    return r;
  }
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 is two bytes of storage");

// The type a kernel on T values computes in: float32 for bfloat16, else T.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;

}  // namespace attograd
