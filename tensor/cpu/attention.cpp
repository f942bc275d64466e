// Fused attention on the CPU, flash-attention style (Dao et al. 2022, 2023):
// queries and keys are processed in blocks with an online softmax, so no
// (Tq, Tk) score matrix is ever kept; the forward saves one log-sum-exp per
// query row and the backward recomputes the probabilities from it.
//
// Work is split over (batch, head, query block) in the forward and over
// (batch, head) in the backward, with parallel_for. No BLAS here: OpenBLAS
// runs its own threads and must not be called from inside ours. Instead each
// key block is packed transposed (D, nk), so every inner loop is a
// contiguous multiply-add the compiler vectorises: scores accumulate over the
// key index, outputs and gradients over the head dim.
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
#include "tensor/parallel.h"
#include "tensor/rng.h"

namespace attograd::cpu {
namespace {

constexpr std::int64_t kBlockQ = 64;  // query rows sharing one packed key block
constexpr std::int64_t kBlockK = 64;  // keys per block

// exp(x) for x <= 0 (every exponent below is a score minus its row max, or minus
// the row's log-sum-exp), written so the compiler can vectorise the loops that
// call it: std::exp is an opaque libm call without -ffast-math, which would
// leave the float32 kernels bound by scalar exp. Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2/2, then a degree-6 polynomial for e^r (relative
// error about 2e-7, float32's own rounding), and 2^n built in the exponent bits.
// float64 keeps std::exp: it is the reference dtype and must stay exact.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // below this e^x underflows float32; -inf lands here too
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two: exact n * hi
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  static_assert(sizeof(scale) == sizeof(bits));
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return x <= -87.0f ? 0.0f : p * scale;
}
inline double exp_nonpositive(double x) { return std::exp(x); }

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
  // The dropout factor of weight (b, h, i, j): 0 or 1/(1-p).
  T dropout_factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    const std::uint64_t flat = static_cast<std::uint64_t>(((b * H + h) * Tq + i) * Tk + j);
    return philox_uniform(seed, offset, flat) < static_cast<float>(dropout_p) ? T(0) : keep_scale;
  }
};

// Packs keys [j0, j0 + nk) of (b, h) transposed: kT[d * nk + j] = k[j0 + j][d].
template <typename T>
void pack_transposed(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk,
                     std::int64_t D, T* out) {
  for (std::int64_t j = 0; j < nk; ++j) {
    const T* row = x.row(b, h, j0 + j);
    for (std::int64_t d = 0; d < D; ++d) out[d * nk + j] = row[d];
  }
}

// s[j] = scale * q_i . k_{j0+j} for the nk keys of a packed block, then -inf
// where the key is hidden from query i. Returns the row maximum (-inf when
// every key of the block is hidden).
template <typename T>
T score_row(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0, std::int64_t nk,
            const T* __restrict kT, T* __restrict s) {
  const T* __restrict qi = P.q.row(b, h, i);
  std::fill(s, s + nk, T(0));
  for (std::int64_t d = 0; d < P.D; ++d) {
    const T qd = qi[d] * P.scale;
    const T* __restrict kd = kT + d * nk;
    for (std::int64_t j = 0; j < nk; ++j) s[j] += qd * kd[j];
  }
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t end = std::clamp<std::int64_t>(P.visible_end(i) - j0, 0, nk);
  for (std::int64_t j = end; j < nk; ++j) s[j] = neg_inf;
  if (const bool* m = P.mask_row(b, h, i)) {
    const std::int64_t ms = P.mask_strides[3];
    for (std::int64_t j = 0; j < end; ++j)
      if (m[(j0 + j) * ms]) s[j] = neg_inf;
  }
  T mx = neg_inf;
  for (std::int64_t j = 0; j < end; ++j) mx = std::max(mx, s[j]);
  return mx;
}

// Forward over queries [i0, i0 + nq) of (b, h). Per row it keeps a running
// max m, a running sum l of exp(s - m) and an accumulator of the (dropped)
// weights times v, rescaled whenever m grows.
template <typename T>
void forward_block(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                   T* out_rows, std::int64_t out_row_stride, T* lse_rows) {
  const std::int64_t D = P.D;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> kT(D * kBlockK), s(kBlockK);         // (D, nk), (nk)
  std::vector<T> m(nq, neg_inf), l(nq, T(0));          // (nq)
  std::vector<T> acc(nq * D, T(0));                     // (nq, D)
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
      T* __restrict a = acc.data() + r * D;
      if (m[r] != m_new) {
        const T correction = exp_nonpositive(m[r] - m_new);  // 0 when m was -inf
        l[r] *= correction;
        for (std::int64_t d = 0; d < D; ++d) a[d] *= correction;
        m[r] = m_new;
      }
      T row_sum = 0;
      for (std::int64_t j = 0; j < nk; ++j) {
        s[j] = exp_nonpositive(s[j] - m_new);  // hidden keys: exp(-inf) = 0
        row_sum += s[j];
      }
      l[r] += row_sum;
      for (std::int64_t j = 0; j < nk; ++j) {
        T p = s[j];
        if (P.dropout_p > 0 && p != T(0)) p *= P.dropout_factor(b, h, i, j0 + j);
        if (p == T(0)) continue;
        const T* __restrict vj = P.v.row(b, h, j0 + j);
        for (std::int64_t d = 0; d < D; ++d) a[d] += p * vj[d];
      }
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
}

