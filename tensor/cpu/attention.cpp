// Fused attention on the CPU, flash-attention style (Dao et al. 2022, 2023):
// queries and keys are processed in blocks with an online softmax, so no
// (Tq, Tk) score matrix is ever kept; the forward saves one log-sum-exp per
// query row and the backward recomputes the probabilities from it.
//
// Work is split over (batch, head, query block) in the forward and over
// (batch, head) in the backward, with parallel_for. Every product is a small
// GEMM on tiles packed once per block into zero-padded scratch buffers, done
// by one register-blocked micro-kernel (as BLIS and OpenBLAS do): an MR x NR
// tile of C stays in vector registers while it accumulates over the shared
// dimension, one vector load of B and MR broadcasts of A feeding MR x NR/lanes
// multiply-adds per step. The five products of the backward and the two of
// the forward differ only in the strides the micro-kernel reads A with.
// Tiles, micro-tiles and key ranges wholly hidden by the causal flag are
// skipped. The exponentials are tensor/cpu/vec_math.h's polynomial for
// float32 (libm's for float64, which serves gradcheck).
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
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/parallel.h"
#include "tensor/rng.h"

// Everything below the per-instruction-set entry points is forced inline into
// them, so it is compiled for their target (see "Instruction sets" below).
#if defined(__GNUC__)
#define AG_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define AG_ALWAYS_INLINE inline
#endif

namespace attograd::cpu {
namespace {

constexpr std::int64_t kBlockQ = 64;  // query rows per tile
constexpr std::int64_t kBlockK = 64;  // keys per tile; a multiple of every micro-tile width
constexpr std::int64_t kLanes = 16;   // partial sums, so float reductions vectorise without -ffast-math
// A diagonal offset no index reaches: "no causal limit" in the tile loops below.
constexpr std::int64_t kNoDiagonal = std::int64_t(1) << 40;

std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// ---- instruction sets ------------------------------------------------------------
// The micro-kernel's best register tile depends on the register file: AVX-512
// has 32 registers of 64 bytes, AVX2 16 of 32 bytes (a 64-byte vector takes
// two), SSE2 16 of 16. Function multi-versioning (AG_SIMD_CLONES) compiles one
// body per target, so it cannot change the tile; instead each tile is its own
// template instance, compiled under its target attribute and picked once at
// run time from the CPU's features.
template <typename T>
struct Simd {
  typedef T Vec __attribute__((vector_size(64)));  // GCC's portable vectors, lowered per target
  static constexpr std::int64_t kLanes = 64 / sizeof(T);
};

// MR rows x kVecs 64-byte vectors of C held in registers.
struct TileAvx512 {
  static constexpr int kRows = 8, kVecs = 2;  // 16 accumulators of 32
};
struct TileAvx2 {
  static constexpr int kRows = 4, kVecs = 1;  // 8 ymm accumulators of 16
};
struct TileBaseline {
  static constexpr int kRows = 2, kVecs = 1;  // 8 xmm accumulators of 16
};

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define AG_ATTENTION_ISA_DISPATCH 1
#define AG_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define AG_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define AG_ATTENTION_ISA_DISPATCH 0
#define AG_TARGET_AVX512
#define AG_TARGET_AVX2
#endif

enum class Isa { avx512, avx2, baseline };

Isa cpu_isa() {
#if AG_ATTENTION_ISA_DISPATCH
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return Isa::avx512;
    if (__builtin_cpu_supports("x86-64-v3")) return Isa::avx2;
    return Isa::baseline;
  }();
  return isa;
#else
  return Isa::baseline;
#endif
}

// ---- the micro-kernel and the three tile products made of it ----------------------

// C[i][j] = (accumulate ? C[i][j] : 0) + sum_{k0 <= k < k1} A(i, k) B[k][j]
// for i < MR, j < NV lanes-wide vectors, with A(i, k) = a[i * a_rs + k * a_ks]
// and rows of B and C ldb and ldc apart. The MR x NV accumulators are
// compile-time indexed once the loops unroll, so they live in registers.
template <typename T, int MR, int NV>
AG_ALWAYS_INLINE void micro_kernel(const T* __restrict a, std::int64_t a_rs, std::int64_t a_ks,
                                   const T* __restrict b, std::int64_t ldb, std::int64_t k0, std::int64_t k1,
                                   T* __restrict c, std::int64_t ldc, bool accumulate) {
  using Vec = typename Simd<T>::Vec;
  constexpr std::int64_t W = Simd<T>::kLanes;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = Vec{};
      if (accumulate) std::memcpy(&acc[i][v], c + i * ldc + v * W, sizeof(Vec));
    }
  for (std::int64_t k = k0; k < k1; ++k) {
    Vec bk[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&bk[v], b + k * ldb + v * W, sizeof(Vec));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T aik = a[i * a_rs + k * a_ks];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += aik * bk[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(c + i * ldc + v * W, &acc[i][v], sizeof(Vec));
}

// The micro-kernel over the columns [0, n) of one row group, n a multiple of
// the vector width: full MR x NR tiles, then one vector wide for the rest.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void row_group(std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                                std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c, std::int64_t ldc,
                                bool accumulate) {
  constexpr std::int64_t W = Simd<T>::kLanes, NR = Tile::kVecs * W;
  std::int64_t j = 0;
  for (; j + NR <= n; j += NR)
    micro_kernel<T, Tile::kRows, Tile::kVecs>(a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, accumulate);
  for (; j < n; j += W) micro_kernel<T, Tile::kRows, 1>(a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, accumulate);
}

// In all three products rows and columns stand for queries r and keys c of
// one tile, and query r sees key c only when c <= r + diag (diag = i0 - j0
// when causal, kNoDiagonal otherwise). m and the column counts are multiples
// of the micro-tile; the buffers are zero-padded to them.

// Scores: C (m, n) = A (m, K) Bt (K, n), C's rows queries and its columns
// keys, A(r, k) = a[r * lda + k]. Micro-tiles whose keys no query of the row
// group sees are left unwritten: the caller never reads past a row's last
// visible key.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void product_scores(std::int64_t m, std::int64_t n, std::int64_t K, const T* a, std::int64_t lda,
                                     const T* bt, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t diag) {
  constexpr std::int64_t MR = Tile::kRows, W = Simd<T>::kLanes;
  for (std::int64_t r = 0; r < m; r += MR) {
    const std::int64_t visible = std::clamp<std::int64_t>(r + MR + diag, 0, n);  // keys some row of the group sees
    row_group<T, Tile>(round_up(visible, W), a + r * lda, lda, 1, bt, ldb, 0, K, c + r * ldc, ldc, false);
  }
}

