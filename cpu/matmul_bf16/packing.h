#pragma once
// The bfloat16 product's operands packed as its kernels read them, zero-padded
// to whole blocks, from any strided layout (a transposed view packs as cheaply
// as a row-major one):
//   A  tiles of 16 rows x 32 values, each 1 KiB contiguous: the tiles of rows
//      [16 t, 16 t + 16) one after another along K. A tile read row by row from
//      a row-major A would step K * 2 bytes per row, and at K = 2048 its rows
//      all fell into one L1 set. VDPBF16PS broadcasts a pair (k, k+1) of a row.
//   B  panels of 16 columns in VNNI order, pairs of rows interleaved:
//      B(k, n0 + j) at panel[(k / 2) * 32 + j * 2 + k % 2]. A row of pairs is 64
//      bytes: one AMX tile row (16 of them make a 16 x 32 tile of B) and one
//      512-bit vector of VDPBF16PS.
// Kp is K rounded up to the 32 values of one AMX step, Mp and Np to the 32 x 32
// block every kernel computes. The packing functions are always inlined, so
// that a caller compiled for AVX-512 (the hardware kernels' entry points) gets
// them vectorised 512 bits wide.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/bfloat16.h"
#include "cpu/matmul_bf16/isa.h"
#include "cpu/vec_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif
#if AG_BF16_AVX512_KERNEL
#include <immintrin.h>
#endif

namespace attograd::cpu::bf16_gemm {

constexpr std::int64_t kBlock = 32;    // rows and columns of C one kernel call computes
constexpr std::int64_t kKStep = 32;    // K values of one AMX tile product
constexpr std::int64_t kPanel = 16;    // columns of one B panel

constexpr std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// A matrix operand: element (r, c) at data[r * row_stride + c * col_stride].
struct Bf16Matrix {
  const bfloat16* data;
  std::int64_t row_stride, col_stride;
  bfloat16 at(std::int64_t r, std::int64_t c) const { return data[r * row_stride + c * col_stride]; }
};

// Where the kernels read one 32-row block of A from, a K chunk at a time: the
// tile of its rows 0-15 at rows0 and of rows 16-31 at rows16; the next step's
// tile `step` values on; a tile's rows `row` values apart. In the packed A,
// tiles of 1 KiB (step 512, row 32); read in place from a row-major A
// (step 32, row lda).
struct ATiles {
  const bfloat16* rows0;
  const bfloat16* rows16;
  std::int64_t step, row;
};

#if defined(__SSE2__)
constexpr bool kSse2 = true;

// v[i] = row i of an 8 x 8 block of 16-bit values; on return, column i.
inline void transpose_8x8_u16(__m128i v[8]) {
  __m128i a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm_unpacklo_epi16(v[i], v[i + 1]);
    a[i + 1] = _mm_unpackhi_epi16(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm_unpacklo_epi32(a[i], a[i + 2]);
    b[i + 1] = _mm_unpackhi_epi32(a[i], a[i + 2]);
    b[i + 2] = _mm_unpacklo_epi32(a[i + 1], a[i + 3]);
    b[i + 3] = _mm_unpackhi_epi32(a[i + 1], a[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = _mm_unpacklo_epi64(b[i], b[i + 4]);
    v[2 * i + 1] = _mm_unpackhi_epi64(b[i], b[i + 4]);
  }
}

// Four rows of pairs (K values k0 .. k0 + 7) of a 16-column panel of a
// transposed B, whose column n0 + j is contiguous in K: words[q * 16 + j] =
// the pair (2q, 2q + 1) of column j, one 4 x 4 transpose of 32-bit words per 4 columns.
inline void pack_transposed_pairs(const Bf16Matrix& b, std::int64_t n0, std::int64_t k0, std::uint32_t* words) {
  for (std::int64_t j = 0; j < kPanel; j += 4) {
    __m128 v[4];
    for (int i = 0; i < 4; ++i)
      v[i] = _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.data + (n0 + j + i) * b.col_stride + k0)));
    _MM_TRANSPOSE4_PS(v[0], v[1], v[2], v[3]);
    for (int q = 0; q < 4; ++q) _mm_storeu_si128(reinterpret_cast<__m128i*>(words + q * kPanel + j), _mm_castps_si128(v[q]));
  }
}
#else
constexpr bool kSse2 = false;
inline void pack_transposed_pairs(const Bf16Matrix&, std::int64_t, std::int64_t, std::uint32_t*) {}
#endif

