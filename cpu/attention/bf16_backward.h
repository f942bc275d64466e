#pragma once
// The bfloat16 backward, a head at a time in FlashAttention-2's order (key
// tiles outside, query blocks inside), recomputing P from the forward's
// float32 log-sum-exp. With the head's operands packed once, per tile:
//   S^T = K Q^T, dP^T = V dO^T                        (tiles)
//   P = exp(scale S - lse), dS = scale P (dP Z - delta) (float32; delta_i = do_i . o_i)
//   dV += (P Z)^T dO, dK += dS^T Q, dQ^T += K^T dS^T   (tiles; P Z and dS rounded)
// the float32 backward's formulas (cpu/attention/backward.h) on the
// tile layout of bf16_tiles.h. Part of the translation unit
// cpu/attention/attention_bf16.cpp.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/attention/bf16_problem.h"
#include "cpu/attention/bf16_tiles.h"
#include "cpu/attention/masking.h"
#include "cpu/attention/vectors.h"
#include "cpu/parallel.h"

namespace attograd::cpu::attention_bf16 {

struct BackwardIo {
  AttentionRows<const bfloat16> dout, out;  // (B, H, Tq, D)
  const float* lse;                          // (B, H, Tq)
  AttentionRows<bfloat16> dq, dk, dv;        // (B, H, T, D)
};

// Scratch of one thread.
struct BackwardScratch {
  std::int64_t ldq;                  // row stride of dqt: Tqp and a line more (rows 4 KiB apart share L1 sets)
  Scratch<bfloat16> k, v;            // (Tkp, Dp) packed A: keys, values
  Scratch<bfloat16> qt, dout_t;      // (Dp, Tqp) B panels: queries and do transposed
  Scratch<bfloat16> q_b, dout_b;     // (Tqp, Dp) B panels: queries, do
  Scratch<bfloat16> kt;              // (Dp, Tkp) packed A: keys transposed
  Scratch<bfloat16> p_a, ds_a, ds_b;  // (kBlockK, kBlockQ) the tile's P^T Z and dS^T as A, dS^T as B panels
  Scratch<float> s, dp, z;           // (kBlockK, kBlockQ) S^T then P^T Z; dP^T then dS^T; dropout factors
  Scratch<float> dk, dv;             // (kBlockK, Dp) accumulators of a key tile
  Scratch<float> dqt;                // (Dp, ldq) dQ^T of the head
  Scratch<float> delta, shift;       // (Tqp) do_i . o_i; lse_i, +inf where every key is hidden and past Tq
  Scratch<float> z_row;              // (kBlockK)
  explicit BackwardScratch(const Bf16Problem& P)
      : ldq(P.tqp() + 16), k(P.tkp() * P.dp()), v(P.tkp() * P.dp()), qt(P.dp() * P.tqp()), dout_t(P.dp() * P.tqp()),
        q_b(P.tqp() * P.dp()), dout_b(P.tqp() * P.dp()), kt(P.dp() * P.tkp()), p_a(kBlockK * kBlockQ),
        ds_a(kBlockK * kBlockQ), ds_b(kBlockK * kBlockQ), s(kBlockK * kBlockQ), dp(kBlockK * kBlockQ),
        z(kBlockK * kBlockQ), dk(kBlockK * P.dp()), dv(kBlockK * P.dp()), dqt(P.dp() * ldq), delta(P.tqp()),
        shift(P.tqp()), z_row(kBlockK) {}
};

// The head's operands packed, and its per-query terms delta and shift.
AG_ALWAYS_INLINE void backward_head_setup(const Bf16Problem& P, const BackwardIo& io, BackwardScratch& w, std::int64_t b,
                                std::int64_t h) {
  const attention_detail::Problem<float>& meta = P.meta;
  const std::int64_t D = meta.D, Tq = meta.Tq, Tk = meta.Tk, Dp = P.dp(), Tqp = P.tqp(), Tkp = P.tkp();
  pack_rows_as_a(head_rows(P.k, b, h), Tk, D, Tkp, Dp, w.k.data());
  pack_rows_as_a(head_rows(P.v, b, h), Tk, D, Tkp, Dp, w.v.data());
  pack_columns_as_a(head_columns(P.k, b, h), Tk, D, Tkp, Dp, w.kt.data());
  pack_columns_as_b(head_columns(P.q, b, h), Tq, D, Tqp, Dp, w.qt.data());
  pack_columns_as_b(head_columns(io.dout, b, h), Tq, D, Tqp, Dp, w.dout_t.data());
  pack_rows_as_b(head_rows(P.q, b, h), Tq, D, Tqp, Dp, w.q_b.data());
  pack_rows_as_b(head_rows(io.dout, b, h), Tq, D, Tqp, Dp, w.dout_b.data());
  const float* lse = io.lse + (b * meta.H + h) * Tq;
  for (std::int64_t r = 0; r < Tqp; ++r) {
    // kLanes partial sums, added at the end: one chain of D dependent
    // multiply-adds per row took a tenth of the backward at D = 64.
    constexpr std::int64_t kLanes = 16;
    float partial[kLanes] = {};
    if (r < Tq) {
      const bfloat16* d_o = io.dout.row(b, h, r);
      const bfloat16* o = io.out.row(b, h, r);
      for (std::int64_t d0 = 0; d0 < D; d0 += kLanes)
        for (std::int64_t d = d0; d < std::min(d0 + kLanes, D); ++d)
          partial[d - d0] += static_cast<float>(d_o[d]) * static_cast<float>(o[d]);
    }
    float sum = 0;
    for (float x : partial) sum += x;
    w.delta[r] = sum;
    w.shift[r] = r < Tq && lse[r] != kNegInf ? lse[r] : -kNegInf;
  }
  std::fill(w.dqt.begin(), w.dqt.end(), 0.0f);
}

// The float32 part of one tile, its first kk keys and kq queries: S^T and dP^T
// (in w.s, w.dp) to P^T Z and dS^T, rounded into the next products' operands.
template <typename Tile>
AG_ALWAYS_INLINE void backward_tile_softmax(const Bf16Problem& P, BackwardScratch& w, std::int64_t b, std::int64_t h,
                                            std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk,
                                            std::int64_t diag) {
  const std::int64_t kk = tile_extent(nk), kq = tile_extent(nq);
  using attention_detail::TileRows;
  using Vec = typename attention_detail::Simd<float, Tile::kBytes>::Vec;
  constexpr std::int64_t W = attention_detail::Simd<float, Tile::kBytes>::kLanes;
  const attention_detail::Problem<float>& meta = P.meta;
  float* __restrict s = w.s.data();
  float* __restrict dp = w.dp.data();
  float* __restrict z = w.z.data();
  attention_detail::hide_causal<TileRows::keys>(s, kBlockQ, kk, nk, kq, diag, kNegInf);
  attention_detail::hide_masked<TileRows::keys>(meta, b, h, i0, nq, j0, nk, s, kBlockQ);
  attention_detail::hide_causal<TileRows::keys>(dp, kBlockQ, kk, nk, kq, diag, 0.0f);
  if (meta.dropout()) {
    std::fill(z, z + kBlockK * kBlockQ, 0.0f);
    attention_detail::dropout_tile<TileRows::keys>(meta, b, h, i0, nq, j0, nk, w.z_row.data(), z, kBlockQ);
  }
  const float* __restrict delta = w.delta.data() + i0;
  const float* __restrict shift = w.shift.data() + i0;
  for (std::int64_t c = 0; c < kk; ++c)
    for (std::int64_t r = 0; r < kq; r += W) {
      const std::int64_t x = c * kBlockQ + r;
      Vec sv, dpv, delta_r, shift_r;
      attention_detail::load(sv, s + x);
      attention_detail::load(dpv, dp + x);
      attention_detail::load(delta_r, delta + r);
      attention_detail::load(shift_r, shift + r);
      Vec p = sv * meta.scale - shift_r;  // -inf where hidden or where the row has no softmax
      attention_detail::exp_softmax(p);
      if (meta.dropout()) {
        Vec zv;
        attention_detail::load(zv, z + x);
        attention_detail::store(dp + x, meta.scale * p * (dpv * zv - delta_r));
        attention_detail::store(s + x, p * zv);
      } else {
        attention_detail::store(dp + x, meta.scale * p * (dpv - delta_r));
        attention_detail::store(s + x, p);
      }
    }
  round_tile_as_a<Tile>(s, kk, kq, w.p_a.data());
  round_tile_as_a<Tile>(dp, kk, kq, w.ds_a.data());
  round_tile_as_b<Tile>(dp, kk, kq, w.ds_b.data());
}

// Key tile [j0, j0 + nk) of head (b, h): its dk and dv rows, and its share of dQ^T.
template <typename Blocks, typename Tile>
AG_ALWAYS_INLINE void backward_key_tile(Blocks& t, const Bf16Problem& P, const BackwardIo& io, BackwardScratch& w,
                                        std::int64_t b, std::int64_t h, std::int64_t j0) {
  const attention_detail::Problem<float>& meta = P.meta;
  const std::int64_t D = meta.D, Tq = meta.Tq, Dp = P.dp(), Tqp = P.tqp(), Tkp = P.tkp();
  const std::int64_t nk = std::min(kBlockK, meta.Tk - j0), kk = tile_extent(nk);
  float* __restrict dk = w.dk.data();
  float* __restrict dv = w.dv.data();
  std::fill(dk, dk + kBlockK * Dp, 0.0f);
  std::fill(dv, dv + kBlockK * Dp, 0.0f);
  for (std::int64_t i0 = attention_detail::first_query_tile(meta, j0); i0 < Tq; i0 += kBlockQ) {
    const std::int64_t nq = std::min(kBlockQ, Tq - i0), kq = tile_extent(nq), diag = diagonal(P, i0, j0);
    for (std::int64_t kb = 0; kb < kk; kb += kBlock)
      for (std::int64_t qb = 0; qb < kq; qb += kBlock) {
        if (block_hidden(kb, qb, diag)) continue;
        const std::int64_t x = kb * kBlockQ + qb;
        t.block(a_block(w.k.data(), j0 + kb, 0, Dp), b_panel(w.qt.data(), i0 + qb, 0, Dp),
                b_panel(w.qt.data(), i0 + qb + kPanel, 0, Dp), Dp / kKStep, w.s.data() + x, kBlockQ,
                false);  // S^T = K Q^T
        t.block(a_block(w.v.data(), j0 + kb, 0, Dp), b_panel(w.dout_t.data(), i0 + qb, 0, Dp),
                b_panel(w.dout_t.data(), i0 + qb + kPanel, 0, Dp), Dp / kKStep, w.dp.data() + x, kBlockQ,
                false);  // dP^T = V dO^T
      }
    backward_tile_softmax<Tile>(P, w, b, h, i0, nq, j0, nk, diag);
    for (std::int64_t kb = 0; kb < kk; kb += kBlock)
      for (std::int64_t db = 0; db < Dp; db += kBlock) {
        t.block(a_block(w.p_a.data(), kb, 0, kBlockQ), b_panel(w.dout_b.data(), db, i0, Tqp),
                b_panel(w.dout_b.data(), db + kPanel, i0, Tqp), kq / kKStep, dv + kb * Dp + db, Dp,
                true);  // dV += (P Z)^T dO
        t.block(a_block(w.ds_a.data(), kb, 0, kBlockQ), b_panel(w.q_b.data(), db, i0, Tqp),
                b_panel(w.q_b.data(), db + kPanel, i0, Tqp), kq / kKStep, dk + kb * Dp + db, Dp,
                true);  // dK += dS^T Q
      }
    for (std::int64_t db = 0; db < Dp; db += kBlock)
      for (std::int64_t qb = 0; qb < kq; qb += kBlock)
        t.block(a_block(w.kt.data(), db, j0, Tkp), b_panel(w.ds_b.data(), qb, 0, kBlockK),
                b_panel(w.ds_b.data(), qb + kPanel, 0, kBlockK), kk / kKStep,
                w.dqt.data() + db * w.ldq + i0 + qb, w.ldq, true);  // dQ^T += K^T dS^T
  }
  for (std::int64_t c = 0; c < nk; ++c) {
    round_to_bf16(&io.dk.row(b, h, j0 + c)->bits, dk + c * Dp, D);
    round_to_bf16(&io.dv.row(b, h, j0 + c)->bits, dv + c * Dp, D);
  }
}

// The backward of the heads b * H + h the queue hands this thread.
template <typename Blocks, typename Tile>
AG_ALWAYS_INLINE void backward_heads(Blocks& t, const Bf16Problem& P, const BackwardIo& io, TaskQueue& heads) {
  const attention_detail::Problem<float>& meta = P.meta;
  BackwardScratch w(P);
  t.begin();
  for (std::int64_t lo, hi; heads.next(lo, hi);)
    for (std::int64_t bh = lo; bh < hi; ++bh) {
      const std::int64_t b = bh / meta.H, h = bh % meta.H;
      backward_head_setup(P, io, w, b, h);
      for (std::int64_t j0 = 0; j0 < meta.Tk; j0 += kBlockK) backward_key_tile<Blocks, Tile>(t, P, io, w, b, h, j0);
      round_transposed<Tile>(w.dqt.data(), w.ldq, meta.D, meta.Tq, nullptr, io.dq.row(b, h, 0), io.dq.st);
    }
  t.end();
}

}  // namespace attograd::cpu::attention_bf16
