// Fused attention on the CPU, flash-attention style (Dao et al. 2022, 2023):
// queries and keys are processed in blocks with an online softmax, so no
// (Tq, Tk) score matrix is ever kept; the forward saves one log-sum-exp per
// query row and the backward recomputes the probabilities from it.
//
// Work is split over (batch, head, query block) in the forward and over
// (batch, head) in the backward, with parallel_for. No BLAS here: OpenBLAS
// runs its own threads and must not be called from inside ours. Instead two
// hand-written tile loops do all the products: a row against a key (or value)
// block packed transposed (D, nk), accumulating over the key index, and a
// weighted sum of rows, accumulating over the head dim. Both are contiguous
// multiply-adds into register-held chunks that the compiler vectorises; the
// float32 versions are compiled per SIMD level (AG_SIMD_CLONES) and use the
// polynomial exp of tensor/cpu/vec_math.h, float64 keeps libm's.
// Causally hidden blocks are skipped, and rows of the diagonal block stop at
// their last visible key.
//
// Masking: a key is hidden by the causal flag (j > i, top-left aligned as
// torch's is_causal) or by the boolean mask (true = hidden). A row whose keys
// are all hidden has no softmax; its output and gradients are zero and its
// log-sum-exp is -inf, which is also how the backward recognises it.
//
// Dropout reproduces the composed path exactly: weight (b, h, i, j) is
// dropped when philox_uniform(seed, offset, ((b*H + h)*Tq + i)*Tk + j) < p,
// the same function kernels::dropout_mask evaluates over the contiguous
// (B, H, Tq, Tk) weights; kept weights are scaled by 1/(1-p).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/parallel.h"
#include "tensor/rng.h"

// The per-row helpers are forced inline into the per-dtype entry points below,
// which are compiled once per SIMD level (AG_SIMD_CLONES).
#if defined(__GNUC__)
#define AG_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define AG_ALWAYS_INLINE inline
#endif

namespace attograd::cpu {
namespace {

constexpr std::int64_t kBlockQ = 64;  // query rows sharing one packed key block
constexpr std::int64_t kBlockK = 64;  // keys per block
constexpr std::int64_t kLanes = 16;   // partial sums, so float reductions vectorise without -ffast-math

// One (B, H, T, D) operand read through its strides; the last dim is contiguous.
template <typename T>
struct Rows {
  const T* base;
  std::int64_t sb, sh, st;  // strides of B, H, T in elements
  const T* row(std::int64_t b, std::int64_t h, std::int64_t t) const { return base + b * sb + h * sh + t * st; }
};

template <typename T>
Rows<T> rows_of(const Tensor& x) {
  return {x.data<T>(), x.stride(0), x.stride(1), x.stride(2)};
}

// Everything one attention problem needs, shared read-only by all threads.
template <typename T>
struct Problem {
  Rows<T> q, k, v;
  std::int64_t B, H, Tq, Tk, D;
  T scale;
  bool causal;
  const bool* mask = nullptr;  // broadcast to (B, H, Tq, Tk) through mask_strides
  std::int64_t mask_strides[4] = {0, 0, 0, 0};
  double dropout_p = 0;
  T keep_scale = 1;  // 1 / (1 - p)
  std::uint64_t seed = 0, offset = 0;

  // Keys [0, visible_end(i)) can be visible to query i.
  std::int64_t visible_end(std::int64_t i) const { return causal ? std::min(Tk, i + 1) : Tk; }
  const bool* mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return mask ? mask + b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2] : nullptr;
  }
};

// z[j] = dropout factor of weight (b, h, i, j0 + j), j < n: 0 when
// philox_uniform(seed, offset, flat) < p, else 1/(1-p). One Philox call
// serves the 4 consecutive flat indices that share its counter.
template <typename T>
AG_ALWAYS_INLINE void dropout_factors(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i,
                                      std::int64_t j0, std::int64_t n, T* z) {
  const std::uint64_t first = static_cast<std::uint64_t>(((b * P.H + h) * P.Tq + i) * P.Tk + j0);
  const float threshold = static_cast<float>(P.dropout_p);
  std::int64_t j = 0;
  while (j < n) {
    const std::uint64_t flat = first + static_cast<std::uint64_t>(j);
    const Philox4 bits = philox4x32(P.offset + flat / 4, P.seed);
    for (std::uint64_t lane = flat % 4; lane < 4 && j < n; ++lane, ++j)
      z[j] = uniform_from_bits(bits.v[lane]) < threshold ? T(0) : P.keep_scale;
  }
}

