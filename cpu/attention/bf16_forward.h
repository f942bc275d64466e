#pragma once
// The bfloat16 forward, a head at a time: the head's K, Q^T and V^T packed
// once, then query block by query block, key tile by key tile, S^T = K Q^T on
// the tiles, the float32 kernel's online softmax on S^T (float32 statistics),
// P^T rounded to bfloat16 and O^T += V^T P^T on the tiles. Part of the
// translation unit cpu/attention/attention_bf16.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/attention/bf16_problem.h"
#include "cpu/attention/bf16_tiles.h"
#include "cpu/attention/forward.h"
#include "cpu/attention/masking.h"

namespace attograd::cpu::attention_bf16 {

struct ForwardOutputs {
  bfloat16* out;  // (B, Tq, H, D)
  float* lse;     // (B, H, Tq)
};

// Scratch of one thread.
struct ForwardScratch {
  Scratch<bfloat16> k;       // (Tkp, Dp) packed A: keys
  Scratch<bfloat16> qt;      // (Dp, Tqp) B panels: queries transposed
  Scratch<bfloat16> vt;      // (Dp, Tkp) packed A: values transposed
  Scratch<bfloat16> p;       // (kBlockK, kBlockQ) B panels: the tile's P^T (Z), rounded
  Scratch<float> s, z;       // (kBlockK, kBlockQ) S^T then P^T; dropout factors
  Scratch<float> acc;        // (Dp, kBlockQ) O^T, unnormalised
  Scratch<float> m, l, rescale;  // (kBlockQ) the online softmax's running max and sum; exp(m_old - m_new)
  Scratch<float> z_row;      // (kBlockK)
  explicit ForwardScratch(const Bf16Problem& P)
      : k(P.tkp() * P.dp()), qt(P.dp() * P.tqp()), vt(P.dp() * P.tkp()), p(kBlockK * kBlockQ), s(kBlockK * kBlockQ),
        z(kBlockK * kBlockQ), acc(P.dp() * kBlockQ), m(kBlockQ), l(kBlockQ), rescale(kBlockQ), z_row(kBlockK) {}
};

// Queries [i0, i0 + nq) of head (b, h), from the head's packed operands in w.
template <typename Blocks, typename Tile>
AG_ALWAYS_INLINE void forward_query_block(Blocks& t, const Bf16Problem& P, const ForwardOutputs& O, ForwardScratch& w,
                                          std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq) {
  using attention_detail::TileRows;
  const attention_detail::Problem<float>& meta = P.meta;
  const std::int64_t D = meta.D, Dp = P.dp(), Tkp = P.tkp();
  float* __restrict s = w.s.data();
  float* __restrict acc = w.acc.data();
  float* __restrict m = w.m.data();
  float* __restrict l = w.l.data();
  std::fill(acc, acc + Dp * kBlockQ, 0.0f);
  std::fill(m, m + kBlockQ, kNegInf);
  std::fill(l, l + kBlockQ, 0.0f);
  const std::int64_t key_end = meta.visible_end(i0 + nq - 1), kq = tile_extent(nq);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0), kk = tile_extent(nk), diag = diagonal(P, i0, j0);
    for (std::int64_t kb = 0; kb < kk; kb += kBlock)  // S^T = K Q^T
      for (std::int64_t qb = 0; qb < kq; qb += kBlock)
        if (!block_hidden(kb, qb, diag))
          t.block(a_block(w.k.data(), j0 + kb, 0, Dp), b_panel(w.qt.data(), i0 + qb, 0, Dp),
                  b_panel(w.qt.data(), i0 + qb + kPanel, 0, Dp), Dp / kKStep, s + kb * kBlockQ + qb,
                  kBlockQ, false);
    for (std::int64_t c = 0; c < kk; ++c)
      for (std::int64_t r = 0; r < kq; ++r) s[c * kBlockQ + r] *= meta.scale;
    // Hides the blocks left unwritten above too (and every key row from nk on).
    attention_detail::hide_causal<TileRows::keys>(s, kBlockQ, kk, nk, kq, diag, kNegInf);
    attention_detail::hide_masked<TileRows::keys>(meta, b, h, i0, nq, j0, nk, s, kBlockQ);
    attention_detail::online_softmax_tile<float, Tile>(s, kk, kq, m, l, w.rescale.data());
    const float* weights = s;  // P^T, or P^T Z with dropout
    if (meta.dropout()) {
      float* __restrict z = w.z.data();
      std::fill(z, z + kBlockK * kBlockQ, 0.0f);
      attention_detail::dropout_tile<TileRows::keys>(meta, b, h, i0, nq, j0, nk, w.z_row.data(), z, kBlockQ);
      for (std::int64_t c = 0; c < kk; ++c)
        for (std::int64_t r = 0; r < kq; ++r) z[c * kBlockQ + r] *= s[c * kBlockQ + r];
      weights = z;
    }
    round_tile_as_b<Tile>(weights, kk, kq, w.p.data());
    const float* __restrict rescale = w.rescale.data();
    for (std::int64_t d = 0; d < Dp; ++d)
      for (std::int64_t r = 0; r < kq; ++r) acc[d * kBlockQ + r] *= rescale[r];
    for (std::int64_t db = 0; db < Dp; db += kBlock)  // O^T += V^T P^T
      for (std::int64_t qb = 0; qb < kq; qb += kBlock)
        t.block(a_block(w.vt.data(), db, j0, Tkp), b_panel(w.p.data(), qb, 0, kBlockK),
                b_panel(w.p.data(), qb + kPanel, 0, kBlockK), kk / kKStep, acc + db * kBlockQ + qb,
                kBlockQ, true);
  }
  float* lse = O.lse + (b * meta.H + h) * meta.Tq + i0;
  float* __restrict inv = w.rescale.data();  // done with: 1 / l
  for (std::int64_t r = 0; r < nq; ++r) inv[r] = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
  bfloat16* out = O.out + ((b * meta.Tq + i0) * meta.H + h) * D;  // query i0's row; rows H * D apart
  round_transposed<Tile>(acc, kBlockQ, D, nq, inv, out, meta.H * D);
  for (std::int64_t r = 0; r < nq; ++r) {
    if (l[r] == 0.0f) {  // every key hidden: zeros, not 0/0
      std::fill(out + r * meta.H * D, out + r * meta.H * D + D, bfloat16());
      lse[r] = kNegInf;
    } else {
      lse[r] = m[r] + std::log(l[r]);
    }
  }
}

