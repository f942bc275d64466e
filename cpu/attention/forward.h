#pragma once
// The forward: one query block of one head at a time, key tile by key tile
// with an online softmax. Part of the one translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cmath>
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
#include "cpu/vec_math.h"
#include "cpu/parallel.h"

namespace attograd::cpu::attention_detail {

template <typename T>
struct ForwardOutputs {
  T* out;      // (B, Tq, H, D)
  T* lse;      // (B, H, Tq)
  T* weights;  // (B, H, Tq, Tk), or nullptr
  SavedProbs<T> saved;  // data == nullptr: none kept
};

// The keys and values of one head, rows [0, rows) copied compact (Dp wide,
// zero-padded), for a forward that would otherwise copy them tile by tile:
// each query block of a head reads every key tile up to its diagonal, so
// copies per tile and block copy each key about Tq / 128 times, and HeadRows
// once per thread that takes the head. A thread keeps the head of its last
// task and extends it a tile at a time, as its tasks reach further keys (it
// takes a head's blocks in a row, mostly).
template <typename T>
struct HeadRows {
  std::int64_t b = -1, h = -1, rows = 0;
  Scratch<T> k, v;  // (round_up(Tk, kBlockK), Dp)
};

// Whether HeadRows pays: keys or values that are not read in place (padded,
// or strided on a long head), and small enough to keep per thread.
constexpr std::int64_t kHeadRowsMaxBytes = 16 << 20;
template <typename T>
bool use_head_rows(const Problem<T>& P, std::int64_t Dp) {
  const bool in_place =
      read_in_place(P.k.st, P.Tk, P.Tk, P.D, Dp, P.Tq) && read_in_place(P.v.st, P.Tk, P.Tk, P.D, Dp, P.Tq);
  return !in_place && 2 * round_up(P.Tk, kBlockK) * Dp * std::int64_t(sizeof(T)) <= kHeadRowsMaxBytes;
}

// Makes `head` hold (b, h)'s rows [0, end), end <= round_up(Tk, kBlockK);
// rows at Tk and past are zeros.
template <typename T>
AG_ALWAYS_INLINE void hold_head_rows(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t end,
                                     std::int64_t Dp, HeadRows<T>& head) {
  if (head.b != b || head.h != h) head.b = b, head.h = h, head.rows = 0;
  if (end <= head.rows) return;
  const std::int64_t t0 = head.rows, n = std::max<std::int64_t>(0, std::min(end, P.Tk) - t0);
  copy_compact(P.k, b, h, t0, n, end - t0, P.D, Dp, head.k.data() + t0 * Dp);
  copy_compact(P.v, b, h, t0, n, end - t0, P.D, Dp, head.v.data() + t0 * Dp);
  head.rows = end;
}

// Scratch of one thread. Dp is D rounded up to the vector width.
template <typename T>
struct ForwardScratch {
  Scratch<T> qt;             // (D, kBlockQ) scale * queries of the block, transposed
  Scratch<T> k, v;           // (kBlockK, Dp) keys and values of a tile, when not read_in_place
  HeadRows<T> head;          // when use_head_rows
  Scratch<T> s;              // (kBlockK, kBlockQ) S^T, then P^T
  Scratch<T> z;              // (kBlockK, kBlockQ) dropout factors
  Scratch<T> acc;            // (kBlockQ, Dp) unnormalised output
  Scratch<T> m, l, rescale;  // (kBlockQ) running max and sum of exp(s - m); exp(m_old - m_new)
  Scratch<T> shift, z_row;   // (kBlockQ), (kBlockK)
  bool from_head;
  ForwardScratch(const Problem<T>& P, std::int64_t Dp)
      : qt(P.D * kBlockQ), k(kBlockK * Dp), v(kBlockK * Dp), s(kBlockK * kBlockQ), z(kBlockK * kBlockQ),
        acc(kBlockQ * Dp), m(kBlockQ), l(kBlockQ), rescale(kBlockQ), shift(kBlockQ), z_row(kBlockK),
        from_head(use_head_rows(P, Dp)) {
    if (from_head) head.k.resize(round_up(P.Tk, kBlockK) * Dp), head.v.resize(round_up(P.Tk, kBlockK) * Dp);
  }
  // Keys (or values) [j0, j0 + nk) as rows_panel gives them, from `head` when from_head.
  Panel<T> keys(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk,
                std::int64_t n_padded, std::int64_t Dp) {
    if (from_head) return {head.k.data() + j0 * Dp, Dp};
    return rows_panel(P.k, b, h, j0, nk, n_padded, P.D, Dp, P.Tq, k.data());
  }
  Panel<T> values(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk,
                  std::int64_t Dp) {
    if (from_head) return {head.v.data() + j0 * Dp, Dp};
    return rows_panel(P.v, b, h, j0, nk, nk, P.D, Dp, P.Tq, v.data());
  }
};

// One key tile of the online softmax, over its score tile s (keys c < nk,
// queries r < nq, rows kBlockQ apart), in place: with m the running max and l
// the running sum of exp(s - m) of each query,
//   m_new = max(m, max_c s[c]);  rescale = exp(m - m_new);  l = rescale l + sum_c exp(s[c] - m_new);
//   s[c] = exp(s[c] - m_new), the tile's P^T.
// A few vectors of queries at a time, whose max, shift and sum stay in
// registers down the whole tile (rather than a pass for the max and a load
// and store of l per score). A query that sees no key yet keeps m = -inf,
// l = 0 and rescale = 1.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void online_softmax_tile(T* __restrict s, std::int64_t nk, std::int64_t nq, T* __restrict m,
                                          T* __restrict l, T* __restrict rescale) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes;
  // Vectors of queries at a time: 3 registers each, beside the exponential's
  // temporaries and constants (AVX-512 has 32 registers, the others 16).
  constexpr int kVecs = Tile::kBytes == 64 ? 4 : 2;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t r0 = 0; r0 < nq; r0 += kVecs * W) {
    const int vecs = static_cast<int>(std::min<std::int64_t>(kVecs, (nq - r0) / W));
    Vec mx[kVecs], shift[kVecs] = {}, sum[kVecs] = {};
#pragma GCC unroll 4
    for (int u = 0; u < kVecs; ++u) mx[u] = Vec{} + neg_inf;
    for (std::int64_t c = 0; c < nk; ++c)
#pragma GCC unroll 4
      for (int u = 0; u < kVecs; ++u)
        if (u < vecs) {
          Vec x;
          load(x, s + c * kBlockQ + r0 + u * W);
          mx[u] = x > mx[u] ? x : mx[u];
        }
#pragma GCC unroll 4
    for (int u = 0; u < kVecs; ++u)
      if (u < vecs) {
        const std::int64_t r = r0 + u * W;
        Vec m_old, l_old;
        load(m_old, m + r);
        load(l_old, l + r);
        const Vec m_new = mx[u] > m_old ? mx[u] : m_old;
        const auto none = m_new == neg_inf;  // nothing visible to this query yet: keep everything at 0
        Vec factor = m_old - m_new;
        exp_softmax(factor);
        factor = none ? Vec{} + T(1) : factor;
        shift[u] = none ? Vec{} : m_new;
        sum[u] = l_old * factor;
        store(rescale + r, factor);
        store(m + r, m_new);
      }
    for (std::int64_t c = 0; c < nk; ++c)
#pragma GCC unroll 4
      for (int u = 0; u < kVecs; ++u)
        if (u < vecs) {
          T* sc = s + c * kBlockQ + r0 + u * W;
          Vec x;
          load(x, sc);
          x -= shift[u];
          exp_softmax(x);
          store(sc, x);
          sum[u] += x;
        }
#pragma GCC unroll 4
    for (int u = 0; u < kVecs; ++u)
      if (u < vecs) store(l + r0 + u * W, sum[u]);
  }
}