// Packs keys [j0, j0 + nk) of (b, h) transposed: kT[d * nk + j] = k[j0 + j][d].
template <typename T>
AG_ALWAYS_INLINE void pack_transposed(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t j0,
                                      std::int64_t nk, std::int64_t D, T* __restrict out) {
  for (std::int64_t j = 0; j < nk; ++j) {
    const T* __restrict row = x.row(b, h, j0 + j);
    for (std::int64_t d = 0; d < D; ++d) out[d * nk + j] = row[d];
  }
}

// The two tile loops everything below is made of. Each keeps a fixed-width
// chunk of its outputs in local accumulators (registers) across the whole
// reduction, so an inner step is one load and one multiply-add per lane,
// never a load-modify-store of the output. The reduction is split into
// kSplit interleaved partial sums: one chain of dependent multiply-adds would
// wait out the FMA latency (4 cycles) at every step.
template <typename T>
constexpr std::int64_t kChunk = 128 / sizeof(T);  // 32 floats, 16 doubles
constexpr std::int64_t kSplit = 4;

// s[w] = scale * sum_d x[d] * pT[d * ld + w] for a full chunk of W = kChunk
// columns: every index is a compile-time constant once the w loops unroll,
// so the partial sums live in registers.
template <typename T>
AG_ALWAYS_INLINE void chunk_times_packed(T* __restrict s, const T* __restrict x, const T* __restrict pT,
                                         std::int64_t ld, std::int64_t D, T scale) {
  constexpr std::int64_t W = kChunk<T>;
  T a0[W], a1[W], a2[W], a3[W];
  for (std::int64_t w = 0; w < W; ++w) a0[w] = a1[w] = a2[w] = a3[w] = T(0);
  std::int64_t d = 0;
  for (; d + kSplit <= D; d += kSplit) {
    const T* __restrict p0 = pT + d * ld;
    const T x0 = x[d], x1 = x[d + 1], x2 = x[d + 2], x3 = x[d + 3];
    for (std::int64_t w = 0; w < W; ++w) {
      a0[w] += x0 * p0[w];
      a1[w] += x1 * p0[ld + w];
      a2[w] += x2 * p0[2 * ld + w];
      a3[w] += x3 * p0[3 * ld + w];
    }
  }
  for (; d < D; ++d)
    for (std::int64_t w = 0; w < W; ++w) a0[w] += x[d] * pT[d * ld + w];
  for (std::int64_t w = 0; w < W; ++w) s[w] = ((a0[w] + a1[w]) + (a2[w] + a3[w])) * scale;
}

// s[j] = scale * sum_d x[d] * pT[d * ld + j], for j < n: one row against a packed (D, n) block.
template <typename T>
AG_ALWAYS_INLINE void row_times_packed(T* __restrict s, const T* __restrict x, const T* __restrict pT, std::int64_t ld,
                                       std::int64_t n, std::int64_t D, T scale) {
  constexpr std::int64_t W = kChunk<T>;
  std::int64_t j = 0;
  for (; j + W <= n; j += W) chunk_times_packed(s + j, x, pT + j, ld, D, scale);
  if (j < n && j + W <= ld) {  // a partial chunk inside the packed block: compute it whole, keep what is asked
    T chunk[W];
    chunk_times_packed(chunk, x, pT + j, ld, D, scale);
    std::copy(chunk, chunk + (n - j), s + j);
    return;
  }
  for (; j < n; ++j) {  // a block narrower than a chunk: one column at a time
    T acc = 0;
    for (std::int64_t d = 0; d < D; ++d) acc += x[d] * pT[d * ld + j];
    s[j] = acc * scale;
  }
}

