#pragma once
// Packing: rows of q, k, v read where they lie or copied compact, and tiles
// transposed in registers. Part of the one translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/attention/isa.h"
#include "cpu/attention/problem.h"
#include "cpu/vec_math.h"
#include "cpu/vec_transpose.h"

namespace attograd::cpu::attention_detail {

// A block of rows of an operand as the micro-kernel reads it: rows ld apart,
// each at least Dp long (D rounded up to the vector width).
template <typename T>
struct Panel {
  const T* data;
  std::int64_t ld;
};

// Rows that are not back to back (a packed (B, T, 3C) projection's q, k and
// v rows are 3C apart, as MultiHeadAttention attends them) are slower to read
// again and again than compact ones: at the L shape (T = 1024, rows 6 KiB
// apart) the fused forward and backward take markedly longer than on
// contiguous q, k, v, the forward's extra time mostly spent waiting on the
// software prefetches of the next tile's rows. A head's rows are read once
// per tile of the other side, so copying them compact first pays on long
// heads, and costs on short ones, where each row is read only a few times:
// in probes, copying paid from 512 rows up and lost below.
constexpr std::int64_t kCopyStridedFromRows = 512;

// Whether n rows ld apart are read where they lie, when each tile of
// other_rows rows (the queries to keys and values, the keys to queries) reads
// them once: D a multiple of the vector width, no padding rows, and the rows
// back to back or read only a few times.
AG_ALWAYS_INLINE bool read_in_place(std::int64_t ld, std::int64_t n, std::int64_t n_padded, std::int64_t D,
                                    std::int64_t Dp, std::int64_t other_rows) {
  return D == Dp && n == n_padded && (ld == Dp || n <= 1 || other_rows < kCopyStridedFromRows);
}

// out (n_padded, Dp) = rows [t0, t0 + n) of (b, h), zero-padded.
template <typename T>
AG_ALWAYS_INLINE void copy_compact(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                   std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t Dp,
                                   T* __restrict out) {
  for (std::int64_t r = 0; r < n; ++r) {
    const T* __restrict src = x.row(b, h, t0 + r);
    std::copy(src, src + D, out + r * Dp);
    std::fill(out + r * Dp + D, out + (r + 1) * Dp, T(0));
  }
  std::fill(out + n * Dp, out + n_padded * Dp, T(0));
}

// Rows [t0, t0 + n) of (b, h), readable as n_padded rows of Dp values: the
// tensor itself when read_in_place (other_rows as there), else a copy in
// `scratch`, zero-padded.
template <typename T>
AG_ALWAYS_INLINE Panel<T> rows_panel(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                     std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t Dp,
                                     std::int64_t other_rows, T* __restrict scratch) {
  if (read_in_place(x.st, n, n_padded, D, Dp, other_rows)) return {x.row(b, h, t0), x.st};
  copy_compact(x, b, h, t0, n, n_padded, D, Dp, scratch);
  return {scratch, Dp};
}

// out (D, ld) = factor * rows [t0, t0 + n) of (b, h) transposed, zero in columns [n, n_padded).
template <typename T, typename Tile>
AG_ALWAYS_INLINE void pack_transposed(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                      std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t ld,
                                      T factor, T* __restrict out) {
  using S = Simd<T, Tile::kBytes>;
  using Vec = typename S::Vec;
  constexpr std::int64_t W = S::kLanes;
  std::int64_t j = 0, d_blocks = 0;
  if constexpr (std::is_same_v<Tile, TileAvx512>) {
    d_blocks = D / W * W;
    for (; j + W <= n; j += W)
      for (std::int64_t d = 0; d < d_blocks; d += W) {
        Vec v[W];
        for (std::int64_t i = 0; i < W; ++i) {
          std::memcpy(&v[i], x.row(b, h, t0 + j + i) + d, sizeof(Vec));
          v[i] *= factor;
        }
        transpose_in_registers(v);  // cpu/vec_transpose.h
        for (std::int64_t i = 0; i < W; ++i) std::memcpy(out + (d + i) * ld + j, &v[i], sizeof(Vec));
      }
    for (std::int64_t r = 0; r < j; ++r) {  // the columns past the last whole block
      const T* __restrict src = x.row(b, h, t0 + r);
      for (std::int64_t d = d_blocks; d < D; ++d) out[d * ld + r] = factor * src[d];
    }
  }
  for (; j < n; ++j) {
    const T* __restrict src = x.row(b, h, t0 + j);
    for (std::int64_t d = 0; d < D; ++d) out[d * ld + j] = factor * src[d];
  }
  for (std::int64_t d = 0; d < D; ++d) std::fill(out + d * ld + n, out + d * ld + n_padded, T(0));
}

}  // namespace attograd::cpu::attention_detail