// Query-side accumulation: C (m, n) += A (m, kk) B (kk, n), A's rows queries
// and its columns keys (A(r, c) = a[r * lda + c], zero where hidden), so row
// group r stops at the last key it sees. For out += P v and dq += dS k.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void accumulate_queries(std::int64_t m, std::int64_t n, std::int64_t kk, const T* a,
                                         std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                                         std::int64_t diag) {
  constexpr std::int64_t MR = Tile::kRows;
  for (std::int64_t r = 0; r < m; r += MR) {
    const std::int64_t end = std::clamp<std::int64_t>(r + MR + diag, 0, kk);
    row_group<T, Tile>(n, a + r * lda, lda, 1, b, ldb, 0, end, c + r * ldc, ldc, true);
  }
}

// Key-side accumulation: C (m, n) += A^T B with A (kk, m) read transposed,
// A's rows queries and its columns keys (A(r, c) = a[r * lda + c], zero where
// hidden), so row group c of C starts at the first query that sees it.
// For dv += P^T do and dk += dS^T q.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void accumulate_keys(std::int64_t m, std::int64_t n, std::int64_t kk, const T* a, std::int64_t lda,
                                      const T* b, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t diag) {
  constexpr std::int64_t MR = Tile::kRows;
  for (std::int64_t c0 = 0; c0 < m; c0 += MR) {
    const std::int64_t begin = std::clamp<std::int64_t>(c0 - diag, 0, kk);
    row_group<T, Tile>(n, a + c0, 1, lda, b, ldb, begin, kk, c + c0 * ldc, ldc, true);
  }
}

// ---- the problem --------------------------------------------------------------------

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
  // Query r of a tile at (i0, j0) sees tile key c only when c <= r + diagonal(i0, j0).
  std::int64_t diagonal(std::int64_t i0, std::int64_t j0) const { return causal ? i0 - j0 : kNoDiagonal; }
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