// Where A(r, k) lies in the packed A: tile (r / 16, k / 32), row r % 16 of its 32 values.
constexpr std::int64_t packed_a_index(std::int64_t r, std::int64_t k, std::int64_t kp) {
  return ((r / 16) * (kp / kKStep) + k / kKStep) * 16 * kKStep + (r % 16) * kKStep + k % kKStep;
}

#if AG_BF16_AVX512_KERNEL
// GCC 12's own _mm512_undefined_epi32 (`__Y = __Y`, the shuffles' pass-through)
// trips -Wuninitialized (GCC bug 105593, mended in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Rows [r0, r1) (a multiple of 32 of them) and K values [0, k / 32 * 32) of a
// transposed A (A^T row-major: A(r, c) at data[r + c * col_stride], the weight
// gradient's x^T or dy^T) into the packed A, 32 x 32 at a time: 32 lines of
// A^T, one transpose of 16-bit values in registers, 32 tile rows of 64 bytes.
// SSE2's 8 x 8 transposes spend 2.4 times the shuffles (the only port they run
// on), and held this packing to two thirds of the row-major B's bandwidth.
// Along K outermost, so that A^T is read a band of 32 whole rows at a time.
// Called, not inlined: pack_a_rows itself is compiled for the baseline.
__attribute__((target("avx512f,avx512bw"))) inline void pack_transposed_a_avx512(const Bf16Matrix& a, std::int64_t r0,
                                                                                 std::int64_t r1, std::int64_t k,
                                                                                 std::int64_t kp, bfloat16* out) {
  for (std::int64_t c = 0; c + 32 <= k; c += 32)
    for (std::int64_t r = r0; r < r1; r += 32) {
      __m512i v[32];
      for (int i = 0; i < 32; ++i) v[i] = _mm512_loadu_si512(a.data + r + (c + i) * a.col_stride);
      // An 8 x 8 transpose in every 128-bit lane of each 8 rows (as transpose_8x8_u16):
      // then lane l of v[8 g + q] is column 8 l + q of rows 8 g .. 8 g + 7.
      for (int g = 0; g < 32; g += 8) {
        __m512i t[8], u[8];
        for (int i = 0; i < 8; i += 2) {
          t[i] = _mm512_unpacklo_epi16(v[g + i], v[g + i + 1]);
          t[i + 1] = _mm512_unpackhi_epi16(v[g + i], v[g + i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
          u[i] = _mm512_unpacklo_epi32(t[i], t[i + 2]);
          u[i + 1] = _mm512_unpackhi_epi32(t[i], t[i + 2]);
          u[i + 2] = _mm512_unpacklo_epi32(t[i + 1], t[i + 3]);
          u[i + 3] = _mm512_unpackhi_epi32(t[i + 1], t[i + 3]);
        }
        for (int i = 0; i < 4; ++i) {
          v[g + 2 * i] = _mm512_unpacklo_epi64(u[i], u[i + 4]);
          v[g + 2 * i + 1] = _mm512_unpackhi_epi64(u[i], u[i + 4]);
        }
      }
      // Then a 4 x 4 transpose of lanes across v[q], v[8 + q], v[16 + q], v[24 + q]:
      // lane g of column 8 l + q's register is lane l of v[8 g + q].
      for (int q = 0; q < 8; ++q) {
        const __m512i t0 = _mm512_shuffle_i64x2(v[q], v[8 + q], 0x44), t1 = _mm512_shuffle_i64x2(v[q], v[8 + q], 0xEE);
        const __m512i t2 = _mm512_shuffle_i64x2(v[16 + q], v[24 + q], 0x44),
                      t3 = _mm512_shuffle_i64x2(v[16 + q], v[24 + q], 0xEE);
        _mm512_storeu_si512(out + packed_a_index(r + q, c, kp), _mm512_shuffle_i64x2(t0, t2, 0x88));
        _mm512_storeu_si512(out + packed_a_index(r + 8 + q, c, kp), _mm512_shuffle_i64x2(t0, t2, 0xDD));
        _mm512_storeu_si512(out + packed_a_index(r + 16 + q, c, kp), _mm512_shuffle_i64x2(t1, t3, 0x88));
        _mm512_storeu_si512(out + packed_a_index(r + 24 + q, c, kp), _mm512_shuffle_i64x2(t1, t3, 0xDD));
      }
    }
}
#pragma GCC diagnostic pop
#endif

// Rows [r0, r1) (multiples of 16) of the packed A (m x k), zero past k and past
// m. A row-major A is copied in runs of 32; any other layout 32 x 32 at a time,
// so that a transposed A (row_stride 1: the backward's x^T) is read along its
// rows (with kAvx512, by pack_transposed_a_avx512: only from a caller compiled for it).
template <bool kAvx512 = false>
AG_ALWAYS_INLINE void pack_a_rows(const Bf16Matrix& a, std::int64_t m, std::int64_t k, std::int64_t kp,
                                  std::int64_t r0, std::int64_t r1, bfloat16* out) {
  // Zeros where no value of A goes (rows from m, columns from k), rather than
  // a fill of the whole range first, which wrote every byte twice.
  const std::int64_t rows_end = std::min(r1, m);
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t c = r < rows_end ? k : 0; c < kp; c = (c / kKStep + 1) * kKStep)
      std::fill(out + packed_a_index(r, c, kp), out + packed_a_index(r, c, kp) + (kKStep - c % kKStep), bfloat16());
  if (a.col_stride == 1) {
    for (std::int64_t r = r0; r < rows_end; ++r)
      for (std::int64_t c = 0; c < k; c += kKStep) {
        const bfloat16* src = a.data + r * a.row_stride + c;
        if (k - c >= kKStep)  // a whole tile row: one fixed-size copy, not a call of memmove
          std::memcpy(out + packed_a_index(r, c, kp), src, kKStep * sizeof(bfloat16));
        else
          std::copy(src, src + (k - c), out + packed_a_index(r, c, kp));
      }
  } else {
    std::int64_t rows_done = r0;
#if defined(__SSE2__)
    if (a.row_stride == 1) {  // A^T row-major (the backward's dy^T): 8 x 8 blocks transposed in registers
      // Rows of A 32 at a time (64 bytes of each row of A^T: one line when
      // aligned), so that the four 8 x 8 blocks that read the same lines of A^T go
      // one after another: 8 rows at a time, each line was read four times, a
      // whole walk along K apart.
      const auto transpose_block = [&](std::int64_t r, std::int64_t c) {
        __m128i v[8];
        for (int i = 0; i < 8; ++i)
          v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.data + r + (c + i) * a.col_stride));
        transpose_8x8_u16(v);
        for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + packed_a_index(r + i, c, kp)), v[i]);
      };
