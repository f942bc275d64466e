#pragma once
// The backward: one head at a time, FlashAttention-2's order, from the
// forward's log-sum-exp or its saved probability tiles. Part of the one
// translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/attention/isa.h"
#include "cpu/attention/masking.h"
#include "cpu/attention/micro_kernel.h"
#include "cpu/attention/packing.h"
#include "cpu/attention/prefetch.h"
#include "cpu/attention/problem.h"
#include "cpu/attention/saved_probs.h"
#include "cpu/attention/tasks.h"
#include "cpu/attention/tiling.h"
#include "cpu/attention/vectors.h"
#include "cpu/streaming_copy.h"
#include "cpu/vec_math.h"
#include "cpu/parallel.h"

namespace attograd::cpu::attention_detail {

template <typename T>
struct BackwardIo {
  Rows<T> dout, out;  // (B, H, Tq, D)
  const T* lse;       // (B, H, Tq)
  OutRows<T> dq, dk, dv;  // (B, H, T, D): contiguous, or views of one packed (B, T, 3, H, D) gradient
  SavedProbs<T> saved;    // the forward's tiles, or none (data == nullptr): recompute them
};

// Scratch of one thread. Dp is D rounded up to the vector width, Tp is Tq
// rounded up to whole query blocks.
template <typename T>
struct BackwardScratch {
  Scratch<T> q, dout;       // (Tp, Dp) rows of q and do, when not read_in_place
  Scratch<T> dq;            // (Tp, Dp) dq accumulator, when the output cannot be used
  Scratch<T> delta, shift;  // (Tp) do_i . o_i; lse_i, +inf on rows with every key hidden
  Scratch<T> kt, vt;        // (D, kBlockK) scale * keys and values of a tile, transposed; recomputing only
  Scratch<T> dout_t;        // (Tp / kBlockQ) x (D, kBlockQ) do transposed by query block; with saved tiles only
  Scratch<T> k, v;          // (kBlockK, Dp) keys and values of a tile, when not read_in_place
  Scratch<T> dk, dv;        // (kBlockK, Dp) accumulators, when the output cannot be used
  Scratch<T> p, ds, z;      // (kBlockQ, kBlockK) P Z, dS, Z
  Scratch<T> z_row;         // (kBlockK) one query's dropout factors
  Scratch<T> correction;    // (kBlockQ) exp(m - lse) of a saved tile's queries
  BackwardScratch(std::int64_t Tp, std::int64_t D, std::int64_t Dp, bool saved, bool recomputed)
      : q(Tp * Dp), dout(Tp * Dp), dq(Tp * Dp), delta(Tp), shift(Tp), kt(recomputed ? D * kBlockK : 0),
        vt(recomputed ? D * kBlockK : 0), dout_t(saved ? D * Tp : 0), k(kBlockK * Dp), v(saved ? kBlockK * Dp : 0),
        dk(kBlockK * Dp), dv(kBlockK * Dp), p(kBlockQ * kBlockK), ds(kBlockQ * kBlockK), z(kBlockQ * kBlockK),
        z_row(kBlockK), correction(kBlockQ) {}
};

// delta_i = do_i . o_i and shift_i = lse_i (+inf where every key is hidden, and
// on padding rows up to Tp), the per-query terms of the backward. The pass
// streams o and do from memory (a long head's are not prefetched with it:
// see backward_heads), so it requests rows a few ahead, and q's for the
// tiles after it.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void backward_row_terms(const Problem<T>& P, const BackwardIo<T>& io, std::int64_t b, std::int64_t h,
                                         std::int64_t Tp, T* __restrict delta, T* __restrict shift) {
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes;
  const std::int64_t D = P.D, Tq = P.Tq;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T* lse = io.lse + (b * P.H + h) * Tq;
  constexpr std::int64_t kRowsAhead = 8;
  for (std::int64_t i = 0; i < Tp; ++i) {
    if (i + kRowsAhead < Tq) {
      prefetch_rows(io.out, b, h, i + kRowsAhead, 1, D);
      prefetch_rows(io.dout, b, h, i + kRowsAhead, 1, D);
      prefetch_rows<T, 2>(P.q, b, h, i + kRowsAhead, 1, D);
    }
    if (i >= Tq || lse[i] == neg_inf) {  // padding, or every key hidden: P = exp(s - inf) = 0
      delta[i] = 0;
      shift[i] = -neg_inf;
      continue;
    }
    const T* __restrict o = io.out.row(b, h, i);
    const T* __restrict g = io.dout.row(b, h, i);
    T lanes[W] = {};  // partial sums, so the dot product vectorises without -ffast-math
    std::int64_t d = 0;
    for (; d + W <= D; d += W)
      for (std::int64_t l = 0; l < W; ++l) lanes[l] += g[d + l] * o[d + l];
    for (std::int64_t l = 0; d < D; ++d, ++l) lanes[l] += g[d] * o[d];
    T acc = 0;
    for (T l : lanes) acc += l;
    delta[i] = acc;
    shift[i] = lse[i];
  }
}