// ---- packing ---------------------------------------------------------------------------

// out (rows_padded, ld) = factor * x rows [t0, t0 + rows) of (b, h), zero in
// padding rows and in columns [D, ld).
template <typename T>
AG_ALWAYS_INLINE void pack_rows(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t rows,
                                std::int64_t rows_padded, std::int64_t D, std::int64_t ld, T factor,
                                T* __restrict out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict src = x.row(b, h, t0 + r);
    T* __restrict dst = out + r * ld;
    for (std::int64_t d = 0; d < D; ++d) dst[d] = factor * src[d];
    std::fill(dst + D, dst + ld, T(0));
  }
  std::fill(out + rows * ld, out + rows_padded * ld, T(0));
}

// out (D, ld) = rows [t0, t0 + n) of (b, h) transposed, zero in columns [n, n_padded).
template <typename T>
AG_ALWAYS_INLINE void pack_transposed(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                      std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t ld,
                                      T* __restrict out) {
  for (std::int64_t j = 0; j < n; ++j) {
    const T* __restrict src = x.row(b, h, t0 + j);
    for (std::int64_t d = 0; d < D; ++d) out[d * ld + j] = src[d];
  }
  for (std::int64_t d = 0; d < D; ++d) std::fill(out + d * ld + n, out + d * ld + n_padded, T(0));
}

// ---- row helpers of the softmax ---------------------------------------------------------

// s[j] = -inf where the mask hides key j0 + j, j < n.
template <typename T>
AG_ALWAYS_INLINE void apply_mask(const bool* mask_row, std::int64_t mask_stride, std::int64_t j0, std::int64_t n,
                                 T* __restrict s) {
  if (!mask_row) return;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t j = 0; j < n; ++j) s[j] = mask_row[(j0 + j) * mask_stride] ? neg_inf : s[j];
}

template <typename T>
AG_ALWAYS_INLINE T row_max(const T* __restrict s, std::int64_t n) {
  T lanes[kLanes];
  for (auto& l : lanes) l = -std::numeric_limits<T>::infinity();
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] = s[j + l] > lanes[l] ? s[j + l] : lanes[l];
  for (std::int64_t l = 0; j < n; ++j, ++l) lanes[l] = s[j] > lanes[l] ? s[j] : lanes[l];
  T mx = lanes[0];
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

// ---- forward ------------------------------------------------------------------------------

template <typename T>
struct ForwardOutputs {
  T* out;      // (B, Tq, H, D)
  T* lse;      // (B, H, Tq)
  T* weights;  // (B, H, Tq, Tk), or nullptr
};

// Scratch of one thread, zero-padded: Dp is D rounded up to the vector width.
template <typename T>
struct ForwardScratch {
  std::vector<T> q;      // (kBlockQ, Dp) scale * queries of the tile
  std::vector<T> kt;     // (D, kBlockK) keys of the tile, transposed
  std::vector<T> v;      // (kBlockK, Dp) values of the tile
  std::vector<T> s;      // (kBlockQ, kBlockK) scores, then probabilities
  std::vector<T> acc;    // (kBlockQ, Dp) unnormalised output
  std::vector<T> m, l;   // (kBlockQ) running max and sum of exp(s - m)
  std::vector<T> z;      // (kBlockK) dropout factors of one row
  ForwardScratch(std::int64_t D, std::int64_t Dp)
      : q(kBlockQ * Dp), kt(D * kBlockK), v(kBlockK * Dp), s(kBlockQ * kBlockK), acc(kBlockQ * Dp), m(kBlockQ),
        l(kBlockQ), z(kBlockK) {}
};