#if AG_BF16_AVX512_KERNEL
      if constexpr (kAvx512) {  // whole 32 x 32 blocks; then the columns past them 8 x 8
        rows_done = r0 + (rows_end - r0) / 32 * 32;
        pack_transposed_a_avx512(a, r0, rows_done, k, kp, out);
        for (std::int64_t c = k / 32 * 32; c + 8 <= k; c += 8)
          for (std::int64_t r = r0; r < rows_done; r += 8) transpose_block(r, c);
      }
#endif
      for (; rows_done + 32 <= rows_end; rows_done += 32)
        for (std::int64_t c = 0; c + 8 <= k; c += 8)
          for (std::int64_t r = rows_done; r < rows_done + 32; r += 8) transpose_block(r, c);
      for (; rows_done + 8 <= rows_end; rows_done += 8)
        for (std::int64_t c = 0; c + 8 <= k; c += 8) transpose_block(rows_done, c);
    }
    // The columns past the last whole 8 of those rows, then the rows past the last whole 8.
    for (std::int64_t r = r0; r < rows_done; ++r)
      for (std::int64_t c = k / 8 * 8; c < k; ++c) out[packed_a_index(r, c, kp)] = a.at(r, c);
#endif
    for (std::int64_t rb = rows_done; rb < rows_end; rb += 32)
      for (std::int64_t cb = 0; cb < k; cb += 32)
        for (std::int64_t c = cb; c < std::min(cb + 32, k); ++c)
          for (std::int64_t r = rb; r < std::min(rb + 32, rows_end); ++r) out[packed_a_index(r, c, kp)] = a.at(r, c);
  }
}