// Forward over queries [i0, i0 + nq) of (b, h). Per query it keeps a running
// max m, a running sum l of exp(s - m) and an accumulator of the (dropped)
// weights times v, rescaled whenever m grows. With weights asked for, a
// second pass writes the rows' softmax (before dropout) from the final
// log-sum-exp.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void forward_query_block(const Problem<T>& P, const ForwardOutputs<T>& O, ForwardScratch<T>& w,
                                          std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                                          PrefetchQueue<T>& successor) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes, MR = Tile::kRows;
  // Queries are padded to whole vectors (score columns) and whole row groups (rows of the output).
  constexpr std::int64_t QP = std::max<std::int64_t>(W, MR);
  constexpr TileRows kKeyRows = TileRows::keys;  // S^T: queries along the vector lanes
  const std::int64_t D = P.D, Dp = round_up(D, W), nqp = round_up(nq, QP);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  T* __restrict s = w.s.data();
  T* __restrict acc = w.acc.data();
  T* __restrict m = w.m.data();
  T* __restrict l = w.l.data();
  T* __restrict rescale = w.rescale.data();
  T* __restrict shift = w.shift.data();
  pack_transposed<T, Tile>(P.q, b, h, i0, nq, nqp, D, kBlockQ, P.scale, w.qt.data());
  std::fill(acc, acc + nqp * Dp, T(0));
  std::fill(m, m + nqp, neg_inf);
  std::fill(l, l + nqp, T(0));
  // Causal: keys past the block's last query are hidden from every query, so those key tiles are skipped.
  const std::int64_t key_end = P.visible_end(i0 + nq - 1);
  const std::int64_t tiles = (key_end + kBlockK - 1) / kBlockK;
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0), nkp = round_up(nk, MR);
    const std::int64_t diag = diagonal(P, i0, j0);
    if (w.from_head) hold_head_rows(P, b, h, j0 + nkp, Dp, w.head);
    // The next key tile is not requested ahead (prefetch.h says why).
    successor.request((successor.rows() + tiles - 1) / tiles);
    const Panel<T> k = w.keys(P, b, h, j0, nk, nkp, Dp);
    const Panel<T> v = w.values(P, b, h, j0, nk, Dp);
    // The score tile: the saved one itself where the probabilities are kept,
    // written as it is made (copying it from scratch afterwards cost more).
    // Keeping them makes the forward a little longer, for the stores alone:
    // requesting the next tile's lines ahead did not shorten it.
    const std::int64_t bh = b * P.H + h, qb = i0 / kBlockQ, kb = j0 / kBlockK;
    T* __restrict st = O.saved.kept(bh) ? O.saved.tile(bh, qb, kb) : s;
    product_scores<T, Tile, kKeyRows>(nkp, nqp, D, k.data, k.ld, w.qt.data(), kBlockQ, st, kBlockQ, diag);  // S^T
    hide_causal<kKeyRows>(st, kBlockQ, nkp, nk, nqp, diag, neg_inf);
    hide_masked<kKeyRows>(P, b, h, i0, nq, j0, nk, st, kBlockQ);
    online_softmax_tile<T, Tile>(st, nkp, nqp, m, l, rescale);
    if (O.saved.kept(bh)) std::copy(m, m + nqp, O.saved.tile_max(bh, qb, kb));
    const T* weights_tile = st;  // P^T, or P^T Z with dropout
    if (P.dropout()) {
      T* __restrict z = w.z.data();
      dropout_tile<kKeyRows>(P, b, h, i0, nq, j0, nk, w.z_row.data(), z, kBlockQ);
      for (std::int64_t c = 0; c < nk; ++c)
        for (std::int64_t r = 0; r < nqp; ++r) z[c * kBlockQ + r] *= st[c * kBlockQ + r];
      weights_tile = z;
    }
    accumulate_queries<T, Tile, kKeyRows>(nqp, Dp, nk, weights_tile, kBlockQ, v.data, v.ld, acc, Dp, diag,
                                          Into::rescale_and_accumulate, rescale);  // acc = rescale acc + P v
  }
  T* lse = O.lse + (b * P.H + h) * P.Tq + i0;
  for (std::int64_t r = 0; r < nq; ++r) {
    T* o = O.out + ((b * P.Tq + i0 + r) * P.H + h) * D;
    if (l[r] == T(0)) {  // every key hidden: zeros, not 0/0
      std::fill(o, o + D, T(0));
      lse[r] = neg_inf;
      continue;
    }
    const T inv = T(1) / l[r];
    for (std::int64_t d = 0; d < D; ++d) o[d] = acc[r * Dp + d] * inv;
    lse[r] = m[r] + std::log(l[r]);
  }
  if (!O.weights) return;
  // The weights w[i][j] = exp(s_ij - lse_i), zero where hidden and on rows with every key hidden.
  const std::int64_t Tk = P.Tk;
  T* weights = O.weights + ((b * P.H + h) * P.Tq + i0) * Tk;
  std::fill(weights, weights + nq * Tk, T(0));
  for (std::int64_t r = 0; r < nqp; ++r) shift[r] = r < nq && lse[r] != neg_inf ? lse[r] : -neg_inf;
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0), nkp = round_up(nk, MR);
    const std::int64_t diag = diagonal(P, i0, j0);
    const Panel<T> k = w.keys(P, b, h, j0, nk, nkp, Dp);
    product_scores<T, Tile, kKeyRows>(nkp, nqp, D, k.data, k.ld, w.qt.data(), kBlockQ, s, kBlockQ, diag);
    hide_causal<kKeyRows>(s, kBlockQ, nkp, nk, nqp, diag, neg_inf);
    hide_masked<kKeyRows>(P, b, h, i0, nq, j0, nk, s, kBlockQ);
    for (std::int64_t c = 0; c < nk; ++c) {
      T* __restrict sc = s + c * kBlockQ;
      for (std::int64_t r = 0; r < nqp; r += W) {
        Vec x, shift_r;
        load(x, sc + r);
        load(shift_r, shift + r);
        x -= shift_r;
        exp_softmax(x);
        store(sc + r, x);
      }
      for (std::int64_t r = 0; r < nq; ++r) weights[r * Tk + j0 + c] = sc[r];
    }
  }
}

