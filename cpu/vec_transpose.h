#pragma once
// A W x W transpose in registers (W = lanes per vector), as log2(W) rounds of
// a butterfly: round B pairs vectors B apart and interleaves their lanes in
// blocks of B. With AVX-512 each shuffle is one two-source permute, so a
// 16 x 16 block costs about 100 instructions instead of 256 scattered stores;
// elsewhere GCC lowers the shuffles poorly, and callers store lanes instead.
// Used by the fused attention's packing (k^T) and the float32 GEMM's packing
// of a transposed B (a Linear's weight in its forward).
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cpu/vec_math.h"

namespace attograd::cpu {
namespace transpose_detail {

template <typename Vec>
using Lane = std::remove_cvref_t<decltype(std::declval<Vec>()[0])>;
template <typename Vec>
inline constexpr int kLanes = static_cast<int>(sizeof(Vec) / sizeof(Lane<Vec>));

template <int W, int B, bool kUpper>
constexpr int interleave_lane(int k) {  // lane k of the shuffle of round B
  const int segment = k / (2 * B) * (2 * B), offset = k % (2 * B), half = kUpper ? B : 0;
  return offset < B ? segment + half + offset : W + segment + half + offset - B;
}

// *out = lanes interleave_lane(k) of (x, y). Clang (the sanitizer and fuzzing
// build) has no __builtin_shuffle; its __builtin_shufflevector takes constant lanes.
template <typename Vec, int B, bool kUpper, std::size_t... K>
AG_ALWAYS_INLINE void interleave(const Vec& x, const Vec& y, Vec* out, std::index_sequence<K...>) {
  constexpr int W = kLanes<Vec>;
#if defined(__clang__)
  *out = __builtin_shufflevector(x, y, interleave_lane<W, B, kUpper>(K)...);
#else
  using Index = std::conditional_t<sizeof(Lane<Vec>) == 4, std::int32_t, std::int64_t>;
  typedef Index Indices __attribute__((vector_size(sizeof(Vec))));
  constexpr Indices mask{interleave_lane<W, B, kUpper>(K)...};
  *out = __builtin_shuffle(x, y, mask);
#endif
}

template <typename Vec, int B>
AG_ALWAYS_INLINE void butterfly(Vec* v) {
  constexpr int W = kLanes<Vec>;
  if constexpr (B < W) {
    for (int i = 0; i < W; i += 2 * B)
      for (int j = i; j < i + B; ++j) {
        const Vec x = v[j], y = v[j + B];
        interleave<Vec, B, false>(x, y, &v[j], std::make_index_sequence<W>());
        interleave<Vec, B, true>(x, y, &v[j + B], std::make_index_sequence<W>());
      }
    butterfly<Vec, 2 * B>(v);
  }
}

}  // namespace transpose_detail

// v[i][j] becomes v[j][i] for the W vectors of W lanes v[0 .. W).
template <typename Vec>
AG_ALWAYS_INLINE void transpose_in_registers(Vec* v) {
  transpose_detail::butterfly<Vec, 1>(v);
}

}  // namespace attograd::cpu