// The forward of the heads b * H + h the queue hands this thread.
template <typename Blocks, typename Tile>
AG_ALWAYS_INLINE void forward_heads(Blocks& t, const Bf16Problem& P, const ForwardOutputs& O, TaskQueue& heads) {
  const attention_detail::Problem<float>& meta = P.meta;
  ForwardScratch w(P);
  t.begin();
  for (std::int64_t lo, hi; heads.next(lo, hi);)
    for (std::int64_t bh = lo; bh < hi; ++bh) {
      const std::int64_t b = bh / meta.H, h = bh % meta.H;
      pack_rows_as_a(head_rows(P.k, b, h), meta.Tk, meta.D, P.tkp(), P.dp(), w.k.data());
      pack_columns_as_b(head_columns(P.q, b, h), meta.Tq, meta.D, P.tqp(), P.dp(), w.qt.data());
      pack_columns_as_a(head_columns(P.v, b, h), meta.Tk, meta.D, P.tkp(), P.dp(), w.vt.data());
      for (std::int64_t i0 = 0; i0 < meta.Tq; i0 += kBlockQ)
        forward_query_block<Blocks, Tile>(t, P, O, w, b, h, i0, std::min(kBlockQ, meta.Tq - i0));
    }
  t.end();
}

}  // namespace attograd::cpu::attention_bf16