// Panels [p0, p1) of the packed B (k x n), each Kp * 16 values, zero past k and
// past n. A pair (B(2q, n), B(2q + 1, n)) is one 32-bit word of the panel.
AG_ALWAYS_INLINE void pack_b_panels(const Bf16Matrix& b, std::int64_t k, std::int64_t n, std::int64_t kp, std::int64_t p0,
                                    std::int64_t p1, bfloat16* out) {
  const auto bits = [](bfloat16 x) { return static_cast<std::uint32_t>(x.bits); };
  const auto panel = [&](std::int64_t p) { return reinterpret_cast<std::uint32_t*>(out + p * kp * kPanel); };
  // A row-major B is read along its rows, a pair of rows across every panel of
  // the range at a time: one panel after another, a walk down 16 columns, met
  // a new page at every row at N = 2048.
  if (b.col_stride == 1) {
    for (std::int64_t q = 0; q < kp / 2; ++q) {
      const std::int64_t k0 = 2 * q;
      for (std::int64_t p = p0; p < p1; ++p) {
        std::uint32_t* words = panel(p) + q * kPanel;
        const std::int64_t n0 = p * kPanel, cols = std::clamp<std::int64_t>(n - n0, 0, kPanel);
        if (k0 + 1 < k && cols == kPanel) {  // two rows of 16 contiguous values: vectorises
          const bfloat16* even = b.data + k0 * b.row_stride + n0;
          const bfloat16* odd = even + b.row_stride;
          for (std::int64_t j = 0; j < kPanel; ++j) words[j] = bits(even[j]) | bits(odd[j]) << 16;
        } else {
          for (std::int64_t j = 0; j < kPanel; ++j) {
            const bool in = j < cols;
            words[j] = (in && k0 < k ? bits(b.at(k0, n0 + j)) : 0u) | (in && k0 + 1 < k ? bits(b.at(k0 + 1, n0 + j)) : 0u) << 16;
          }
        }
      }
    }
    return;
  }
  for (std::int64_t p = p0; p < p1; ++p) {
    const std::int64_t n0 = p * kPanel, cols = std::clamp<std::int64_t>(n - n0, 0, kPanel);
    for (std::int64_t q = 0; q < kp / 2; ++q) {
      std::uint32_t* words = panel(p) + q * kPanel;
      const std::int64_t k0 = 2 * q;
      if (b.row_stride == 1 && k0 + 7 < k && cols == kPanel && kSse2) {
        // A transposed B (the forward's W^T): each pair lies side by side in its
        // column, and 4 columns x 4 pairs are one 4 x 4 transpose of 32-bit words.
        pack_transposed_pairs(b, n0, k0, words);
        q += 3;  // four rows of pairs done
      } else if (b.row_stride == 1 && k0 + 1 < k) {  // a transposed B: each pair lies side by side in its column
        for (std::int64_t j = 0; j < cols; ++j) {
          const bfloat16* pair = b.data + (n0 + j) * b.col_stride + k0;
          words[j] = bits(pair[0]) | bits(pair[1]) << 16;
        }
        std::fill(words + cols, words + kPanel, 0u);
      } else {
        for (std::int64_t j = 0; j < kPanel; ++j) {
          const bool in = n0 + j < n;
          words[j] = (in && k0 < k ? bits(b.at(k0, n0 + j)) : 0u) | (in && k0 + 1 < k ? bits(b.at(k0 + 1, n0 + j)) : 0u) << 16;
        }
      }
    }
  }
}

}  // namespace attograd::cpu::bf16_gemm
