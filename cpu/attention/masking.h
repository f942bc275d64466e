#pragma once
// Hiding keys in a score tile (causal, masked, padding) and drawing a tile's
// dropout factors. Part of the one translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/attention/micro_kernel.h"
#include "cpu/attention/problem.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::attention_detail {

// Sets the hidden entries of the score tile s (m rows ld apart, n columns)
// to `hidden`: those of causally hidden pairs (key c > query r + diag; the
// columns product_scores may have left unwritten are among them) and those of
// padding keys c >= nk.
template <TileRows kRows, typename T>
AG_ALWAYS_INLINE void hide_causal(T* __restrict s, std::int64_t ld, std::int64_t m, std::int64_t nk, std::int64_t n,
                                  std::int64_t diag, T hidden) {
  for (std::int64_t x = 0; x < m; ++x) {
    T* row = s + x * ld;
    if constexpr (kRows == TileRows::keys) {  // row x is key c: hide queries r < c - diag, or all
      std::fill(row, row + (x >= nk ? n : std::clamp<std::int64_t>(x - diag, 0, n)), hidden);
    } else {  // row x is query r: hide keys c > r + diag and c >= nk
      std::fill(row + std::clamp<std::int64_t>(std::min(x + diag + 1, nk), 0, n), row + n, hidden);
    }
  }
}

// Entry (key c, query r) of the score tile s (rows ld apart) = -inf where the
// mask hides key j0 + c from query i0 + r, c < nk, r < nq.
template <TileRows kRows, typename T>
AG_ALWAYS_INLINE void hide_masked(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0,
                                  std::int64_t nq, std::int64_t j0, std::int64_t nk, T* __restrict s, std::int64_t ld) {
  if (!P.mask) return;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t ms = P.mask_strides[3], ks = key_stride<kRows>(ld), qs = query_stride<kRows>(ld);
  for (std::int64_t r = 0; r < nq; ++r) {
    const bool* m = P.mask_row(b, h, i0 + r) + j0 * ms;
    for (std::int64_t c = 0; c < nk; ++c)
      if (m[c * ms]) s[c * ks + r * qs] = neg_inf;
  }
}

// Entry (key c, query r) of the tile z (rows ld apart) = dropout factor of
// weight (i0 + r, j0 + c), r < nq, c < nk. With keys for rows, each query's
// factors are drawn into `row` (nk values) first; with queries, row is unused.
template <TileRows kRows, typename T>
AG_ALWAYS_INLINE void dropout_tile(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0,
                                   std::int64_t nq, std::int64_t j0, std::int64_t nk,
                                   std::type_identity_t<T>* __restrict row, T* __restrict z, std::int64_t ld) {
  for (std::int64_t r = 0; r < nq; ++r) {
    if constexpr (kRows == TileRows::queries) {
      dropout_factors(P, b, h, i0 + r, j0, nk, z + r * ld);
    } else {
      dropout_factors(P, b, h, i0 + r, j0, nk, row);
      for (std::int64_t c = 0; c < nk; ++c) z[c * ld + r] = row[c];
    }
  }
}

}  // namespace attograd::cpu::attention_detail
