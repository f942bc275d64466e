#pragma once
// The bfloat16 attention's operands and tiles as the products' blocks read
// them, on AMX tiles or AVX512_BF16 vectors alike
// (cpu/matmul_bf16/packing.h's two layouts: A in 16 x 32 tiles, B in
// VNNI panels of 16 columns), and the float32 score tiles rounded into
// those layouts. Part of the translation unit cpu/attention/attention_bf16.cpp.
//
// Every tile is kept (keys, queries), as the float32 forward keeps its score
// tiles: queries along the vector lanes, so the softmax's per-query max, sum
// and rescaling are plain vector operations down the rows. The products are
// then chosen so that each float32 tile is rounded into its next operand row
// by row, never transposed:
//   forward   S^T = K Q^T          A: K (keys x d)      B: Q^T (d x queries)
//             O^T += V^T P^T       A: V^T (d x keys)    B: P^T (keys x queries), rounded
//   backward  dP^T = V dO^T        A: V (keys x d)      B: dO^T (d x queries)
//             dV += P^T dO         A: P^T, rounded      B: dO (queries x d)
//             dK += dS^T Q         A: dS^T, rounded     B: Q (queries x d)
//             dQ^T += K^T dS^T     A: K^T (d x keys)    B: dS^T (keys x queries), rounded
// The head's operands are packed once per head; the float32 accumulators
// O^T and dQ^T are transposed once, into the output rows.
#include <cstdint>

#include "base/attention_problem.h"
#include "base/bfloat16.h"
#include "cpu/attention/tiling.h"
#include "cpu/bf16_rounding.h"
#include "cpu/matmul_bf16/packing.h"
#include "cpu/vec_math.h"
#include "cpu/vec_transpose.h"