// y[w] += sum_r a[r * a_stride] * x[r * x_stride + w] for a full chunk of W
// outputs (registers, as above).
template <typename T>
AG_ALWAYS_INLINE void accumulate_chunk(T* __restrict y, const T* __restrict a, std::int64_t a_stride,
                                       const T* __restrict x, std::int64_t x_stride, std::int64_t m) {
  constexpr std::int64_t W = kChunk<T>;
  T a0[W], a1[W], a2[W], a3[W];
  for (std::int64_t w = 0; w < W; ++w) a0[w] = a1[w] = a2[w] = a3[w] = T(0);
  std::int64_t r = 0;
  for (; r + kSplit <= m; r += kSplit) {
    const T c0 = a[r * a_stride], c1 = a[(r + 1) * a_stride], c2 = a[(r + 2) * a_stride], c3 = a[(r + 3) * a_stride];
    const T* __restrict x0 = x + r * x_stride;
    for (std::int64_t w = 0; w < W; ++w) {
      a0[w] += c0 * x0[w];
      a1[w] += c1 * x0[x_stride + w];
      a2[w] += c2 * x0[2 * x_stride + w];
      a3[w] += c3 * x0[3 * x_stride + w];
    }
  }
  for (; r < m; ++r)
    for (std::int64_t w = 0; w < W; ++w) a0[w] += a[r * a_stride] * x[r * x_stride + w];
  for (std::int64_t w = 0; w < W; ++w) y[w] += (a0[w] + a1[w]) + (a2[w] + a3[w]);
}

// y[d] += sum_r a[r * a_stride] * x[r * x_stride + d], for d < n, r < m: a
// weighted sum of m rows added into one row.
template <typename T>
AG_ALWAYS_INLINE void accumulate_rows(T* __restrict y, std::int64_t n, const T* __restrict a, std::int64_t a_stride,
                                      const T* __restrict x, std::int64_t x_stride, std::int64_t m) {
  constexpr std::int64_t W = kChunk<T>;
  std::int64_t d = 0;
  for (; d + W <= n; d += W) accumulate_chunk(y + d, a, a_stride, x + d, x_stride, m);
  if (d == n) return;
  for (std::int64_t r = 0; r < m; ++r) {  // the last partial chunk
    const T ar = a[r * a_stride];
    const T* __restrict xr = x + r * x_stride;
    for (std::int64_t e = d; e < n; ++e) y[e] += ar * xr[e];
  }
}

// Scores of query i against the packed key block [j0, j0 + nk): s[j] =
// scale * q_i . k_{j0+j}, -inf where the key is hidden (causal or masked);
// keys past the causal end are not computed. Returns the row maximum (-inf
// when every key of the block is hidden).
template <typename T>
AG_ALWAYS_INLINE T score_row(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                             std::int64_t nk, const T* __restrict kT, T* __restrict s) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t end = std::clamp<std::int64_t>(P.visible_end(i) - j0, 0, nk);
  row_times_packed(s, P.q.row(b, h, i), kT, nk, end, P.D, P.scale);
  for (std::int64_t j = end; j < nk; ++j) s[j] = neg_inf;
  if (const bool* m = P.mask_row(b, h, i)) {
    const std::int64_t ms = P.mask_strides[3];
    for (std::int64_t j = 0; j < end; ++j) s[j] = m[(j0 + j) * ms] ? neg_inf : s[j];
  }
  T lanes[kLanes];
  for (auto& l : lanes) l = neg_inf;
  std::int64_t j = 0;
  for (; j + kLanes <= end; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] = s[j + l] > lanes[l] ? s[j + l] : lanes[l];
  for (std::int64_t l = 0; j < end; ++j, ++l) lanes[l] = s[j] > lanes[l] ? s[j] : lanes[l];
  T mx = neg_inf;
  for (T l : lanes) mx = l > mx ? l : mx;
  return mx;
}

// s[j] = exp(s[j] - shift) for j < n (hidden -inf entries become 0); returns their sum.
template <typename T>
AG_ALWAYS_INLINE T exp_shifted(T* __restrict s, std::int64_t n, T shift) {
  T lanes[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) {
      s[j + l] = exp_of(s[j + l] - shift);
      lanes[l] += s[j + l];
    }
  for (std::int64_t l = 0; j < n; ++j, ++l) {
    s[j] = exp_of(s[j] - shift);
    lanes[l] += s[j];
  }
  T total = 0;
  for (T l : lanes) total += l;
  return total;
}