// Forward over queries [i0, i0 + nq) of (b, h). Per row it keeps a running
// max m, a running sum l of exp(s - m) and an accumulator of the (dropped)
// weights times v, rescaled whenever m grows. With weights asked for, a
// second pass writes the rows' softmax (before dropout) from the final
// log-sum-exp.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void forward_tile_rows(const Problem<T>& P, const ForwardOutputs<T>& O, ForwardScratch<T>& w,
                                        std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq) {
  const std::int64_t D = P.D, Dp = round_up(D, Simd<T>::kLanes), NR = Tile::kVecs * Simd<T>::kLanes;
  const std::int64_t nq_padded = round_up(nq, Tile::kRows);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t mask_stride = P.mask_strides[3];
  T* __restrict s = w.s.data();
  T* __restrict acc = w.acc.data();
  T* __restrict m = w.m.data();
  T* __restrict l = w.l.data();
  pack_rows(P.q, b, h, i0, nq, nq_padded, D, Dp, P.scale, w.q.data());
  std::fill(acc, acc + nq_padded * Dp, T(0));
  std::fill(m, m + nq, neg_inf);
  std::fill(l, l + nq, T(0));
  // Causal: keys past the block's last query are hidden from every row, so those key blocks are skipped.
  const std::int64_t key_end = P.visible_end(i0 + nq - 1);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0), nk_padded = round_up(nk, NR);
    const std::int64_t diag = P.diagonal(i0, j0);
    pack_transposed(P.k, b, h, j0, nk, nk_padded, D, kBlockK, w.kt.data());
    pack_rows(P.v, b, h, j0, nk, nk, D, Dp, T(1), w.v.data());
    product_scores<T, Tile>(nq_padded, nk_padded, D, w.q.data(), Dp, w.kt.data(), kBlockK, s, kBlockK, diag);
    for (std::int64_t r = 0; r < nq_padded; ++r) {
      T* __restrict sr = s + r * kBlockK;
      // Keys [end, nk) of the tile are causally hidden from this row; their probabilities are 0.
      const std::int64_t end = r < nq ? std::clamp<std::int64_t>(r + diag + 1, 0, nk) : 0;
      std::fill(sr + end, sr + nk_padded, T(0));
      if (end == 0) continue;
      apply_mask(P.mask_row(b, h, i0 + r), mask_stride, j0, end, sr);
      const T m_new = std::max(m[r], row_max(sr, end));
      if (m_new == neg_inf) {  // nothing visible to this row yet
        std::fill(sr, sr + end, T(0));
        continue;
      }
      if (m[r] != m_new) {
        const T correction = exp_of(m[r] - m_new);  // 0 when m was -inf
        l[r] *= correction;
        T* __restrict ar = acc + r * Dp;
        for (std::int64_t d = 0; d < Dp; ++d) ar[d] *= correction;
        m[r] = m_new;
      }
      l[r] += exp_shifted(sr, end, m_new);
      if (P.dropout_p > 0) {
        T* __restrict z = w.z.data();
        dropout_factors(P, b, h, i0 + r, j0, end, z);
        for (std::int64_t j = 0; j < end; ++j) sr[j] *= z[j];
      }
    }
    accumulate_queries<T, Tile>(nq_padded, Dp, nk, s, kBlockK, w.v.data(), Dp, acc, Dp, diag);  // acc += P v
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
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, key_end - j0), nk_padded = round_up(nk, NR);
    const std::int64_t diag = P.diagonal(i0, j0);
    pack_transposed(P.k, b, h, j0, nk, nk_padded, D, kBlockK, w.kt.data());
    product_scores<T, Tile>(nq_padded, nk_padded, D, w.q.data(), Dp, w.kt.data(), kBlockK, s, kBlockK, diag);
    for (std::int64_t r = 0; r < nq; ++r) {
      const std::int64_t end = std::clamp<std::int64_t>(r + diag + 1, 0, nk);
      if (lse[r] == neg_inf || end == 0) continue;
      T* __restrict sr = s + r * kBlockK;
      apply_mask(P.mask_row(b, h, i0 + r), mask_stride, j0, end, sr);
      exp_shifted(sr, end, lse[r]);
      std::copy(sr, sr + end, weights + r * Tk + j0);
    }
  }
}

// Forward tasks [begin, end) of B * H * (query blocks). Within a head the
// blocks are visited outside-in (0, n-1, 1, n-2, ...): under a causal mask
// block i costs i + 1 tiles, and parallel_for hands each thread one
// contiguous range, which this order keeps balanced even for one head.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void forward_tasks(const Problem<T>& P, const ForwardOutputs<T>& O, std::int64_t begin,
                                    std::int64_t end) {
  ForwardScratch<T> scratch(P.D, round_up(P.D, Simd<T>::kLanes));
  const std::int64_t blocks = (P.Tq + kBlockQ - 1) / kBlockQ;
  for (std::int64_t task = begin; task < end; ++task) {
    const std::int64_t bh = task / blocks, n = task % blocks;
    const std::int64_t block = n % 2 == 0 ? n / 2 : blocks - 1 - n / 2;
    const std::int64_t i0 = block * kBlockQ;
    forward_tile_rows<T, Tile>(P, O, scratch, bh / P.H, bh % P.H, i0, std::min(kBlockQ, P.Tq - i0));
  }
}

