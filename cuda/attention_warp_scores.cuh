#pragma once
// A warp's 16 rows of attention scores held in mma.sync accumulators, as both
// tensor-core attentions keep them (cuda/attention_tensor_core.cu, float32 in
// 3xTF32; cuda/attention_bf16.cu, bfloat16): the layout, hiding keys, the
// online softmax over a tile of keys and its end. The accumulator layout is
// the same for m16n8k8 and m16n8k16 (cuda/mma.cuh): lane (g, t) = (lane / 4,
// lane % 4) holds rows g and g + 8 and, of each 8-column block n, columns
// 2t and 2t + 1, as s[n][0..3] = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
// So a row's max and sum are the lane's own values and then two shuffles
// within its quad of lanes. Included by those two files, and by
// cuda/attention_bf16_flash.cu for quad_reduce.
#include <cmath>
#include <cstdint>

#include "cuda/attention_common.cuh"

namespace attograd::cuda::attention_detail {

// Both divide the work so: a block of 4 warps owns 64 rows of one (b, h)
// (queries; keys in the dK/dV kernels), each warp 16, and tiles of the other
// side stream through shared memory, 64 rows at a time in the forward and 32
// in the backward, whose kernels keep four accumulators live.
constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * kWarp;
constexpr int kWarpRows = 16;                   // one mma tile's height
constexpr int kBlockRows = kWarps * kWarpRows;  // 64
constexpr int kForwardTile = 64;                // keys per streamed tile in the forward
constexpr int kBackwardTile = 32;               // keys (queries) per tile in the backward

// The row (of the warp's 16) and the column (of the tile) of accumulator value
// acc[n][r] of lane (g, t).
__device__ __forceinline__ int acc_row(int g, int r) { return g + 8 * (r / 2); }
__device__ __forceinline__ int acc_col(int t, int n, int r) { return 8 * n + 2 * t + r % 2; }

// Reduces v with op over the 4 lanes of a quad (the lanes that share an accumulator row).
template <typename Op>
__device__ __forceinline__ float quad_reduce(float v, Op op) {
  v = op(v, __shfl_xor_sync(kFullMask, v, 1));
  return op(v, __shfl_xor_sync(kFullMask, v, 2));
}

// The running softmax of a warp's rows g and g + 8 (index `half` 0 and 1):
// max m and sum l of exp(s - m) over the keys seen so far.
struct RunningSoftmax {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {};
};

// One tile of NC * 8 keys from j0 for the warp's rows from w0: scores s
// (scale included) become exp(s - m) times the dropout factors, in place, and
// o (the running sum of p v) is rescaled to the new max. Hidden keys weigh
// zero. The max lets any NaN win, so the 4 lanes of a row agree on it, as the
// CPU's NaN row is all NaN.
template <int NC, int ND, typename P>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NC][4], float (&o)[ND][4], RunningSoftmax& run,
                                                    const P& p, std::int64_t b, std::int64_t h, std::int64_t w0,
                                                    std::int64_t j0, int g, int t) {
  const float neg_inf = -INFINITY;
  const bool some_hidden = p.mask || j0 + 8 * NC > p.Tk || w0 + 16 > p.Tq || (p.causal && j0 + 8 * NC - 1 > w0);
  if (some_hidden) {
#pragma unroll
    for (int n = 0; n < NC; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (p.hidden(b, h, w0 + acc_row(g, r), j0 + acc_col(t, n, r))) s[n][r] = neg_inf;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float tile_max = neg_inf;
#pragma unroll
    for (int n = 0; n < NC; ++n) tile_max = NanMaxOp{}(tile_max, NanMaxOp{}(s[n][2 * half], s[n][2 * half + 1]));
    const float m_new = NanMaxOp{}(run.m[half], quad_reduce(tile_max, NanMaxOp{}));
    const bool none_visible = m_new == neg_inf;                                // so far: no exp(-inf - -inf)
    const float correction = none_visible ? 1.0f : expf(run.m[half] - m_new);  // 0 while m was -inf
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NC; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& e = s[n][2 * half + c];
        e = none_visible ? 0.0f : expf(e - m_new);  // 0 for hidden keys
        sum += e;
        if (p.dropout() && e != 0.0f) e *= p.dropout_factor(b, h, w0 + g + 8 * half, j0 + acc_col(t, n, 2 * half + c));
      }
    run.l[half] = run.l[half] * correction + quad_reduce(sum, SumOp{});
    run.m[half] = m_new;
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][2 * half] *= correction, o[n][2 * half + 1] *= correction;
  }
}