// Where a backward accumulates rows [t0, t0 + n) of one gradient (dq of a
// head, dk or dv of a key tile): straight into the output when read_in_place
// would read its rows there (Dp wide, no padding rows, and back to back or
// accumulated into only a few times: other_rows is the length of the other
// side, whose tiles each accumulate into them once), else into compact
// scratch, copied out by finish(). Rows of a packed (B, T, 3C) gradient, 3C
// apart, fall into few L1 sets (at L, 6 KiB apart, a tile's 64 rows into 8
// of the 64), where dq, dk and dv evicted one another and the tiles'
// operands; accumulated in compact scratch they do not. Those rows are
// copied out with streaming stores (the gradient is 12 MiB at L, read next
// by the projection's backward), which plain stores would first read into
// the cache, beside the tiles' operands. The first tile that reaches a row writes it rather
// than accumulating (trimmed row groups write zeros), so only rows no tile
// reaches need zero().
template <typename T>
struct GradRows {
  T* data;
  std::int64_t ld;
  bool direct;
  bool stream;  // copied out with streaming stores: long rows that are not back to back
  GradRows(const OutRows<T>& out, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
           std::int64_t n_padded, std::int64_t D, std::int64_t Dp, std::int64_t other_rows, Scratch<T>& scratch)
      : direct(read_in_place(out.st, n, n_padded, D, Dp, other_rows)),
        stream(!direct && out.st != Dp && other_rows >= kCopyStridedFromRows) {
    data = direct ? out.row(b, h, t0) : scratch.data();
    ld = direct ? out.st : Dp;
  }
  T* row(std::int64_t r) const { return data + r * ld; }
  void zero(std::int64_t rows, std::int64_t Dp) const {
    for (std::int64_t r = 0; r < rows; ++r) std::fill(row(r), row(r) + Dp, T(0));
  }
  void finish(const OutRows<T>& out, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
              std::int64_t D) const {
    if (direct) return;
    if (!stream) {
      for (std::int64_t r = 0; r < n; ++r) std::copy(row(r), row(r) + D, out.row(b, h, t0 + r));
      return;
    }
    for (std::int64_t r = 0; r < n; ++r) streaming_copy(row(r), D, out.row(b, h, t0 + r));
    streaming_fence();
  }
};

// Where one score tile of a backward lies: key rows [j0, j0 + nk) against
// query rows [i0, i0 + nq), padded to nkp and nqp, at diagonal offset diag.
struct ScoreTile {
  std::int64_t b, h, i0, nq, nqp, j0, nk, nkp, diag;
};

// One vector of a tile's dS = scale P (dP Z - delta) into ds_at, and P Z into
// p_at (Z the dropout factors at z_at; none without dropout).
template <typename T, typename Vec>
AG_ALWAYS_INLINE void store_probabilities(T* __restrict p_at, T* __restrict ds_at, const Vec& probs, const Vec& dp,
                                          const Vec& delta, const Vec& scale, bool dropout, const T* __restrict z_at) {
  if (dropout) {
    Vec z;
    load(z, z_at);
    store(ds_at, scale * probs * (dp * z - delta));
    store(p_at, probs * z);
  } else {
    store(ds_at, scale * probs * (dp - delta));
    store(p_at, probs);
  }
}