// Forward over queries [i0, i0 + nq) of (b, h). Per row it keeps a running
// max m, a running sum l of exp(s - m) and an accumulator of the (dropped)
// weights times v, rescaled whenever m grows. Rows of the output are
// out_row_stride apart. With `w`, also writes the rows' softmax weights
// (before dropout), recomputed from the final log-sum-exp.
template <typename T>
AG_ALWAYS_INLINE void forward_block(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0,
                                    std::int64_t nq, T* out_rows, std::int64_t out_row_stride, T* lse_rows, T* w) {
  const std::int64_t D = P.D;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> kT(D * kBlockK), s(kBlockK), z(kBlockK);  // (D, nk), (nk), (nk)
  std::vector<T> m(nq, neg_inf), l(nq, T(0));              // (nq)
  std::vector<T> acc(nq * D, T(0));                        // (nq, D)
  // Causal: keys past the block's last query are hidden from every row, so those key blocks are skipped.
  const std::int64_t key_end = P.visible_end(i0 + nq - 1);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0);
    pack_transposed(P.k, b, h, j0, nk, D, kT.data());
    for (std::int64_t r = 0; r < nq; ++r) {
      const std::int64_t i = i0 + r;
      if (P.causal && j0 > i) continue;
      const T block_max = score_row(P, b, h, i, j0, nk, kT.data(), s.data());
      const T m_new = std::max(m[r], block_max);
      if (m_new == neg_inf) continue;  // nothing visible to this row yet
      T* a = acc.data() + r * D;
      if (m[r] != m_new) {
        const T correction = exp_of(m[r] - m_new);  // 0 when m was -inf
        l[r] *= correction;
        for (std::int64_t d = 0; d < D; ++d) a[d] *= correction;
        m[r] = m_new;
      }
      const std::int64_t end = std::min(nk, P.visible_end(i) - j0);
      l[r] += exp_shifted(s.data(), end, m_new);
      if (P.dropout_p > 0) {
        dropout_factors(P, b, h, i, j0, end, z.data());
        for (std::int64_t j = 0; j < end; ++j) s[j] *= z[j];
      }
      accumulate_rows(a, D, s.data(), 1, P.v.row(b, h, j0), P.v.st, end);  // a += sum_j p_j v_j
    }
  }
  for (std::int64_t r = 0; r < nq; ++r) {
    T* o = out_rows + r * out_row_stride;
    if (l[r] == T(0)) {  // every key hidden: zeros, not 0/0
      std::fill(o, o + D, T(0));
      lse_rows[r] = neg_inf;
      continue;
    }
    const T inv = T(1) / l[r];
    for (std::int64_t d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv;
    lse_rows[r] = m[r] + std::log(l[r]);
  }
  if (!w) return;
  // The weights w[i][j] = exp(s_ij - lse_i), zero where hidden and on rows with every key hidden.
  const std::int64_t Tk = P.Tk;
  std::fill(w, w + nq * Tk, T(0));
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0);
    pack_transposed(P.k, b, h, j0, nk, D, kT.data());
    for (std::int64_t r = 0; r < nq; ++r) {
      if (lse_rows[r] == neg_inf || (P.causal && j0 > i0 + r)) continue;
      score_row(P, b, h, i0 + r, j0, nk, kT.data(), s.data());
      exp_shifted(s.data(), nk, lse_rows[r]);
      std::copy(s.begin(), s.begin() + nk, w + r * Tk + j0);
    }
  }
}