namespace attograd::cpu::attention_bf16 {

using attention_detail::kBlockK;
using attention_detail::kBlockQ;
using attention_detail::round_up;
using bf16_gemm::ATiles;
using bf16_gemm::kBlock;
using bf16_gemm::kKStep;
using bf16_gemm::kPanel;
using bf16_gemm::packed_a_index;
static_assert(kBlockQ % kBlock == 0 && kBlockK % kBlock == 0 && kBlockQ % kKStep == 0 && kBlockK % kKStep == 0,
              "a tile is whole 32 x 32 blocks and whole AMX steps");

// A packed A (rows x kp, tiles of 16 x 32): the 32-row block from row r, K from k on.
AG_ALWAYS_INLINE ATiles a_block(const bfloat16* a, std::int64_t r, std::int64_t k, std::int64_t kp) {
  return {a + packed_a_index(r, k, kp), a + packed_a_index(r + 16, k, kp), 16 * kKStep, kKStep};
}

// A packed B (kp x columns, panels of kp x 16): the panel of column `col`, from K value k on.
AG_ALWAYS_INLINE const bfloat16* b_panel(const bfloat16* b, std::int64_t col, std::int64_t k, std::int64_t kp) {
  return b + (col / kPanel) * kp * kPanel + k * kPanel;
}

// A (B, H, T, D) operand's rows of head (b, h) as a matrix: `rows` (t, d), or
// `columns` (d, t), its transpose, read in place.
inline bf16_gemm::Bf16Matrix head_rows(const AttentionRows<const bfloat16>& x, std::int64_t b, std::int64_t h) {
  return {x.row(b, h, 0), x.st, 1};
}
inline bf16_gemm::Bf16Matrix head_columns(const AttentionRows<const bfloat16>& x, std::int64_t b, std::int64_t h) {
  return {x.row(b, h, 0), 1, x.st};
}

// x (T x D) packed as A, T rows padded to tp, D to dp.
inline void pack_rows_as_a(const bf16_gemm::Bf16Matrix& x, std::int64_t T, std::int64_t D, std::int64_t tp,
                           std::int64_t dp, bfloat16* out) {
  bf16_gemm::pack_a_rows(x, T, D, dp, 0, tp, out);
}
// x^T (D x T) packed as A.
inline void pack_columns_as_a(const bf16_gemm::Bf16Matrix& xt, std::int64_t T, std::int64_t D, std::int64_t tp,
                              std::int64_t dp, bfloat16* out) {
  bf16_gemm::pack_a_rows(xt, D, T, tp, 0, dp, out);
}
// x (T x D, K = T) packed as B panels; x^T (D x T, K = D) likewise.
inline void pack_rows_as_b(const bf16_gemm::Bf16Matrix& x, std::int64_t T, std::int64_t D, std::int64_t tp,
                           std::int64_t dp, bfloat16* out) {
  bf16_gemm::pack_b_panels(x, T, D, tp, 0, dp / kPanel, out);
}
inline void pack_columns_as_b(const bf16_gemm::Bf16Matrix& xt, std::int64_t T, std::int64_t D, std::int64_t tp,
                              std::int64_t dp, bfloat16* out) {
  bf16_gemm::pack_b_panels(xt, D, T, dp, 0, tp / kPanel, out);
}

// Whether a pass on Tile rounds its tiles by AVX512_BF16's VCVTNE2PS2BF16
// (Tile::kRoundsBf16: the hardware kernels' passes, attention_bf16.cpp): 1
// instruction per 32 values where bfloat16_bits' integer arithmetic takes
// some 28, and three tiles are rounded per tile of the backward.
template <typename Tile>
constexpr bool tiles_round_by_instruction() {
  if constexpr (requires { Tile::kRoundsBf16; })
    return Tile::kRoundsBf16;
  else
    return false;
}

#if AG_BF16_AVX512_KERNEL
// round_tile_as_a and round_tile_as_b below, by the instruction: called, not
// inlined, from passes compiled for AVX-512 alone (bf16_rounding.h's helpers
// inline only into AVX512_BF16 code).
AG_TARGET_AVX512_BF16 inline void round_tile_as_a_by_instruction(const float* __restrict t, std::int64_t kk,
                                                                 std::int64_t kq, bfloat16* __restrict a) {
  for (std::int64_t c = 0; c < kk; ++c)
    for (std::int64_t r0 = 0; r0 < kq; r0 += kKStep)
      round_bf16_avx512(&a[packed_a_index(c, r0, kBlockQ)].bits, t + c * kBlockQ + r0, nullptr, kKStep);
}
AG_TARGET_AVX512_BF16 inline void round_tile_as_b_by_instruction(const float* __restrict t, std::int64_t kk,
                                                                 std::int64_t kq, bfloat16* __restrict b) {
  for (std::int64_t p = 0; p < kq / kPanel; ++p) {
    auto* words = reinterpret_cast<std::uint32_t*>(b + p * kBlockK * kPanel);
    for (std::int64_t q = 0; q < kk / 2; ++q) {
      const float* even = t + 2 * q * kBlockQ + p * kPanel;
      round_bf16_pairs_avx512(words + q * kPanel, even, even + kBlockQ);
    }
  }
}

// round_transposed below, by the instruction: 16 x 16 blocks of t transposed
// in registers (cpu/vec_transpose.h), 32 values of a row rounded at
// once. Reads t's rows [0, round_up(D, 32)) and columns [0, round_up(n, 16)).
AG_TARGET_AVX512_BF16 inline void round_transposed_by_instruction(const float* __restrict t, std::int64_t ld,
                                                                  std::int64_t D, std::int64_t n,
                                                                  const float* __restrict scale, bfloat16* out,
                                                                  std::int64_t out_stride) {
  for (std::int64_t r0 = 0; r0 < n; r0 += 16)
    for (std::int64_t d0 = 0; d0 < D; d0 += 32) {
      __m512 lo[16], hi[16];  // rows r0 + i: values d0 + [0, 16) and d0 + [16, 32)
      for (int i = 0; i < 16; ++i) {
        lo[i] = _mm512_loadu_ps(t + (d0 + i) * ld + r0);
        hi[i] = _mm512_loadu_ps(t + (d0 + 16 + i) * ld + r0);
      }
      transpose_in_registers(lo);
      transpose_in_registers(hi);
      const Lanes32 lanes(std::min<std::int64_t>(32, D - d0));
      for (std::int64_t i = 0; i < std::min<std::int64_t>(16, n - r0); ++i) {
        const __m512 s = _mm512_set1_ps(scale ? scale[r0 + i] : 1.0f);
        round_bf16x32_avx512(&out[(r0 + i) * out_stride + d0].bits, _mm512_maskz_mul_ps(lanes.lo, lo[i], s),
                             _mm512_maskz_mul_ps(lanes.hi, hi[i], s), lanes);
      }
    }
}
#endif

// A float32 accumulator kept transposed (O^T, dQ^T: D rows ld apart, a column
// per query) into n rows of bfloat16 output, out_stride apart:
// out[r][d] = bfloat16(t[d][r] * scale[r]), or bfloat16(t[d][r]) without a
// scale. Value by value, column-wise with the rounding's integer arithmetic,
// writing the forward's output was half of its time outside the products.
template <typename Tile>
AG_ALWAYS_INLINE void round_transposed(const float* __restrict t, std::int64_t ld, std::int64_t D, std::int64_t n,
                                       const float* __restrict scale, bfloat16* out, std::int64_t out_stride) {
#if AG_BF16_AVX512_KERNEL
  if constexpr (tiles_round_by_instruction<Tile>())
    return round_transposed_by_instruction(t, ld, D, n, scale, out, out_stride);
#endif
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t d = 0; d < D; ++d)
      out[r * out_stride + d] = bfloat16(scale ? t[d * ld + r] * scale[r] : t[d * ld + r]);
}