// ---- backward -------------------------------------------------------------------------------

template <typename T>
struct BackwardIo {
  Rows<T> dout, out;  // (B, H, Tq, D)
  const T* lse;       // (B, H, Tq)
  T *dq, *dk, *dv;    // contiguous (B, H, T, D)
};

// Scratch of one thread, zero-padded: Dp is D rounded up to the vector
// width, Tp is Tq rounded up to the micro-tile's rows.
template <typename T>
struct BackwardScratch {
  std::vector<T> q;       // (Tp, Dp) scale * q of the head
  std::vector<T> dout;    // (Tp, Dp)
  std::vector<T> dq;      // (Tp, Dp) sum over keys of dS k; dq is scale times this
  std::vector<T> delta;   // (Tq) do_i . o_i
  std::vector<T> kt, vt;  // (D, kBlockK) keys and values of the tile, transposed
  std::vector<T> k;       // (kBlockK, Dp)
  std::vector<T> dk, dv;  // (kBlockK, Dp) accumulated over the query tiles
  std::vector<T> p, ds;   // (kBlockQ, kBlockK) P Z and dS tiles
  std::vector<T> z;       // (kBlockK) dropout factors of one row
  BackwardScratch(std::int64_t Tp, std::int64_t Tq, std::int64_t D, std::int64_t Dp)
      : q(Tp * Dp), dout(Tp * Dp), dq(Tp * Dp), delta(Tq), kt(D * kBlockK), vt(D * kBlockK), k(kBlockK * Dp),
        dk(kBlockK * Dp), dv(kBlockK * Dp), p(kBlockQ * kBlockK), ds(kBlockQ * kBlockK), z(kBlockK) {}
};