// Backward of (b, h), FlashAttention-2's order: for each key block, for each
// block of queries that can see it, the tiles P = exp(S - lse) (recomputed)
// and dS are built, then folded into dq, dk, dv. With Z the dropout factors:
//   forward: o_i = sum_j P_ij Z_ij v_j
//   so  dv_j += P_ij Z_ij do_i;  dP_ij = Z_ij (do_i . v_j);
//       dS_ij = P_ij (dP_ij - delta_i) with delta_i = sum_j P_ij dP_ij = do_i . o_i;
//       dq_i += scale dS_ij k_j;  dk_j += scale dS_ij q_i.
// dq, dk, dv of (b, h) are contiguous (T, D) slices owned by this call.
template <typename T>
AG_ALWAYS_INLINE void backward_head(const Problem<T>& P, std::int64_t b, std::int64_t h, const Rows<T>& dout,
                                    const Rows<T>& out, const T* lse, T* dq, T* dk, T* dv) {
  const std::int64_t D = P.D, Tq = P.Tq, Tk = P.Tk;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> kT(D * kBlockK), vT(D * kBlockK), z(kBlockK);  // (D, nk), (D, nk), (nk)
  std::vector<T> pz(kBlockQ * kBlockK), ds(kBlockQ * kBlockK);  // (nq, nk) tiles: P Z and scale dS
  std::vector<T> delta(Tq);                                     // (Tq)
  for (std::int64_t i = 0; i < Tq; ++i) {
    const T* __restrict o = out.row(b, h, i);
    const T* __restrict g = dout.row(b, h, i);
    T lanes[kLanes] = {};
    std::int64_t d = 0;
    for (; d + kLanes <= D; d += kLanes)
      for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] += g[d + l] * o[d + l];
    for (std::int64_t l = 0; d < D; ++d, ++l) lanes[l] += g[d] * o[d];
    T acc = 0;
    for (T l : lanes) acc += l;
    delta[i] = acc;
  }
  std::fill(dq, dq + Tq * D, T(0));
  std::fill(dk, dk + Tk * D, T(0));
  std::fill(dv, dv + Tk * D, T(0));
  for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, Tk - j0);
    pack_transposed(P.k, b, h, j0, nk, D, kT.data());
    pack_transposed(P.v, b, h, j0, nk, D, vT.data());
    // Causal: queries before j0 see none of these keys.
    for (std::int64_t i0 = P.causal ? j0 : 0; i0 < Tq; i0 += kBlockQ) {
      const std::int64_t nq = std::min(kBlockQ, Tq - i0);
      for (std::int64_t r = 0; r < nq; ++r) {
        const std::int64_t i = i0 + r;
        T* __restrict p = pz.data() + r * nk;
        T* __restrict dp = ds.data() + r * nk;
        // Keys [end, nk) are causally hidden from this row: zero in both tiles, never computed.
        const std::int64_t end = lse[i] == neg_inf ? 0 : std::clamp<std::int64_t>(P.visible_end(i) - j0, 0, nk);
        std::fill(p + end, p + nk, T(0));
        std::fill(dp + end, dp + nk, T(0));
        if (end == 0) continue;  // every key hidden (lse -inf): the row is constant zero, its gradient zero
        score_row(P, b, h, i, j0, nk, kT.data(), p);
        exp_shifted(p, end, lse[i]);                                           // P_ij, 0 where hidden
        row_times_packed(dp, dout.row(b, h, i), vT.data(), nk, end, D, T(1));  // do_i . v_j
        if (P.dropout_p > 0) {
          dropout_factors(P, b, h, i, j0, end, z.data());
          for (std::int64_t j = 0; j < end; ++j) dp[j] *= z[j];  // dP_ij
        }
        const T di = delta[i];
        for (std::int64_t j = 0; j < end; ++j) dp[j] = P.scale * p[j] * (dp[j] - di);  // scale dS_ij
        if (P.dropout_p > 0)
          for (std::int64_t j = 0; j < end; ++j) p[j] *= z[j];                  // P_ij Z_ij
        accumulate_rows(dq + i * D, D, dp, 1, P.k.row(b, h, j0), P.k.st, end);  // dq_i += sum_j dS_ij k_j
      }
      for (std::int64_t j = 0; j < nk; ++j) {
        // dv_j += sum_i PZ_ij do_i;  dk_j += sum_i dS_ij q_i, over the rows that can see key j.
        const std::int64_t first = P.causal ? std::clamp<std::int64_t>(j0 + j - i0, 0, nq) : 0;
        const std::int64_t rows = nq - first;
        accumulate_rows(dv + (j0 + j) * D, D, pz.data() + first * nk + j, nk, dout.row(b, h, i0 + first), dout.st,
                        rows);
        accumulate_rows(dk + (j0 + j) * D, D, ds.data() + first * nk + j, nk, P.q.row(b, h, i0 + first), P.q.st, rows);
      }
    }
  }
}

// The per-dtype entry points, each compiled per SIMD level for float32.
AG_SIMD_CLONES void forward_block_f32(const Problem<float>& P, std::int64_t b, std::int64_t h, std::int64_t i0,
                                      std::int64_t nq, float* out, std::int64_t out_stride, float* lse, float* w) {
  forward_block(P, b, h, i0, nq, out, out_stride, lse, w);
}
void forward_block_any(const Problem<float>& P, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                       float* out, std::int64_t out_stride, float* lse, float* w) {
  forward_block_f32(P, b, h, i0, nq, out, out_stride, lse, w);
}
void forward_block_any(const Problem<double>& P, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                       double* out, std::int64_t out_stride, double* lse, double* w) {
  forward_block(P, b, h, i0, nq, out, out_stride, lse, w);
}
AG_SIMD_CLONES void backward_head_f32(const Problem<float>& P, std::int64_t b, std::int64_t h, const Rows<float>& dout,
                                      const Rows<float>& out, const float* lse, float* dq, float* dk, float* dv) {
  backward_head(P, b, h, dout, out, lse, dq, dk, dv);
}
void backward_head_any(const Problem<float>& P, std::int64_t b, std::int64_t h, const Rows<float>& dout,
                       const Rows<float>& out, const float* lse, float* dq, float* dk, float* dv) {
  backward_head_f32(P, b, h, dout, out, lse, dq, dk, dv);
}
void backward_head_any(const Problem<double>& P, std::int64_t b, std::int64_t h, const Rows<double>& dout,
                       const Rows<double>& out, const double* lse, double* dq, double* dk, double* dv) {
  backward_head(P, b, h, dout, out, lse, dq, dk, dv);
}

