#pragma once
// The register-blocked micro-kernel and the three tile products made of it
// (scores, query-side and key-side accumulation). Part of the one translation
// unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/attention/isa.h"
#include "cpu/attention/tiling.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::attention_detail {

// C[i][j] = C0[i][j] + sum_{k0 <= k < k1} A(i, k) B[k][j] for i < MR and j < NV
// vectors, with A(i, k) = a[i * a_rs + k * a_ks], rows of B and C ldb and ldc
// apart, and C0 = 0 (overwrite), C (accumulate) or C scaled by row_scale[i].
// The MR x NV accumulators are compile-time indexed once the loops unroll,
// so they live in registers.
enum class Into { overwrite, accumulate, rescale_and_accumulate };

template <typename T, int kBytes, int MR, int NV>
AG_ALWAYS_INLINE void micro_kernel(const T* __restrict a, std::int64_t a_rs, std::int64_t a_ks,
                                   const T* __restrict b, std::int64_t ldb, std::int64_t k0, std::int64_t k1,
                                   T* __restrict c, std::int64_t ldc, Into into, const T* __restrict row_scale) {
  using Vec = typename Simd<T, kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, kBytes>::kLanes;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = Vec{};
      if (into != Into::overwrite) std::memcpy(&acc[i][v], c + i * ldc + v * W, sizeof(Vec));
      if (into == Into::rescale_and_accumulate) acc[i][v] *= row_scale[i];
    }
  for (std::int64_t k = k0; k < k1; ++k) {
    Vec bk[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&bk[v], b + k * ldb + v * W, sizeof(Vec));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T aik = a[i * a_rs + k * a_ks];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += aik * bk[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(c + i * ldc + v * W, &acc[i][v], sizeof(Vec));
}

// The last n < (NV + 1) vectors of a row group's columns: one micro-kernel as
// wide as fits, then the narrower ones, so that a rest of 2 vectors runs as
// one tile of 2 x MR accumulators, not two of MR that wait on their latency.
template <typename T, typename Tile, int NV>
AG_ALWAYS_INLINE void narrow_tiles(std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                                   std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c, std::int64_t ldc,
                                   Into into, const T* row_scale) {
  if constexpr (NV > 0) {
    constexpr std::int64_t kWidth = NV * Simd<T, Tile::kBytes>::kLanes;
    if (n >= kWidth) {
      micro_kernel<T, Tile::kBytes, Tile::kRows, NV>(a, a_rs, a_ks, b, ldb, k0, k1, c, ldc, into, row_scale);
      b += kWidth, c += kWidth, n -= kWidth;
    }
    narrow_tiles<T, Tile, NV - 1>(n, a, a_rs, a_ks, b, ldb, k0, k1, c, ldc, into, row_scale);
  }
}

// R rows over the columns [0, n) in micro-tiles of R x kWideVecs vectors, n a
// multiple of their width (tiles with wide micro-tiles only).
template <typename T, typename Tile, int R>
AG_ALWAYS_INLINE void wide_tiles(std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                                 std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c, std::int64_t ldc, Into into,
                                 const T* row_scale) {
  constexpr std::int64_t kWideN = Tile::kWideVecs * Simd<T, Tile::kBytes>::kLanes;
  for (std::int64_t j = 0; j < n; j += kWideN)
    micro_kernel<T, Tile::kBytes, R, Tile::kWideVecs>(a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, into, row_scale);
}

// The micro-kernel over the columns [0, n) of one row group, n a multiple of
// the vector width: full MR x NR tiles, then narrower ones for the rest.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void row_group(std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                                std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c, std::int64_t ldc,
                                Into into, const T* row_scale = nullptr) {
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes, NR = Tile::kVecs * W;
  if constexpr (Tile::kWideRows > 0) {
    constexpr std::int64_t kWideN = Tile::kWideVecs * W;
    if (n % kWideN == 0) {
      for (int r = 0; r < Tile::kRows; r += Tile::kWideRows)
        wide_tiles<T, Tile, Tile::kWideRows>(n, a + r * a_rs, a_rs, a_ks, b, ldb, k0, k1, c + r * ldc, ldc, into,
                                             row_scale ? row_scale + r : nullptr);
      return;
    }
  }
  std::int64_t j = 0;
  for (; j + NR <= n; j += NR)
    micro_kernel<T, Tile::kBytes, Tile::kRows, Tile::kVecs>(a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, into,
                                                            row_scale);
  narrow_tiles<T, Tile, Tile::kVecs - 1>(n - j, a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, into, row_scale);
}