// Backward of (b, h), FlashAttention-2's order: for each key tile, for each
// query tile that can see it, P = exp(S - lse) (recomputed) and dS are
// built, then folded into dq, dk, dv. With Z the dropout factors and q
// pre-scaled (S = (scale q) k^T):
//   forward: o_i = sum_j P_ij Z_ij v_j
//   so  dv_j += P_ij Z_ij do_i;  dP_ij = Z_ij (do_i . v_j);
//       dS_ij = P_ij (dP_ij - delta_i) with delta_i = sum_j P_ij dP_ij = do_i . o_i;
//       dq_i += scale dS_ij k_j;  dk_j += dS_ij (scale q_i).
template <typename T, typename Tile>
AG_ALWAYS_INLINE void backward_head(const Problem<T>& P, const BackwardIo<T>& io, BackwardScratch<T>& w,
                                    std::int64_t b, std::int64_t h) {
  const std::int64_t D = P.D, Tq = P.Tq, Tk = P.Tk, Dp = round_up(D, Simd<T>::kLanes);
  const std::int64_t NR = Tile::kVecs * Simd<T>::kLanes, Tp = round_up(Tq, Tile::kRows);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t mask_stride = P.mask_strides[3];
  const std::int64_t bh = b * P.H + h;
  const T* lse = io.lse + bh * Tq;
  T* __restrict p = w.p.data();
  T* __restrict ds = w.ds.data();
  T* __restrict dq = w.dq.data();
  T* __restrict delta = w.delta.data();
  pack_rows(P.q, b, h, 0, Tq, Tp, D, Dp, P.scale, w.q.data());
  pack_rows(io.dout, b, h, 0, Tq, Tp, D, Dp, T(1), w.dout.data());
  for (std::int64_t i = 0; i < Tq; ++i) {
    const T* __restrict o = io.out.row(b, h, i);
    const T* __restrict g = w.dout.data() + i * Dp;
    T lanes[kLanes] = {};
    std::int64_t d = 0;
    for (; d + kLanes <= D; d += kLanes)
      for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] += g[d + l] * o[d + l];
    for (std::int64_t l = 0; d < D; ++d, ++l) lanes[l] += g[d] * o[d];
    T acc = 0;
    for (T l : lanes) acc += l;
    delta[i] = acc;
  }
  std::fill(dq, dq + Tp * Dp, T(0));
  for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, Tk - j0), nk_padded = round_up(nk, NR);
    pack_transposed(P.k, b, h, j0, nk, nk_padded, D, kBlockK, w.kt.data());
    pack_transposed(P.v, b, h, j0, nk, nk_padded, D, kBlockK, w.vt.data());
    pack_rows(P.k, b, h, j0, nk, nk_padded, D, Dp, T(1), w.k.data());
    std::fill(w.dk.begin(), w.dk.begin() + nk_padded * Dp, T(0));
    std::fill(w.dv.begin(), w.dv.begin() + nk_padded * Dp, T(0));
    // Causal: query tiles wholly before j0 see none of these keys.
    for (std::int64_t i0 = P.causal ? j0 / kBlockQ * kBlockQ : 0; i0 < Tq; i0 += kBlockQ) {
      const std::int64_t nq = std::min(kBlockQ, Tq - i0), nq_padded = round_up(nq, Tile::kRows);
      const std::int64_t diag = P.diagonal(i0, j0);
      const T* q_tile = w.q.data() + i0 * Dp;
      const T* dout_tile = w.dout.data() + i0 * Dp;
      product_scores<T, Tile>(nq_padded, nk_padded, D, q_tile, Dp, w.kt.data(), kBlockK, p, kBlockK, diag);
      product_scores<T, Tile>(nq_padded, nk_padded, D, dout_tile, Dp, w.vt.data(), kBlockK, ds, kBlockK, diag);
      for (std::int64_t r = 0; r < nq_padded; ++r) {
        const std::int64_t i = i0 + r;
        T* __restrict pr = p + r * kBlockK;
        T* __restrict dsr = ds + r * kBlockK;
        // Keys [end, nk) are causally hidden from this row, and all are on a row with every key hidden.
        const std::int64_t end =
            r < nq && lse[i] != neg_inf ? std::clamp<std::int64_t>(r + diag + 1, 0, nk) : 0;
        std::fill(pr + end, pr + nk_padded, T(0));
        std::fill(dsr + end, dsr + nk_padded, T(0));
        if (end == 0) continue;
        apply_mask(P.mask_row(b, h, i), mask_stride, j0, end, pr);
        exp_shifted(pr, end, lse[i]);  // P_ij, 0 where hidden
        const T di = delta[i];
        if (P.dropout_p > 0) {
          T* __restrict z = w.z.data();
          dropout_factors(P, b, h, i, j0, end, z);
          for (std::int64_t j = 0; j < end; ++j) {
            dsr[j] = pr[j] * (dsr[j] * z[j] - di);  // dS_ij
            pr[j] *= z[j];                          // P_ij Z_ij
          }
        } else {
          for (std::int64_t j = 0; j < end; ++j) dsr[j] = pr[j] * (dsr[j] - di);
        }
      }
      accumulate_keys<T, Tile>(nk_padded, Dp, nq_padded, p, kBlockK, dout_tile, Dp, w.dv.data(), Dp, diag);
      accumulate_keys<T, Tile>(nk_padded, Dp, nq_padded, ds, kBlockK, q_tile, Dp, w.dk.data(), Dp, diag);
      accumulate_queries<T, Tile>(nq_padded, Dp, nk, ds, kBlockK, w.k.data(), Dp, dq + i0 * Dp, Dp, diag);
    }
    T* dk = io.dk + (bh * Tk + j0) * D;
    T* dv = io.dv + (bh * Tk + j0) * D;
    for (std::int64_t j = 0; j < nk; ++j) {
      std::copy(w.dk.data() + j * Dp, w.dk.data() + j * Dp + D, dk + j * D);
      std::copy(w.dv.data() + j * Dp, w.dv.data() + j * Dp + D, dv + j * D);
    }
  }
  T* dq_out = io.dq + bh * Tq * D;
  for (std::int64_t i = 0; i < Tq; ++i)
    for (std::int64_t d = 0; d < D; ++d) dq_out[i * D + d] = P.scale * dq[i * Dp + d];
}