// Recomputed tiles, queries for rows: S = q (scale k)^T and dP = do v^T from
// the key tile transposed (w.kt, w.vt), then P = exp(S - lse), dS = scale P (dP
// Z - delta) into ds and P Z into p.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void recomputed_probabilities(const Problem<T>& P, BackwardScratch<T>& w, const ScoreTile& t,
                                               const T* q_tile, std::int64_t ldq, const T* dout_tile,
                                               std::int64_t ldo, bool dropout,
                                               typename Simd<T, Tile::kBytes>::Vec scale) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes;
  constexpr TileRows kQueryRows = TileRows::queries;
  T* __restrict p = w.p.data();
  T* __restrict ds = w.ds.data();
  const T* __restrict delta = w.delta.data();
  const T* __restrict shift = w.shift.data();
  product_scores<T, Tile, kQueryRows>(t.nqp, t.nkp, P.D, q_tile, ldq, w.kt.data(), kBlockK, p, kBlockK, t.diag);  // S
  product_scores<T, Tile, kQueryRows>(t.nqp, t.nkp, P.D, dout_tile, ldo, w.vt.data(), kBlockK, ds, kBlockK,
                                      t.diag);  // do v^T
  hide_causal<kQueryRows>(p, kBlockK, t.nqp, t.nk, t.nkp, t.diag, -std::numeric_limits<T>::infinity());
  hide_causal<kQueryRows>(ds, kBlockK, t.nqp, t.nk, t.nkp, t.diag, T(0));
  hide_masked<kQueryRows>(P, t.b, t.h, t.i0, t.nq, t.j0, t.nk, p, kBlockK);
  if (dropout) {
    T* __restrict z = w.z.data();
    std::fill(z, z + t.nqp * kBlockK, T(0));
    dropout_tile<kQueryRows>(P, t.b, t.h, t.i0, t.nq, t.j0, t.nk, nullptr, z, kBlockK);
  }
  for (std::int64_t r = 0; r < t.nqp; ++r) {
    T* __restrict pr = p + r * kBlockK;
    T* __restrict dr = ds + r * kBlockK;
    const T* __restrict zr = w.z.data() + r * kBlockK;
    const Vec shift_r = Vec{} + shift[t.i0 + r], delta_r = Vec{} + delta[t.i0 + r];
    for (std::int64_t c = 0; c < t.nkp; c += W) {
      Vec x, dp;
      load(x, pr + c);
      load(dp, dr + c);
      x -= shift_r;
      exp_softmax(x);  // P_ij
      store_probabilities(pr + c, dr + c, x, dp, delta_r, scale, dropout, zr + c);
    }
  }
}

// Saved tiles, keys for rows: P^T = the forward's exp(s - m) times exp(m -
// lse) per query, dP^T = v do^T from the head's do transposed (w.dout_t), then
// dS^T and P^T Z as recomputed_probabilities makes them. between() runs after
// each row group of the dP product, to fetch the head's next saved tile.
template <typename T, typename Tile, typename Between>
AG_ALWAYS_INLINE void saved_probabilities(const Problem<T>& P, BackwardScratch<T>& w, const ScoreTile& t,
                                          const T* saved_tile, const T* saved_max, const Panel<T>& v, bool dropout,
                                          typename Simd<T, Tile::kBytes>::Vec scale, Between& between) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes;
  constexpr TileRows kKeyRows = TileRows::keys;
  T* __restrict p = w.p.data();
  T* __restrict ds = w.ds.data();
  T* __restrict z = w.z.data();
  const T* __restrict delta = w.delta.data();
  const T* __restrict shift = w.shift.data();
  T* __restrict correction = w.correction.data();
  product_scores<T, Tile, kKeyRows>(t.nkp, t.nqp, P.D, v.data, v.ld, w.dout_t.data() + t.i0 * P.D, kBlockQ, ds,
                                    kBlockQ, t.diag, between);  // dP^T = v do^T
  hide_causal<kKeyRows>(ds, kBlockQ, t.nkp, t.nk, t.nqp, t.diag, T(0));
  if (dropout) {
    std::fill(z, z + t.nkp * kBlockQ, T(0));
    dropout_tile<kKeyRows>(P, t.b, t.h, t.i0, t.nq, t.j0, t.nk, w.z_row.data(), z, kBlockQ);
  }
  for (std::int64_t r = 0; r < t.nqp; r += W) {
    Vec m, lse;
    load(m, saved_max + r);
    load(lse, shift + t.i0 + r);
    Vec x = m - lse;
    exp_softmax(x);
    store(correction + r, x);
  }
  for (std::int64_t c = 0; c < t.nkp; ++c) {
    const T* __restrict sc = saved_tile + c * kBlockQ;
    T* __restrict pc = p + c * kBlockQ;
    T* __restrict dc = ds + c * kBlockQ;
    const T* __restrict zc = z + c * kBlockQ;
    for (std::int64_t r = 0; r < t.nqp; r += W) {
      Vec x, f, dp, delta_r;
      load(x, sc + r);
      load(f, correction + r);
      load(dp, dc + r);
      load(delta_r, delta + t.i0 + r);
      x *= f;  // P_ij
      store_probabilities(pc + r, dc + r, x, dp, delta_r, scale, dropout, zc + r);
    }
  }
}