// The softmax weights of queries [i0, i0 + nq), recomputed from the
// log-sum-exp: w[i][j] = exp(s_ij - lse_i), zero where hidden (and on rows
// with every key hidden).
template <typename T>
void weights_block(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                   const T* lse_rows, T* w_rows) {
  const std::int64_t D = P.D, Tk = P.Tk;
  std::vector<T> kT(D * kBlockK), s(kBlockK);
  std::fill(w_rows, w_rows + nq * Tk, T(0));
  const std::int64_t key_end = P.visible_end(i0 + nq - 1);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0);
    pack_transposed(P.k, b, h, j0, nk, D, kT.data());
    for (std::int64_t r = 0; r < nq; ++r) {
      const T lse = lse_rows[r];
      if (lse == -std::numeric_limits<T>::infinity() || (P.causal && j0 > i0 + r)) continue;
      score_row(P, b, h, i0 + r, j0, nk, kT.data(), s.data());
      T* w = w_rows + r * Tk + j0;
      for (std::int64_t j = 0; j < nk; ++j) w[j] = exp_nonpositive(s[j] - lse);
    }
  }
}

// Backward of (b, h), key block by key block (FlashAttention-2's order), with
// P = exp(s - lse) recomputed and Z the dropout factors:
//   forward: o_i = sum_j P_ij Z_ij v_j
//   so  dv_j += P_ij Z_ij do_i;  dP_ij = Z_ij (do_i . v_j);
//       dS_ij = P_ij (dP_ij - delta_i) with delta_i = sum_j P_ij dP_ij = do_i . o_i;
//       dq_i += scale dS_ij k_j;  dk_j += scale dS_ij q_i.
// dq, dk, dv of (b, h) are contiguous (T, D) slices owned by this call.
template <typename T>
void backward_head(const Problem<T>& P, std::int64_t b, std::int64_t h, const Rows<T>& dout, const Rows<T>& out,
                   const T* lse, T* dq, T* dk, T* dv) {
  const std::int64_t D = P.D, Tq = P.Tq, Tk = P.Tk;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> kT(D * kBlockK), vT(D * kBlockK), s(kBlockK), dp(kBlockK);
  std::vector<T> delta(Tq);  // (Tq)
  for (std::int64_t i = 0; i < Tq; ++i) {
    const T* o = out.row(b, h, i);
    const T* g = dout.row(b, h, i);
    T acc = 0;
    for (std::int64_t d = 0; d < D; ++d) acc += g[d] * o[d];
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
    for (std::int64_t i = P.causal ? j0 : 0; i < Tq; ++i) {
      if (lse[i] == neg_inf) continue;  // every key hidden: the row is constant zero, its gradient zero
      score_row(P, b, h, i, j0, nk, kT.data(), s.data());
      const T* __restrict g = dout.row(b, h, i);
      std::fill(dp.begin(), dp.begin() + nk, T(0));
      for (std::int64_t d = 0; d < D; ++d) {
        const T gd = g[d];
        const T* __restrict vd = vT.data() + d * nk;
        for (std::int64_t j = 0; j < nk; ++j) dp[j] += gd * vd[j];
      }
      const T* __restrict qi = P.q.row(b, h, i);
      T* __restrict dqi = dq + i * D;
      for (std::int64_t j = 0; j < nk; ++j) {
        const T p = exp_nonpositive(s[j] - lse[i]);
        if (p == T(0)) continue;  // hidden (or underflowed): contributes nothing
        const T z = P.dropout_p > 0 ? P.dropout_factor(b, h, i, j0 + j) : T(1);
        const T pz = p * z;
        const T ds = P.scale * p * (dp[j] * z - delta[i]);
        T* __restrict dvj = dv + (j0 + j) * D;
        T* __restrict dkj = dk + (j0 + j) * D;
        const T* __restrict kj = P.k.row(b, h, j0 + j);
        for (std::int64_t d = 0; d < D; ++d) {
          dvj[d] += pz * g[d];
          dkj[d] += ds * qi[d];
          dqi[d] += ds * kj[d];
        }
      }
    }
  }
}

template <typename T>
Problem<T> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const kernels::AttentionKernelOptions& o) {
  Problem<T> P{rows_of<T>(q), rows_of<T>(k), rows_of<T>(v), q.size(0), q.size(1), q.size(2), k.size(2), q.size(3),
               static_cast<T>(o.scale), o.causal};
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
        T* lse_rows = lse + bh * Tq + i0;
        forward_block(P, b, h, i0, nq, out + (b * Tq + i0) * H * D + h * D, H * D, lse_rows);
        if (w) weights_block(P, b, h, i0, nq, lse_rows, w + (bh * Tq + i0) * Tk);
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
        backward_head(P, bh / H, bh % H, dout_rows, out_rows, lse_data + bh * Tq, dq + bh * Tq * D,
                      dk + bh * Tk * D, dv + bh * Tk * D);
    });
  });
  return g;
}

}  // namespace attograd::cpu