template <typename T>
Problem<T> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const kernels::AttentionKernelOptions& o) {
  Problem<T> P{rows_of<T>(q), rows_of<T>(k), rows_of<T>(v),           q.size(0), q.size(1), q.size(2),
               k.size(2),     q.size(3),     static_cast<T>(o.scale), o.causal};
  if (mask.defined()) {
    P.mask = mask.data<bool>();
    const auto strides = broadcast_strides(mask.sizes(), mask.strides(), {P.B, P.H, P.Tq, P.Tk});
    std::copy(strides.begin(), strides.end(), P.mask_strides);
  }
  P.dropout_p = o.dropout_p;
  P.keep_scale = static_cast<T>(1.0 / (1.0 - o.dropout_p));
  P.seed = o.seed;
  P.offset = o.offset;
  return P;
}

}  // namespace

kernels::AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                                  const kernels::AttentionKernelOptions& options) {
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  kernels::AttentionForwardResult r;
  // The output is laid out (B, Tq, H, D) and returned as a (B, H, Tq, D) view,
  // so merging the heads back to (B, Tq, H*D) afterwards is free.
  Tensor out_bthd = empty({B, Tq, H, D}, q.options());
  r.out = make_view(out_bthd, {B, H, Tq, D}, {Tq * H * D, D, H * D, 1}, 0);
  r.lse = empty({B, H, Tq}, q.options());
  if (options.return_weights) r.weights = empty({B, H, Tq, Tk}, q.options());
  if (r.out.numel() == 0 && !options.return_weights) return r;
  AG_DISPATCH_FLOAT(q.dtype(), "attention", [&] {
    using T = scalar_t;
    const Problem<T> P = make_problem<T>(q, k, v, mask, options);
    T* out = out_bthd.data<T>();
    T* lse = r.lse.data<T>();
    T* w = options.return_weights ? r.weights.data<T>() : nullptr;
    const std::int64_t blocks = (Tq + kBlockQ - 1) / kBlockQ;
    parallel_for(0, B * H * blocks, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t task = begin; task < end; ++task) {
        const std::int64_t bh = task / blocks, i0 = (task % blocks) * kBlockQ, b = bh / H, h = bh % H;
        const std::int64_t nq = std::min(kBlockQ, Tq - i0);
        forward_block_any(P, b, h, i0, nq, out + (b * Tq + i0) * H * D + h * D, H * D, lse + bh * Tq + i0,
                          w ? w + (bh * Tq + i0) * Tk : nullptr);
      }
    });
  });
  return r;
}

kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionKernelOptions& options) {
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  kernels::AttentionGrads g{empty(q.sizes(), q.options()), empty(k.sizes(), k.options()),
                            empty(v.sizes(), v.options())};
  if (g.dq.numel() == 0 && g.dk.numel() == 0) return g;
  AG_DISPATCH_FLOAT(q.dtype(), "attention backward", [&] {
    using T = scalar_t;
    const Problem<T> P = make_problem<T>(q, k, v, mask, options);
    const Rows<T> dout_rows = rows_of<T>(dout), out_rows = rows_of<T>(out);
    const T* lse_data = lse.data<T>();
    T *dq = g.dq.data<T>(), *dk = g.dk.data<T>(), *dv = g.dv.data<T>();
    parallel_for(0, B * H, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t bh = begin; bh < end; ++bh)
        backward_head_any(P, bh / H, bh % H, dout_rows, out_rows, lse_data + bh * Tq, dq + bh * Tq * D,
                          dk + bh * Tk * D, dv + bh * Tk * D);
    });
  });
  return g;
}

}  // namespace attograd::cpu