// do transposed block by block, (D, kBlockQ) each, for the saved tiles' dP^T:
// one (D, Tp) with rows 4 KiB apart (at T = 1024) made the tile product that
// reads it miss L1 on its 64 rows' shared cache sets, and the whole backward
// slower than recomputing. Read from the panel: a compact copy where do's rows
// lie apart (MultiHeadAttention's, C apart), so the transposes read contiguous rows.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void transpose_dout_blocks(const Panel<T>& dout, std::int64_t Tq, std::int64_t D, T* dout_t) {
  const Rows<T> dout_rows{dout.data, 0, 0, dout.ld};
  for (std::int64_t i0 = 0; i0 < Tq; i0 += kBlockQ)
    pack_transposed<T, Tile>(dout_rows, 0, 0, i0, std::min(kBlockQ, Tq - i0), kBlockQ, D, kBlockQ, T(1),
                             dout_t + i0 * D);
}

// Backward of (b, h), FlashAttention-2's order: for each key tile, for each
// query tile that can see it, P and dS are built, then folded into dq, dk,
// dv. With Z the dropout factors and S = (scale q) k^T:
//   forward: o_i = sum_j P_ij Z_ij v_j
//   so  dv_j += P_ij Z_ij do_i;  dP_ij = Z_ij (do_i . v_j);
//       dS_ij = P_ij (dP_ij - delta_i) with delta_i = sum_j P_ij dP_ij = do_i . o_i;
//       dq_i += scale dS_ij k_j;  dk_j += scale dS_ij q_i.
// The tiles hold scale dS, so dq and dk need no scaling afterwards.
//
// Its two paths differ in one thing, where P comes from, and so in which way
// round the tiles are kept (kRows):
// - TileRows::queries, recomputed from the forward's log-sum-exp
//   (recomputed_probabilities): queries are the tiles' rows, so S = q (scale
//   k)^T and dP = do v^T read q and do rows where they lie, and only the key
//   tile's k and v are transposed, once per tile. Kept the other way round, a
//   whole head's q and do were transposed up front, and q, do, their
//   transposes and dq (1.25 MiB at T = 1024, D = 64) no longer fit in L2 with
//   the tiles.
// - TileRows::keys, from the forward's saved tiles (SavedProbs,
//   saved_probabilities): kept the forward's way round, keys for rows, with
//   the head's do transposed once; dv += P^T do and dk += dS^T q read the tiles
//   as they lie, and dq += dS k reads them transposed, as the forward's P v does.
template <typename T, typename Tile, TileRows kRows>
AG_ALWAYS_INLINE void backward_head(const Problem<T>& P, const BackwardIo<T>& io, BackwardScratch<T>& w,
                                    std::int64_t b, std::int64_t h, PrefetchQueue<T>& successor) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr bool kSaved = kRows == TileRows::keys;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes, MR = Tile::kRows;
  // The tiles' rows come in whole row groups, their columns in whole row groups and vectors.
  constexpr std::int64_t KP = kSaved ? MR : std::max<std::int64_t>(W, MR);  // keys, and rows of dk, dv
  constexpr std::int64_t QP = kSaved ? std::max<std::int64_t>(W, MR) : MR;  // queries
  constexpr std::int64_t ld = kSaved ? kBlockQ : kBlockK;                    // a tile's row
  const std::int64_t D = P.D, Tq = P.Tq, Tk = P.Tk, Dp = round_up(D, W), Tp = round_up(Tq, kBlockQ);
  const std::int64_t bh = b * P.H + h;
  const SavedProbs<T>& saved = io.saved;
  // Read once: the tiles' stores may alias P's fields for all the compiler knows, which made it
  // reload the scale and test dropout again for every vector of the element-wise pass.
  const bool dropout = P.dropout();
  const Vec scale = Vec{} + P.scale;
  backward_row_terms<T, Tile>(P, io, b, h, Tp, w.delta.data(), w.shift.data());
  // q and do are read in whole row groups (zero padding rows).
  const std::int64_t Tqp = round_up(Tq, MR);
  const Panel<T> q = rows_panel(P.q, b, h, 0, Tq, Tqp, D, Dp, Tk, w.q.data());
  const Panel<T> dout = rows_panel(io.dout, b, h, 0, Tq, Tqp, D, Dp, Tk, w.dout.data());
  if constexpr (kSaved) transpose_dout_blocks<T, Tile>(dout, Tq, D, w.dout_t.data());
  const GradRows<T> dq(io.dq, b, h, 0, Tq, Tqp, D, Dp, Tk, w.dq);
  if (Tk == 0) dq.zero(Tqp, Dp);
  std::int64_t tiles = kSaved ? std::max<std::int64_t>(saved.per_head, 1) : 0;
  if constexpr (!kSaved)
    for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK)
      tiles += std::max<std::int64_t>(0, Tq - first_query_tile(P, j0) + kBlockQ - 1) / kBlockQ;
  const std::int64_t successor_rows_per_tile = (successor.rows() + tiles - 1) / std::max<std::int64_t>(tiles, 1);
  for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
    const std::int64_t kb = j0 / kBlockK, nk = std::min(kBlockK, Tk - j0), nkp = round_up(nk, KP);
    const std::int64_t next_nk = std::clamp<std::int64_t>(Tk - j0 - kBlockK, 0, kBlockK);
    prefetch_rows(P.k, b, h, j0 + kBlockK, next_nk, D);
    prefetch_rows(P.v, b, h, j0 + kBlockK, next_nk, D);
    if constexpr (!kSaved) {
      pack_transposed<T, Tile>(P.k, b, h, j0, nk, nkp, D, kBlockK, P.scale, w.kt.data());
      pack_transposed<T, Tile>(P.v, b, h, j0, nk, nkp, D, kBlockK, T(1), w.vt.data());
    }
    const Panel<T> k = rows_panel(P.k, b, h, j0, nk, nkp, D, Dp, Tq, w.k.data());
    const Panel<T> v = kSaved ? rows_panel(P.v, b, h, j0, nk, nkp, D, Dp, Tq, w.v.data()) : Panel<T>{};
    const GradRows<T> dk(io.dk, b, h, j0, nk, nkp, D, Dp, Tq, w.dk), dv(io.dv, b, h, j0, nk, nkp, D, Dp, Tq, w.dv);
    if (first_query_tile(P, j0) >= Tq) {
      dk.zero(nkp, Dp);
      dv.zero(nkp, Dp);
    }
    for (std::int64_t i0 = first_query_tile(P, j0); i0 < Tq; i0 += kBlockQ) {
      const std::int64_t qb = i0 / kBlockQ, nq = std::min(kBlockQ, Tq - i0);
      const ScoreTile t{b, h, i0, nq, round_up(nq, QP), j0, nk, nkp, diagonal(P, i0, j0)};
      const Into into_dkv = i0 == first_query_tile(P, j0) ? Into::overwrite : Into::accumulate;
      const Into into_dq = j0 == 0 ? Into::overwrite : Into::accumulate;
      const T* q_tile = q.data + i0 * q.ld;
      const T* dout_tile = dout.data + i0 * dout.ld;
      // With saved tiles, the head's next one, from memory, a slice after each row group of this
      // tile's first and last products: read without it, the tiles' loads stalled the AVX-512 path
      // for a tenth of its time and it gained nothing over recomputing them.
      auto next_tile = [&] {
        if constexpr (kSaved) {
          const bool last_tile = saved.index(bh, qb, kb) + 1 == (bh + 1) * saved.per_head;
          return SpanPrefetch(saved.tile(bh, qb, kb) + SavedProbs<T>::kSlotValues,
                              last_tile ? 0 : SavedProbs<T>::kSlotValues * std::int64_t(sizeof(T)),
                              nkp / MR + round_up(nq, MR) / MR);
        } else {
          return NoOp{};
        }
      }();
      auto prefetch_next_tile = [&] {  // [&]: next_tile is unused on the recomputed path
        if constexpr (kSaved) next_tile.step();
      };
      successor.request(successor_rows_per_tile);
      if constexpr (kSaved)
        saved_probabilities<T, Tile>(P, w, t, saved.tile(bh, qb, kb), saved.tile_max(bh, qb, kb), v, dropout, scale,
                                     prefetch_next_tile);
      else
        recomputed_probabilities<T, Tile>(P, w, t, q_tile, q.ld, dout_tile, dout.ld, dropout, scale);
      accumulate_keys<T, Tile, kRows>(nkp, Dp, nq, w.p.data(), ld, dout_tile, dout.ld, dv.data, dv.ld, t.diag,
                                      into_dkv);
      accumulate_keys<T, Tile, kRows>(nkp, Dp, nq, w.ds.data(), ld, q_tile, q.ld, dk.data, dk.ld, t.diag, into_dkv);
      accumulate_queries<T, Tile, kRows>(round_up(nq, MR), Dp, nk, w.ds.data(), ld, k.data, k.ld, dq.row(i0), dq.ld,
                                         t.diag, into_dq, nullptr, prefetch_next_tile);
    }
    dk.finish(io.dk, b, h, j0, nk, D);
    dv.finish(io.dv, b, h, j0, nk, D);
  }
  dq.finish(io.dq, b, h, 0, Tq, D);
}