// Forward tasks of B * H * (query blocks), as the queue hands them to this
// thread. Within a head the blocks are visited outside-in (0, n-1, 1, n-2,
// ...): under a causal mask block i costs i + 1 tiles, and this order mixes
// cheap and dear tasks all along, so the last ones handed out are not all
// dear.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void forward_tasks(const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) {
  ForwardScratch<T> scratch(P, round_up(P.D, Simd<T, Tile::kBytes>::kLanes));
  const std::int64_t blocks = (P.Tq + kBlockQ - 1) / kBlockQ;
  auto first_query = [&](std::int64_t task) {
    const std::int64_t n = task % blocks;
    return (n % 2 == 0 ? n / 2 : blocks - 1 - n / 2) * kBlockQ;
  };
  ClaimedTasks claimed(tasks, true);
  for (std::int64_t task, next; claimed.next(task, next);) {
    const std::int64_t bh = task / blocks, i0 = first_query(task);
    PrefetchQueue<T> successor(P.D);  // the next task's queries and first keys and values
    if (next >= 0) {
      const std::int64_t next_b = next / blocks / P.H, next_h = next / blocks % P.H;
      const std::int64_t next_i0 = first_query(next), keys = std::min(kBlockK, P.Tk);
      successor.add(P.q, next_b, next_h, next_i0, std::min(kBlockQ, P.Tq - next_i0));
      successor.add(P.k, next_b, next_h, 0, keys);
      successor.add(P.v, next_b, next_h, 0, keys);
    }
    forward_query_block<T, Tile>(P, O, scratch, bh / P.H, bh % P.H, i0, std::min(kBlockQ, P.Tq - i0), successor);
  }
}

}  // namespace attograd::cpu::attention_detail