// What the products below do between row groups: nothing, or a few software
// prefetches, so that a tile's prefetches do not all wait at once for the
// line fill buffers.
struct NoOp {
  void operator()() const {}
};

// Whether a tile of `rows` x `cols` at diagonal offset diag (below: key c is
// visible to query r when c <= r + diag) hides no key from any query, so no
// row group of it is trimmed.
constexpr bool untrimmed(std::int64_t diag, std::int64_t rows, std::int64_t cols) {
  return diag >= std::max(rows, cols);
}

// The last `rest` < R rows of an untrimmed tile, columns [0, n) in blocks of kWideVecs vectors.
template <typename T, typename Tile, int R>
AG_ALWAYS_INLINE void whole_rows_rest(std::int64_t rest, std::int64_t n, const T* a, std::int64_t a_rs,
                                      std::int64_t a_ks, const T* b, std::int64_t ldb, std::int64_t k0,
                                      std::int64_t k1, T* c, std::int64_t ldc, Into into, const T* row_scale) {
  if constexpr (R > 0) {
    if (rest != R)
      return whole_rows_rest<T, Tile, R - 1>(rest, n, a, a_rs, a_ks, b, ldb, k0, k1, c, ldc, into, row_scale);
    wide_tiles<T, Tile, R>(n, a, a_rs, a_ks, b, ldb, k0, k1, c, ldc, into, row_scale);
  }
}

// Rows [0, m) of an untrimmed tile, kWholeRows at a time (`between` after
// each), where the tile has them and the columns [0, n) are whole blocks of
// kWideVecs vectors; false, having done nothing, where not.
template <typename T, typename Tile, typename Between>
AG_ALWAYS_INLINE bool whole_rows(std::int64_t m, std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks,
                                 const T* b, std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c,
                                 std::int64_t ldc, Into into, const T* row_scale, Between& between) {
  if constexpr (Tile::kWholeRows == 0) {
    return false;
  } else {
    constexpr std::int64_t R = Tile::kWholeRows, kWideN = Tile::kWideVecs * Simd<T, Tile::kBytes>::kLanes;
    if (n % kWideN != 0) return false;
    std::int64_t r = 0;
    for (; r + R <= m; r += R) {
      wide_tiles<T, Tile, R>(n, a + r * a_rs, a_rs, a_ks, b, ldb, k0, k1, c + r * ldc, ldc, into,
                             row_scale ? row_scale + r : nullptr);
      between();
    }
    whole_rows_rest<T, Tile, R - 1>(m - r, n, a + r * a_rs, a_rs, a_ks, b, ldb, k0, k1, c + r * ldc, ldc, into,
                                    row_scale ? row_scale + r : nullptr);
    return true;
  }
}

// In the three products below, a score tile (S, P or dS) is kept one of two
// ways round: with keys c for rows and queries r for columns (the forward's
// S^T, so the online softmax runs down rows), or with queries for rows (the
// backward's, so it reads q and do rows where they lie). Key c is visible to
// query r only when c <= r + diag (diag = i0 - j0 for a causal tile at
// (i0, j0), kNoDiagonal otherwise). Row and column counts are multiples of
// the micro-tile; buffers are zero-padded to them.
enum class TileRows { keys, queries };