template <typename T, typename Tile>
AG_ALWAYS_INLINE void backward_heads(const Problem<T>& P, const BackwardIo<T>& io, std::int64_t begin,
                                     std::int64_t end) {
  BackwardScratch<T> scratch(round_up(P.Tq, Tile::kRows), P.Tq, P.D, round_up(P.D, Simd<T>::kLanes));
  for (std::int64_t bh = begin; bh < end; ++bh) backward_head<T, Tile>(P, io, scratch, bh / P.H, bh % P.H);
}

// ---- entry points per instruction set ---------------------------------------------------

template <typename T>
AG_TARGET_AVX512 void forward_tasks_avx512(const Problem<T>& P, const ForwardOutputs<T>& O, std::int64_t begin,
                                           std::int64_t end) {
  forward_tasks<T, TileAvx512>(P, O, begin, end);
}
template <typename T>
AG_TARGET_AVX2 void forward_tasks_avx2(const Problem<T>& P, const ForwardOutputs<T>& O, std::int64_t begin,
                                       std::int64_t end) {
  forward_tasks<T, TileAvx2>(P, O, begin, end);
}
template <typename T>
void forward_tasks_baseline(const Problem<T>& P, const ForwardOutputs<T>& O, std::int64_t begin, std::int64_t end) {
  forward_tasks<T, TileBaseline>(P, O, begin, end);
}
template <typename T>
void forward_tasks_any(const Problem<T>& P, const ForwardOutputs<T>& O, std::int64_t begin, std::int64_t end) {
  switch (cpu_isa()) {
    case Isa::avx512: return forward_tasks_avx512(P, O, begin, end);
    case Isa::avx2: return forward_tasks_avx2(P, O, begin, end);
    case Isa::baseline: return forward_tasks_baseline(P, O, begin, end);
  }
}

template <typename T>
AG_TARGET_AVX512 void backward_heads_avx512(const Problem<T>& P, const BackwardIo<T>& io, std::int64_t begin,
                                            std::int64_t end) {
  backward_heads<T, TileAvx512>(P, io, begin, end);
}
template <typename T>
AG_TARGET_AVX2 void backward_heads_avx2(const Problem<T>& P, const BackwardIo<T>& io, std::int64_t begin,
                                        std::int64_t end) {
  backward_heads<T, TileAvx2>(P, io, begin, end);
}
template <typename T>
void backward_heads_baseline(const Problem<T>& P, const BackwardIo<T>& io, std::int64_t begin, std::int64_t end) {
  backward_heads<T, TileBaseline>(P, io, begin, end);
}
template <typename T>
void backward_heads_any(const Problem<T>& P, const BackwardIo<T>& io, std::int64_t begin, std::int64_t end) {
  switch (cpu_isa()) {
    case Isa::avx512: return backward_heads_avx512(P, io, begin, end);
    case Isa::avx2: return backward_heads_avx2(P, io, begin, end);
    case Isa::baseline: return backward_heads_baseline(P, io, begin, end);
  }
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
    const ForwardOutputs<T> O{out_bthd.data<T>(), r.lse.data<T>(),
                              options.return_weights ? r.weights.data<T>() : nullptr};
    const std::int64_t blocks = (Tq + kBlockQ - 1) / kBlockQ;
    parallel_for(0, B * H * blocks, 1,
                 [&](std::int64_t begin, std::int64_t end) { forward_tasks_any(P, O, begin, end); });
  });
  return r;
}

kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionKernelOptions& options) {
  const std::int64_t B = q.size(0), H = q.size(1);
  kernels::AttentionGrads g{empty(q.sizes(), q.options()), empty(k.sizes(), k.options()),
                            empty(v.sizes(), v.options())};
  if (g.dq.numel() == 0 && g.dk.numel() == 0) return g;
  AG_DISPATCH_FLOAT(q.dtype(), "attention backward", [&] {
    using T = scalar_t;
    const Problem<T> P = make_problem<T>(q, k, v, mask, options);
    const BackwardIo<T> io{rows_of<T>(dout), rows_of<T>(out), lse.data<T>(), g.dq.data<T>(), g.dk.data<T>(),
                           g.dv.data<T>()};
    parallel_for(0, B * H, 1, [&](std::int64_t begin, std::int64_t end) { backward_heads_any(P, io, begin, end); });
  });
  return g;
}

}  // namespace attograd::cpu