// A float32 tile t (kBlockK keys x kBlockQ queries, rows kBlockQ apart), its
// first kk keys and kq queries (whole blocks: see tile_extent), rounded into a
// packed A of the tile's shape: rows keys, K queries (kp = kBlockQ). The rest
// of a is left as it was: the products read kk rows and kq K values of it.
template <typename Tile>
AG_ALWAYS_INLINE void round_tile_as_a(const float* __restrict t, std::int64_t kk, std::int64_t kq,
                                      bfloat16* __restrict a) {
#if AG_BF16_AVX512_KERNEL
  if constexpr (tiles_round_by_instruction<Tile>()) return round_tile_as_a_by_instruction(t, kk, kq, a);
#endif
  for (std::int64_t c = 0; c < kk; ++c)
    for (std::int64_t r0 = 0; r0 < kq; r0 += kKStep) {
      std::uint16_t* out = &a[packed_a_index(c, r0, kBlockQ)].bits;
      const float* in = t + c * kBlockQ + r0;
      for (std::int64_t r = 0; r < kKStep; ++r) out[r] = bfloat16_bits(in[r]);
    }
}

// The same tile's first kk keys and kq queries rounded into B panels: K keys
// (pairs of rows interleaved), columns queries (kp = kBlockK).
template <typename Tile>
AG_ALWAYS_INLINE void round_tile_as_b(const float* __restrict t, std::int64_t kk, std::int64_t kq,
                                      bfloat16* __restrict b) {
#if AG_BF16_AVX512_KERNEL
  if constexpr (tiles_round_by_instruction<Tile>()) return round_tile_as_b_by_instruction(t, kk, kq, b);
#endif
  for (std::int64_t p = 0; p < kq / kPanel; ++p) {
    auto* words = reinterpret_cast<std::uint32_t*>(b + p * kBlockK * kPanel);
    for (std::int64_t q = 0; q < kk / 2; ++q) {
      const float* even = t + 2 * q * kBlockQ + p * kPanel;
      const float* odd = even + kBlockQ;
      for (std::int64_t j = 0; j < kPanel; ++j)
        words[q * kPanel + j] =
            std::uint32_t{bfloat16_bits(even[j])} | std::uint32_t{bfloat16_bits(odd[j])} << 16;
    }
  }
}

}  // namespace attograd::cpu::attention_bf16