// Scores: C (m, n) = A (m, K) Bt (K, n), A(x, k) = a[x * lda + k]. Columns of
// a row group that none of its rows sees are left unwritten (with keys for
// rows, the queries before the first that sees key c0; with queries for rows,
// the keys after the last that query r + MR - 1 sees); the caller hides them.
template <typename T, typename Tile, TileRows kRows, typename Between = NoOp>
AG_ALWAYS_INLINE void product_scores(std::int64_t m, std::int64_t n, std::int64_t K, const T* a, std::int64_t lda,
                                     const T* bt, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t diag,
                                     Between between = {}) {
  constexpr std::int64_t MR = Tile::kRows, W = Simd<T, Tile::kBytes>::kLanes;
  if (untrimmed(diag, m, n) && whole_rows<T, Tile>(m, n, a, lda, 1, bt, ldb, 0, K, c, ldc, Into::overwrite, nullptr,
                                                   between))
    return;
  for (std::int64_t x0 = 0; x0 < m; x0 += MR) {
    std::int64_t first = 0, last = n;
    if constexpr (kRows == TileRows::keys)
      first = std::clamp<std::int64_t>(x0 - diag, 0, n) / W * W;
    else
      last = round_up(std::clamp<std::int64_t>(x0 + MR + diag, 0, n), W);
    row_group<T, Tile>(last - first, a + x0 * lda, lda, 1, bt + first, ldb, 0, K, c + x0 * ldc + first, ldc,
                       Into::overwrite);
    between();
  }
}

// Element (key c, query r) of a score tile with rows ld apart.
template <TileRows kRows>
constexpr std::int64_t key_stride(std::int64_t ld) {
  return kRows == TileRows::keys ? ld : 1;
}
template <TileRows kRows>
constexpr std::int64_t query_stride(std::int64_t ld) {
  return kRows == TileRows::keys ? 1 : ld;
}

// Query-side accumulation: C (m queries, n) (+)= A^T B for the score tile A
// of kk keys and m queries, rows lda apart, zero where hidden, so row group r
// stops at the last key it sees. For out += P v (each row first rescaled by
// row_scale) and dq += dS k.
template <typename T, typename Tile, TileRows kRows, typename Between = NoOp>
AG_ALWAYS_INLINE void accumulate_queries(std::int64_t m, std::int64_t n, std::int64_t kk, const T* a,
                                         std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                                         std::int64_t diag, Into into, const T* row_scale = nullptr,
                                         Between between = {}) {
  constexpr std::int64_t MR = Tile::kRows;
  const std::int64_t a_rs = query_stride<kRows>(lda), a_ks = key_stride<kRows>(lda);
  if (untrimmed(diag, m, kk) && whole_rows<T, Tile>(m, n, a, a_rs, a_ks, b, ldb, 0, kk, c, ldc, into, row_scale, between))
    return;
  for (std::int64_t r = 0; r < m; r += MR) {
    const std::int64_t end = std::clamp<std::int64_t>(r + MR + diag, 0, kk);
    row_group<T, Tile>(n, a + r * a_rs, a_rs, a_ks, b, ldb, 0, end, c + r * ldc, ldc, into,
                       row_scale ? row_scale + r : nullptr);
    between();
  }
}

// Key-side accumulation: C (m keys, n) (+)= A B for the score tile A of m
// keys and kk queries, rows lda apart, zero where hidden, so row group c
// starts at the first query that sees it. For dv += P^T do and dk += dS^T q.
template <typename T, typename Tile, TileRows kRows>
AG_ALWAYS_INLINE void accumulate_keys(std::int64_t m, std::int64_t n, std::int64_t kk, const T* a, std::int64_t lda,
                                      const T* b, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t diag,
                                      Into into) {
  constexpr std::int64_t MR = Tile::kRows;
  const std::int64_t a_rs = key_stride<kRows>(lda), a_ks = query_stride<kRows>(lda);
  NoOp nothing_between;
  if (untrimmed(diag, m, kk) &&
      whole_rows<T, Tile>(m, n, a, a_rs, a_ks, b, ldb, 0, kk, c, ldc, into, nullptr, nothing_between))
    return;
  for (std::int64_t c0 = 0; c0 < m; c0 += MR) {
    const std::int64_t begin = std::clamp<std::int64_t>(c0 - diag, 0, kk);
    row_group<T, Tile>(n, a + c0 * a_rs, a_rs, a_ks, b, ldb, begin, kk, c + c0 * ldc, ldc, into);
  }
}

}  // namespace attograd::cpu::attention_detail