// The end of a warp's rows: their log-sum-exp written to lse (B, H, Tq) at
// row bh, -inf where every key was hidden, and the factors 1 / l its output
// rows are scaled by, 0 on those rows (zeros, not 0/0).
template <typename P>
__device__ __forceinline__ void finish_softmax(const RunningSoftmax& run, const P& p, std::int64_t bh, std::int64_t w0,
                                               int g, int t, float* lse, float (&inv)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    inv[half] = run.l[half] == 0.0f ? 0.0f : 1.0f / run.l[half];
    const std::int64_t i = w0 + g + 8 * half;
    if (i < p.Tq && t == 0) lse[bh * p.Tq + i] = run.l[half] == 0.0f ? -INFINITY : run.m[half] + logf(run.l[half]);
  }
}

// ---- backward (attention_common.cuh's formulas, pair_grads) ----------------------------------

// The backward's terms of the warp's rows g and g + 8 (index `half`) from w0
// of (b, h) = bh: lse and delta, -inf and 0 past Tq.
struct RowTerms {
  float lse[2], delta[2];
};
template <typename P>
__device__ __forceinline__ RowTerms row_terms(const P& p, const float* lse, const float* delta, std::int64_t bh,
                                              std::int64_t w0, int g) {
  RowTerms terms;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t i = w0 + g + 8 * half;
    terms.lse[half] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
    terms.delta[half] = i < p.Tq ? delta[bh * p.Tq + i] : 0.0f;
  }
  return terms;
}

// The dQ kernels' tile: the warp's queries from w0 by keys from j0. s (their
// scores, times score_scale to include the scale) becomes scale dS, from dpv = do_i . v_j.
template <int NC, typename P>
__device__ __forceinline__ void scores_to_ds(float (&s)[NC][4], const float (&dpv)[NC][4], const P& p,
                                             std::int64_t b, std::int64_t h, std::int64_t w0, std::int64_t j0,
                                             int g, int t, const RowTerms& terms, float score_scale) {
#pragma unroll
  for (int n = 0; n < NC; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      s[n][r] = pair_grads(p, b, h, w0 + acc_row(g, r), j0 + acc_col(t, n, r), score_scale * s[n][r], dpv[n][r],
                           terms.lse[r / 2], terms.delta[r / 2])
                    .ds;
}

// The dK/dV kernels' tile, transposed: the warp's keys from w0 by queries
// from q0, whose lse and delta are lse_q and delta_q. s (q_i . k_j without the
// scale) becomes P Z, and dpv (do_i . v_j) scale dS.
template <int NC, typename P>
__device__ __forceinline__ void transposed_pair_grads(float (&s)[NC][4], float (&dpv)[NC][4], const P& p,
                                                      std::int64_t b, std::int64_t h, std::int64_t q0, std::int64_t w0,
                                                      int g, int t, const float* lse_q, const float* delta_q) {
#pragma unroll
  for (int n = 0; n < NC; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int ii = acc_col(t, n, r);
      const PairGrads pg =
          pair_grads(p, b, h, q0 + ii, w0 + acc_row(g, r), p.scale * s[n][r], dpv[n][r], lse_q[ii], delta_q[ii]);
      s[n][r] = pg.pz, dpv[n][r] = pg.ds;
    }
}

// Writes the warp's 16 x DMax accumulator rows to rows [w0, w0 + 16) of
// `rows` (store(i, d, value)), those below `count` and columns below D, the
// values of rows g and g + 8 times factor[0] and factor[1].
template <int DMax, typename Store>
__device__ __forceinline__ void store_accumulator_rows(const float (&acc)[DMax / 8][4], std::int64_t w0,
                                                       std::int64_t count, std::int64_t D, int g, int t,
                                                       const float (&factor)[2], Store store) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t i = w0 + g + 8 * half;
    if (i >= count) continue;
#pragma unroll
    for (int n = 0; n < DMax / 8; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = 8 * n + 2 * t + c;
        if (d < D) store(i, d, acc[n][2 * half + c] * factor[half]);
      }
  }
}

}  // namespace attograd::cuda::attention_detail