// Backward of the heads b * H + h the queue hands this thread.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void backward_heads(const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {
  const bool saved = io.saved.heads > 0, recomputed = io.saved.heads < P.B * P.H;
  BackwardScratch<T> scratch(round_up(P.Tq, kBlockQ), P.D, round_up(P.D, Simd<T, Tile::kBytes>::kLanes), saved,
                             recomputed);
  const std::int64_t first_keys = std::min(kBlockK, P.Tk);
  const bool prefetch_successor =
      (3 * P.Tq + 2 * first_keys) * P.D * static_cast<std::int64_t>(sizeof(T)) <= kPrefetchBytes;
  ClaimedTasks claimed(heads, prefetch_successor);
  for (std::int64_t bh, next; claimed.next(bh, next);) {
    PrefetchQueue<T> successor(P.D);  // what the next head reads first: its q, do, o and first k, v rows
    if (next >= 0) {
      const std::int64_t b = next / P.H, h = next % P.H;
      successor.add(P.q, b, h, 0, P.Tq);
      successor.add(io.dout, b, h, 0, P.Tq);
      successor.add(io.out, b, h, 0, P.Tq);
      successor.add(P.k, b, h, 0, first_keys);
      successor.add(P.v, b, h, 0, first_keys);
    }
    if (io.saved.kept(bh))
      backward_head<T, Tile, TileRows::keys>(P, io, scratch, bh / P.H, bh % P.H, successor);
    else
      backward_head<T, Tile, TileRows::queries>(P, io, scratch, bh / P.H, bh % P.H, successor);
  }
}

}  // namespace attograd::cpu::attention_detail
