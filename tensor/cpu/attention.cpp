// Fused attention on the CPU, flash-attention style (Dao et al. 2022, 2023):
// queries and keys are processed in tiles with an online softmax, so no
// (Tq, Tk) score matrix is needed; the forward saves one log-sum-exp per
// query row and the backward recomputes the probabilities from it. Within a
// memory budget the forward keeps its probability tiles instead, and the
// backward skips that recomputation (see "saved probabilities").
//
// The tasks are (batch, head, query block) in the forward and (batch, head)
// in the backward, handed to threads one at a time as they come free
// (parallel_tasks), not in fixed shares. Every product is a small
// GEMM done by one register-blocked micro-kernel (as BLIS and OpenBLAS do):
// an MR x NR tile of C stays in vector registers while it accumulates over
// the shared dimension, each step one vector load of B and MR broadcasts of
// A feeding MR x NR/lanes multiply-adds. The two products of the forward and
// the five of the backward differ only in the strides A is read with.
//
// The forward keeps its score tiles transposed, (keys, queries): S^T =
// k (scale q)^T needs only the queries transposed (once per query block,
// D x 64 values), reads k and v rows where they lie, and puts queries along
// the vector lanes, so the online softmax's per-query max, sum and rescaling
// are plain vector operations down the rows, with no horizontal reductions.
// The backward, which has no running reduction, keeps them (queries, keys):
// it transposes each key tile once and reads q and do rows where they lie.
// Tiles, micro-tiles and key ranges wholly hidden by the causal flag are
// skipped. The exponentials are tensor/cpu/vec_math.h's polynomial for
// float32, trimmed to the softmax's arguments (libm's for float64, which
// serves gradcheck).
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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/philox_block.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/parallel.h"
#include "tensor/rng.h"

// Everything below the per-instruction-set entry points is forced inline into
// them (AG_ALWAYS_INLINE, vec_math.h), so it is compiled for their target (see
// "instruction sets" below).

namespace attograd::cpu {
namespace {

constexpr std::int64_t kBlockQ = 64;  // queries per tile; a multiple of every vector width and micro-tile height
constexpr std::int64_t kBlockK = 64;  // keys per tile; a multiple of every micro-tile height
// A diagonal offset no index reaches: "no causal limit" in the tile loops below.
constexpr std::int64_t kNoDiagonal = std::int64_t(1) << 40;

std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Scratch buffers start on a cache line, so that their rows (whole vectors
// long) do too: a vector load or store across two lines costs two, and
// std::vector's allocator only promises 16 bytes. With its operands 16 bytes
// off a line, one 64 x 64 x 64 tile product in L1 ran 10-35% slower.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlignment); }
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) { return true; }
};
template <typename T>
using Scratch = std::vector<T, CacheLineAllocator<T>>;

// ---- instruction sets ------------------------------------------------------------
// The vector width and the micro-kernel's register tile depend on the
// register file: AVX-512 has 32 registers of 64 bytes, AVX2 16 of 32, SSE2 16
// of 16. Function multi-versioning (AG_SIMD_CLONES) compiles one body per
// target, so it cannot change them; instead each is its own template
// instance, compiled under its target attribute and picked once at run time
// from the CPU's features.

// GCC's portable vectors of kBytes (one register of the target).
template <typename T, int kBytes>
struct Simd {
  typedef T Vec __attribute__((vector_size(kBytes)));
  using Lane = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  typedef Lane Index __attribute__((vector_size(kBytes)));  // lane indices of a shuffle
  static constexpr std::int64_t kLanes = kBytes / static_cast<int>(sizeof(T));
};

// Vectors of kBytes; the micro-kernel holds kRows x kVecs of them of C in
// registers. Where a row group's columns are whole multiples of kWideVecs
// vectors, it runs as kRows / kWideRows micro-tiles of kWideRows x kWideVecs
// instead (kWideRows = 0: never, and then no kWideVecs is declared, as clang
// warns of an unused one): with AVX-512, 4 x 4 vectors feed 16 multiply-adds
// from 4 broadcasts and 4 loads, 8 x 2 from 8 and 2, and at D = 64 (one
// 4-vector row of output) the wide tile made the L forward about 10% and
// forward + backward 5-12% faster; at D = 32 only 8 x 2 fits the output rows.
struct TileAvx512 {
  static constexpr int kBytes = 64, kRows = 8, kVecs = 2;  // 16 accumulators of 32 registers
  static constexpr int kWideRows = 4, kWideVecs = 4;       // also 16
};
struct TileAvx2 {
  static constexpr int kBytes = 32, kRows = 4, kVecs = 3;  // 12 of 16
  static constexpr int kWideRows = 0;
};
struct TileBaseline {
  static constexpr int kBytes = 16, kRows = 4, kVecs = 2;  // 8 of 16
  static constexpr int kWideRows = 0;
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

enum class Isa { avx512, avx2, baseline };  // widest first
constexpr const char* kIsaNames[] = {"avx512", "avx2", "baseline"};

Isa supported_isa() {
#if AG_ATTENTION_ISA_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Isa::avx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::avx2;
#endif
  return Isa::baseline;
}

// The widest path the CPU runs, or a narrower one named by
// ATTOGRAD_ATTENTION_ISA: so the AVX2 and baseline paths can be tested and
// timed on an AVX-512 machine. A path wider than the CPU's is refused, not
// run into an illegal instruction.
Isa cpu_isa() {
  static const Isa isa = [] {
    const Isa widest = supported_isa();
    const char* env = std::getenv("ATTOGRAD_ATTENTION_ISA");
    if (env == nullptr || *env == '\0') return widest;
    for (int i = 0; i < static_cast<int>(std::size(kIsaNames)); ++i) {
      if (std::strcmp(env, kIsaNames[i]) != 0) continue;
      AG_CHECK(static_cast<int>(widest) <= i, "attention", "ATTOGRAD_ATTENTION_ISA={} is wider than this CPU's {}",
               env, kIsaNames[static_cast<int>(widest)]);
      return static_cast<Isa>(i);
    }
    fail("attention", "ATTOGRAD_ATTENTION_ISA={} is not one of avx512, avx2, baseline", env);
  }();
  return isa;
}

// ---- vectors and the exponential of the softmax ------------------------------------

template <typename Vec, typename T>
AG_ALWAYS_INLINE void load(Vec& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}
template <typename T, typename Vec>
AG_ALWAYS_INLINE void store(T* p, const Vec& v) {
  std::memcpy(p, &v, sizeof v);
}

// x = exp(x) lane by lane, for the softmax's arguments s - max <= 0 (-inf
// gives 0, NaN stays NaN): the range reduction and polynomial of exp_fast
// (tensor/cpu/vec_math.h), with its values, written on vectors and without
// the overflow handling arbitrary arguments need: 17 vector instructions
// with AVX-512, under half of the auto-vectorised exp_fast's. Valid for
// x <= 88, where it equals exp_fast bit for bit. float64 serves gradcheck: it
// takes libm's exp, lane by lane.
template <typename Vec>
AG_ALWAYS_INLINE void exp_softmax(Vec& x) {
  using T = std::remove_cvref_t<decltype(x[0])>;
  constexpr std::int64_t kLanes = Simd<T, sizeof(Vec)>::kLanes;
  if constexpr (std::is_same_v<T, double>) {
    for (std::int64_t l = 0; l < kLanes; ++l) x[l] = std::exp(x[l]);
  } else {
    // No clamping: lanes below lo (-inf among them) are set to 0 at the end, whatever
    // they computed on the way, and a NaN makes er, so the result, NaN.
    const Vec lo = Vec{} + -87.33654f;
    // Adding 1.5 * 2^23 rounds to an integer n, which t then holds in its low mantissa bits.
    constexpr float kRound = 12582912.0f;
    const Vec t = x * 1.44269504088896341f + kRound;
    const Vec n = t - kRound;
    Vec r = x - n * 0.693359375f;  // ln 2 split in two for an exact product
    r = r - n * -2.12194440e-4f;
    Vec p = Vec{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const Vec er = p * r * r + r + 1.0f;
    // 2^n, n in [-126, 127], from t's bits: they are kRound's plus n, and kRound's
    // (0x4B400000) shifted left by 23 are 0, so 2^n's are (bits(t) + 127) << 23.
    // Cheaper than converting n to integers, and no conversion of a NaN.
    typedef std::uint32_t Bits __attribute__((vector_size(sizeof(Vec))));
    Bits bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;
    Vec two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    x = x < lo ? Vec{} : er * two_n;
  }
}

// ---- the micro-kernel and the three tile products made of it ----------------------

// C[i][j] = C0[i][j] + sum_{k0 <= k < k1} A(i, k) B[k][j] for i < MR and j < NV
// vectors, with A(i, k) = a[i * a_rs + k * a_ks], rows of B and C ldb and ldc
// apart, and C0 = 0 (overwrite), C (accumulate) or C scaled by row_scale[i].
// The MR x NV accumulators are compile-time indexed once the loops unroll,
// so they live in registers.
enum class Into { overwrite, accumulate, rescale_and_accumulate };

template <typename T, int kBytes, int MR, int NV>
AG_ALWAYS_INLINE void micro_kernel(const T* __restrict a, std::int64_t a_rs, std::int64_t a_ks,
                                   const T* __restrict b, std::int64_t ldb, std::int64_t k0, std::int64_t k1,
                                   T* __restrict c, std::int64_t ldc, Into into, const T* __restrict row_scale) {
  using Vec = typename Simd<T, kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, kBytes>::kLanes;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = Vec{};
      if (into != Into::overwrite) std::memcpy(&acc[i][v], c + i * ldc + v * W, sizeof(Vec));
      if (into == Into::rescale_and_accumulate) acc[i][v] *= row_scale[i];
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

// The last n < (NV + 1) vectors of a row group's columns: one micro-kernel as
// wide as fits, then the narrower ones, so that a rest of 2 vectors runs as
// one tile of 2 x MR accumulators, not two of MR that wait on their latency.
template <typename T, typename Tile, int NV>
AG_ALWAYS_INLINE void narrow_tiles(std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                                   std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c, std::int64_t ldc,
                                   Into into, const T* row_scale) {
  if constexpr (NV > 0) {
    constexpr std::int64_t kWidth = NV * Simd<T, Tile::kBytes>::kLanes;
    if (n >= kWidth) {
      micro_kernel<T, Tile::kBytes, Tile::kRows, NV>(a, a_rs, a_ks, b, ldb, k0, k1, c, ldc, into, row_scale);
      b += kWidth, c += kWidth, n -= kWidth;
    }
    narrow_tiles<T, Tile, NV - 1>(n, a, a_rs, a_ks, b, ldb, k0, k1, c, ldc, into, row_scale);
  }
}

// The micro-kernel over the columns [0, n) of one row group, n a multiple of
// the vector width: full MR x NR tiles, then narrower ones for the rest.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void row_group(std::int64_t n, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                                std::int64_t ldb, std::int64_t k0, std::int64_t k1, T* c, std::int64_t ldc,
                                Into into, const T* row_scale = nullptr) {
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes, NR = Tile::kVecs * W;
  if constexpr (Tile::kWideRows > 0) {
    constexpr std::int64_t kWideN = Tile::kWideVecs * W;
    if (n % kWideN == 0) {
      for (int r = 0; r < Tile::kRows; r += Tile::kWideRows)
        for (std::int64_t j = 0; j < n; j += kWideN)
          micro_kernel<T, Tile::kBytes, Tile::kWideRows, Tile::kWideVecs>(
              a + r * a_rs, a_rs, a_ks, b + j, ldb, k0, k1, c + r * ldc + j, ldc, into,
              row_scale ? row_scale + r : nullptr);
      return;
    }
  }
  std::int64_t j = 0;
  for (; j + NR <= n; j += NR)
    micro_kernel<T, Tile::kBytes, Tile::kRows, Tile::kVecs>(a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, into,
                                                            row_scale);
  narrow_tiles<T, Tile, Tile::kVecs - 1>(n - j, a, a_rs, a_ks, b + j, ldb, k0, k1, c + j, ldc, into, row_scale);
}

// What the products below do between row groups: nothing, or a few software
// prefetches, so that a tile's prefetches do not all wait at once for the
// line fill buffers.
struct NoOp {
  void operator()() const {}
};

// In the three products below, a score tile (S, P or dS) is kept one of two
// ways round: with keys c for rows and queries r for columns (the forward's
// S^T, so the online softmax runs down rows), or with queries for rows (the
// backward's, so it reads q and do rows where they lie). Key c is visible to
// query r only when c <= r + diag (diag = i0 - j0 for a causal tile at
// (i0, j0), kNoDiagonal otherwise). Row and column counts are multiples of
// the micro-tile; buffers are zero-padded to them.
enum class TileRows { keys, queries };

// Scores: C (m, n) = A (m, K) Bt (K, n), A(x, k) = a[x * lda + k]. Columns of
// a row group that none of its rows sees are left unwritten (with keys for
// rows, the queries before the first that sees key c0; with queries for rows,
// the keys after the last that query r + MR - 1 sees); the caller hides them.
template <typename T, typename Tile, TileRows kRows, typename Between = NoOp>
AG_ALWAYS_INLINE void product_scores(std::int64_t m, std::int64_t n, std::int64_t K, const T* a, std::int64_t lda,
                                     const T* bt, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t diag,
                                     Between between = {}) {
  constexpr std::int64_t MR = Tile::kRows, W = Simd<T, Tile::kBytes>::kLanes;
  for (std::int64_t x0 = 0; x0 < m; x0 += MR) {
    std::int64_t first = 0, last = n;
    if constexpr (kRows == TileRows::keys)
      first = std::clamp<std::int64_t>(x0 - diag, 0, n) / W * W;
    else
      last = round_up(std::clamp<std::int64_t>(x0 + MR + diag, 0, n), W);
    row_group<T, Tile>(last - first, a + x0 * lda, lda, 1, bt + first, ldb, 0, K, c + x0 * ldc + first, ldc,
                       Into::overwrite);
    between();
  }
}

// Element (key c, query r) of a score tile with rows ld apart.
template <TileRows kRows>
constexpr std::int64_t key_stride(std::int64_t ld) {
  return kRows == TileRows::keys ? ld : 1;
}
template <TileRows kRows>
constexpr std::int64_t query_stride(std::int64_t ld) {
  return kRows == TileRows::keys ? 1 : ld;
}

// Query-side accumulation: C (m queries, n) (+)= A^T B for the score tile A
// of kk keys and m queries, rows lda apart, zero where hidden, so row group r
// stops at the last key it sees. For out += P v (each row first rescaled by
// row_scale) and dq += dS k.
template <typename T, typename Tile, TileRows kRows, typename Between = NoOp>
AG_ALWAYS_INLINE void accumulate_queries(std::int64_t m, std::int64_t n, std::int64_t kk, const T* a,
                                         std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                                         std::int64_t diag, Into into, const T* row_scale = nullptr,
                                         Between between = {}) {
  constexpr std::int64_t MR = Tile::kRows;
  const std::int64_t a_rs = query_stride<kRows>(lda), a_ks = key_stride<kRows>(lda);
  for (std::int64_t r = 0; r < m; r += MR) {
    const std::int64_t end = std::clamp<std::int64_t>(r + MR + diag, 0, kk);
    row_group<T, Tile>(n, a + r * a_rs, a_rs, a_ks, b, ldb, 0, end, c + r * ldc, ldc, into,
                       row_scale ? row_scale + r : nullptr);
    between();
  }
}

// Key-side accumulation: C (m keys, n) (+)= A B for the score tile A of m
// keys and kk queries, rows lda apart, zero where hidden, so row group c
// starts at the first query that sees it. For dv += P^T do and dk += dS^T q.
template <typename T, typename Tile, TileRows kRows>
AG_ALWAYS_INLINE void accumulate_keys(std::int64_t m, std::int64_t n, std::int64_t kk, const T* a, std::int64_t lda,
                                      const T* b, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t diag,
                                      Into into) {
  constexpr std::int64_t MR = Tile::kRows;
  const std::int64_t a_rs = key_stride<kRows>(lda), a_ks = query_stride<kRows>(lda);
  for (std::int64_t c0 = 0; c0 < m; c0 += MR) {
    const std::int64_t begin = std::clamp<std::int64_t>(c0 - diag, 0, kk);
    row_group<T, Tile>(n, a + c0 * a_rs, a_rs, a_ks, b, ldb, begin, kk, c + c0 * ldc, ldc, into);
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

// A (B, H, T, D) output written through its strides; the last dim is contiguous.
template <typename T>
struct OutRows {
  T* base;
  std::int64_t sb, sh, st;
  T* row(std::int64_t b, std::int64_t h, std::int64_t t) const { return base + b * sb + h * sh + t * st; }
};

template <typename T>
OutRows<T> out_rows_of(const Tensor& x) {
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
  // Key c of a tile at (i0, j0) is visible to its query r only when c <= r + diagonal(i0, j0).
  std::int64_t diagonal(std::int64_t i0, std::int64_t j0) const { return causal ? i0 - j0 : kNoDiagonal; }
  // The first query of the first query block that can see keys from j0 on:
  // causally, blocks wholly before j0 see none of them.
  std::int64_t first_query_tile(std::int64_t j0) const { return causal ? j0 / kBlockQ * kBlockQ : 0; }
  const bool* mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return mask + b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2];
  }
};

// z[j] = dropout factor of weight (b, h, i, j0 + j), j < n: 0 when
// philox_uniform(seed, offset, flat) < p, else 1/(1-p).
template <typename T>
AG_ALWAYS_INLINE void dropout_factors(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i,
                                      std::int64_t j0, std::int64_t n, T* z) {
  const std::uint64_t first = static_cast<std::uint64_t>(((b * P.H + h) * P.Tq + i) * P.Tk + j0);
  philox_dropout_factors(P.seed, P.offset, first, n, static_cast<float>(P.dropout_p), P.keep_scale, z);
}

// ---- packing ---------------------------------------------------------------------------

// A block of rows of an operand as the micro-kernel reads it: rows ld apart,
// each at least Dp long (D rounded up to the vector width).
template <typename T>
struct Panel {
  const T* data;
  std::int64_t ld;
};

// Rows that are not back to back (a packed (B, T, 3C) projection's q, k and
// v rows are 3C apart, as MultiHeadAttention attends them) are slower to read
// again and again than compact ones: at the L shape (T = 1024, rows 6 KiB
// apart) the fused forward took 1.25x and the backward 1.3x their time on
// contiguous q, k, v, the forward's extra time mostly spent waiting on the
// software prefetches of the next tile's rows. A head's rows are read once
// per tile of the other side, so copying them compact first pays on long
// heads, and costs on short ones, where each row is read only a few times:
// copying from 512 rows up gained 2-16% at T = 512 and 1024 (D = 32 and
// 64), and copying all lengths lost 3-10% at T = 64, 128 and 256 (probes at
// one thread, this project's Ice Lake VM).
constexpr std::int64_t kCopyStridedFromRows = 512;

// Whether n rows ld apart are read where they lie, when each tile of
// other_rows rows (the queries to keys and values, the keys to queries) reads
// them once: D a multiple of the vector width, no padding rows, and the rows
// back to back or read only a few times.
AG_ALWAYS_INLINE bool read_in_place(std::int64_t ld, std::int64_t n, std::int64_t n_padded, std::int64_t D,
                                    std::int64_t Dp, std::int64_t other_rows) {
  return D == Dp && n == n_padded && (ld == Dp || n <= 1 || other_rows < kCopyStridedFromRows);
}

// out (n_padded, Dp) = rows [t0, t0 + n) of (b, h), zero-padded.
template <typename T>
AG_ALWAYS_INLINE void copy_compact(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                   std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t Dp,
                                   T* __restrict out) {
  for (std::int64_t r = 0; r < n; ++r) {
    const T* __restrict src = x.row(b, h, t0 + r);
    std::copy(src, src + D, out + r * Dp);
    std::fill(out + r * Dp + D, out + (r + 1) * Dp, T(0));
  }
  std::fill(out + n * Dp, out + n_padded * Dp, T(0));
}

// Rows [t0, t0 + n) of (b, h), readable as n_padded rows of Dp values: the
// tensor itself when read_in_place (other_rows as there), else a copy in
// `scratch`, zero-padded.
template <typename T>
AG_ALWAYS_INLINE Panel<T> rows_panel(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                     std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t Dp,
                                     std::int64_t other_rows, T* __restrict scratch) {
  if (read_in_place(x.st, n, n_padded, D, Dp, other_rows)) return {x.row(b, h, t0), x.st};
  copy_compact(x, b, h, t0, n, n_padded, D, Dp, scratch);
  return {scratch, Dp};
}

// A W x W transpose in registers (W = lanes per vector), as log2(W) rounds of
// a butterfly: round B pairs vectors B apart and interleaves their lanes in
// blocks of B. With AVX-512 each shuffle is one two-source permute, so a
// 16 x 16 block costs about 100 instructions instead of 256 scattered stores;
// elsewhere GCC lowers the shuffles poorly and pack_transposed stores lanes.
template <int W, int B, bool kUpper>
constexpr int interleave_lane(int k) {  // lane k of the shuffle of round B
  const int segment = k / (2 * B) * (2 * B), offset = k % (2 * B), half = kUpper ? B : 0;
  return offset < B ? segment + half + offset : W + segment + half + offset - B;
}
template <typename S, int B, bool kUpper, typename Lanes = std::make_index_sequence<S::kLanes>>
struct Interleave;
template <typename S, int B, bool kUpper, std::size_t... K>
struct Interleave<S, B, kUpper, std::index_sequence<K...>> {
  static constexpr typename S::Index mask{interleave_lane<S::kLanes, B, kUpper>(K)...};
};
// *out = lanes mask[k] of (x, y), mask = Interleave<S, B, kUpper>::mask. Clang (the sanitizer
// and fuzzing build) has no __builtin_shuffle; its __builtin_shufflevector takes constant lanes.
template <typename S, int B, bool kUpper, std::size_t... K>
AG_ALWAYS_INLINE void interleave(const typename S::Vec& x, const typename S::Vec& y, typename S::Vec* out,
                                 std::index_sequence<K...>) {
#if defined(__clang__)
  *out = __builtin_shufflevector(x, y, interleave_lane<S::kLanes, B, kUpper>(K)...);
#else
  *out = __builtin_shuffle(x, y, Interleave<S, B, kUpper>::mask);
#endif
}
template <typename S, int B>
AG_ALWAYS_INLINE void butterfly(typename S::Vec* v) {
  constexpr int W = S::kLanes;
  if constexpr (B < W) {
    for (int i = 0; i < W; i += 2 * B)
      for (int j = i; j < i + B; ++j) {
        const auto x = v[j], y = v[j + B];
        interleave<S, B, false>(x, y, &v[j], std::make_index_sequence<W>());
        interleave<S, B, true>(x, y, &v[j + B], std::make_index_sequence<W>());
      }
    butterfly<S, 2 * B>(v);
  }
}

// out (D, ld) = factor * rows [t0, t0 + n) of (b, h) transposed, zero in columns [n, n_padded).
template <typename T, typename Tile>
AG_ALWAYS_INLINE void pack_transposed(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0,
                                      std::int64_t n, std::int64_t n_padded, std::int64_t D, std::int64_t ld,
                                      T factor, T* __restrict out) {
  using S = Simd<T, Tile::kBytes>;
  using Vec = typename S::Vec;
  constexpr std::int64_t W = S::kLanes;
  std::int64_t j = 0, d_blocks = 0;
  if constexpr (std::is_same_v<Tile, TileAvx512>) {
    d_blocks = D / W * W;
    for (; j + W <= n; j += W)
      for (std::int64_t d = 0; d < d_blocks; d += W) {
        Vec v[W];
        for (std::int64_t i = 0; i < W; ++i) {
          std::memcpy(&v[i], x.row(b, h, t0 + j + i) + d, sizeof(Vec));
          v[i] *= factor;
        }
        butterfly<S, 1>(v);
        for (std::int64_t i = 0; i < W; ++i) std::memcpy(out + (d + i) * ld + j, &v[i], sizeof(Vec));
      }
    for (std::int64_t r = 0; r < j; ++r) {  // the columns past the last whole block
      const T* __restrict src = x.row(b, h, t0 + r);
      for (std::int64_t d = d_blocks; d < D; ++d) out[d * ld + r] = factor * src[d];
    }
  }
  for (; j < n; ++j) {
    const T* __restrict src = x.row(b, h, t0 + j);
    for (std::int64_t d = 0; d < D; ++d) out[d * ld + j] = factor * src[d];
  }
  for (std::int64_t d = 0; d < D; ++d) std::fill(out + d * ld + n, out + d * ld + n_padded, T(0));
}

// ---- software prefetch -----------------------------------------------------------------
// The hardware prefetchers follow long sequential runs, but a head's rows are
// short runs (and strided ones when q, k, v are views of one packed
// projection): without help the kernels waited on memory for a quarter of
// their time at the GPT shape. So each task queues the rows its successor
// starts with and requests a slice of them after each of its own tiles, and
// each key tile requests the next tile's keys and values.

// Requests the lines of rows [t0, t0 + n) of (b, h), each line once.
template <typename T, int kLocality = 3>
AG_ALWAYS_INLINE void prefetch_rows(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
                                    std::int64_t D) {
  const std::int64_t bytes = D * static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t t = t0; t < t0 + n; ++t) {
    const auto row = reinterpret_cast<std::uintptr_t>(x.row(b, h, t));
    for (std::uintptr_t line = row & ~std::uintptr_t(63); line < row + bytes; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, kLocality);
  }
}

// Rows queued for prefetching, requested a few at a time.
template <typename T>
class PrefetchQueue {
 public:
  explicit PrefetchQueue(std::int64_t D) : D_(D) {}
  // Queues rows [t0, t0 + n) of (b, h).
  void add(const Rows<T>& x, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n) {
    if (n <= 0 || count_ == kMaxRuns) return;
    runs_[count_++] = {x, b, h, t0, n};
    rows_ += n;
  }
  std::int64_t rows() const { return rows_; }
  // Spreads the queued rows over `steps` calls of step().
  void pace(std::int64_t steps) { per_step_ = (rows_ + steps - 1) / std::max<std::int64_t>(steps, 1); }
  template <int kLocality = 1>
  void step() {
    request<kLocality>(per_step_);
  }
  // Requests the next n queued rows.
  template <int kLocality = 1>
  void request(std::int64_t n) {
    while (n > 0 && current_ < count_) {
      const Run& run = runs_[current_];
      const std::int64_t take = std::min(n, run.n - done_);
      prefetch_rows<T, kLocality>(run.x, run.b, run.h, run.t0 + done_, take, D_);
      n -= take;
      done_ += take;
      if (done_ == run.n) ++current_, done_ = 0;
    }
  }

 private:
  static constexpr int kMaxRuns = 8;
  struct Run {
    Rows<T> x;
    std::int64_t b, h, t0, n;
  };
  std::int64_t D_;
  Run runs_[kMaxRuns] = {};
  int count_ = 0, current_ = 0;
  std::int64_t rows_ = 0, done_ = 0, per_step_ = 0;
};

// The lines of one span of memory, requested into L2 a slice per step() over `steps` calls.
class SpanPrefetch {
 public:
  SpanPrefetch(const void* begin, std::int64_t bytes, std::int64_t steps)
      : next_(reinterpret_cast<std::uintptr_t>(begin) & ~std::uintptr_t(63)),
        end_(reinterpret_cast<std::uintptr_t>(begin) + static_cast<std::uintptr_t>(std::max<std::int64_t>(bytes, 0))),
        per_step_((static_cast<std::int64_t>(end_ - next_) / 64 + steps) / std::max<std::int64_t>(steps, 1)) {}
  AG_ALWAYS_INLINE void step() {
    for (std::int64_t n = 0; n < per_step_ && next_ < end_; ++n, next_ += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(next_), 0, 2);
  }

 private:
  std::uintptr_t next_, end_;
  std::int64_t per_step_;
};

// A task's successor is prefetched only when what it reads first is this
// small; bigger ones would push the current task's data out of L2.
constexpr std::int64_t kPrefetchBytes = 256 << 10;
// The forward requests the next key tile into L1 (prefetcht0), spread over
// the current tile's row groups. Requested all at once before the tile, its
// 2 x 64 rows (some 600 prefetches) waited for the line fill buffers: 7% of
// the forward's samples at L sat on them. Into L2 only, it gained less.
constexpr int kNextTileLocality = 3;

// ---- tasks -------------------------------------------------------------------------------

// The tasks a TaskQueue hands this thread, one at a time, each with its
// successor: the task this thread runs next, or -1. With look_ahead the
// thread claims its next chunk as it starts the last task of the current
// one, so that task can request its successor's first rows; it then holds
// one chunk it has not started, so without a successor worth prefetching it
// claims only once it is free. (A class, not a loop taking a lambda: a
// lambda's body would be compiled for the baseline target, not the one of
// the kernel it serves.)
class ClaimedTasks {
 public:
  ClaimedTasks(TaskQueue& queue, bool look_ahead) : queue_(queue), look_ahead_(look_ahead) {}
  AG_ALWAYS_INLINE bool next(std::int64_t& task, std::int64_t& successor) {
    if (lo_ == hi_) {
      if (claimed_ahead_) {
        lo_ = ahead_lo_;
        hi_ = ahead_hi_;
        claimed_ahead_ = false;
      } else if (!queue_.next(lo_, hi_)) {
        return false;
      }
    }
    task = lo_++;
    if (lo_ < hi_)
      successor = lo_;
    else if (look_ahead_ && (claimed_ahead_ = queue_.next(ahead_lo_, ahead_hi_)))
      successor = ahead_lo_;
    else
      successor = -1;
    return true;
  }

 private:
  TaskQueue& queue_;
  const bool look_ahead_;
  std::int64_t lo_ = 0, hi_ = 0, ahead_lo_ = 0, ahead_hi_ = 0;
  bool claimed_ahead_ = false;
};

// ---- hiding keys in a score tile ------------------------------------------------------

// Sets the hidden entries of the score tile s (m rows ld apart, n columns)
// to `hidden`: those of causally hidden pairs (key c > query r + diag; the
// columns product_scores may have left unwritten are among them) and those of
// padding keys c >= nk.
template <TileRows kRows, typename T>
AG_ALWAYS_INLINE void hide_causal(T* __restrict s, std::int64_t ld, std::int64_t m, std::int64_t nk, std::int64_t n,
                                  std::int64_t diag, T hidden) {
  for (std::int64_t x = 0; x < m; ++x) {
    T* row = s + x * ld;
    if constexpr (kRows == TileRows::keys) {  // row x is key c: hide queries r < c - diag, or all
      std::fill(row, row + (x >= nk ? n : std::clamp<std::int64_t>(x - diag, 0, n)), hidden);
    } else {  // row x is query r: hide keys c > r + diag and c >= nk
      std::fill(row + std::clamp<std::int64_t>(std::min(x + diag + 1, nk), 0, n), row + n, hidden);
    }
  }
}

// Entry (key c, query r) of the score tile s (rows ld apart) = -inf where the
// mask hides key j0 + c from query i0 + r, c < nk, r < nq.
template <TileRows kRows, typename T>
AG_ALWAYS_INLINE void hide_masked(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0,
                                  std::int64_t nq, std::int64_t j0, std::int64_t nk, T* __restrict s, std::int64_t ld) {
  if (!P.mask) return;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t ms = P.mask_strides[3], ks = key_stride<kRows>(ld), qs = query_stride<kRows>(ld);
  for (std::int64_t r = 0; r < nq; ++r) {
    const bool* m = P.mask_row(b, h, i0 + r) + j0 * ms;
    for (std::int64_t c = 0; c < nk; ++c)
      if (m[c * ms]) s[c * ks + r * qs] = neg_inf;
  }
}

// Entry (key c, query r) of the tile z (rows ld apart) = dropout factor of
// weight (i0 + r, j0 + c), r < nq, c < nk. With keys for rows, each query's
// factors are drawn into `row` (nk values) first; with queries, row is unused.
template <TileRows kRows, typename T>
AG_ALWAYS_INLINE void dropout_tile(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i0,
                                   std::int64_t nq, std::int64_t j0, std::int64_t nk,
                                   std::type_identity_t<T>* __restrict row, T* __restrict z, std::int64_t ld) {
  for (std::int64_t r = 0; r < nq; ++r) {
    if constexpr (kRows == TileRows::queries) {
      dropout_factors(P, b, h, i0 + r, j0, nk, z + r * ld);
    } else {
      dropout_factors(P, b, h, i0 + r, j0, nk, row);
      for (std::int64_t c = 0; c < nk; ++c) z[c * ld + r] = row[c];
    }
  }
}

// ---- saved probabilities ---------------------------------------------------------------
// Within a budget (AttentionKernelOptions::probs_budget) the forward keeps
// the probability tiles of as many whole heads as fit (the first ones,
// b * H + h) for the backward, which recomputes the others'. A kept tile it
// multiplies by one factor per query instead of recomputing S = q k^T and its
// exponentials: four tile products instead of five. A tile is kept
// as the forward has it, keys for rows, exp(s - m) against the running max m
// of its moment, with that m beside it; P = exp(s - m) exp(m - lse).
//
// The tiles of one head are stored in the backward's order, key tile by key
// tile and within one by query block, so that it reads them front to back.
// Each tile's maxima follow it, so the tiles do not lie exactly 16 KiB apart,
// all at one offset within a 4 KiB page. In a probe at L (one thread,
// AVX-512) a forward that kept the tiles took 10.6 ms this way and 11.2 with
// the maxima apart, but the benchmark case could not tell the two apart:
// the probe's gain depended on where its buffers lay.
template <typename T>
struct SavedProbs {
  T* data = nullptr;  // kSlotValues per tile: (kBlockK, kBlockQ) exp(s - m), zero where hidden, before
                      // dropout, then the m of each of its kBlockQ queries
  std::int64_t query_blocks = 0, key_tiles = 0, per_head = 0;
  std::int64_t heads = 0;  // heads 0 .. heads - 1 (b * H + h) keep their tiles; the others recompute them
  bool causal = false;

  static constexpr std::int64_t kTileValues = kBlockK * kBlockQ, kSlotValues = kTileValues + kBlockQ;
  SavedProbs() = default;
  SavedProbs(std::int64_t Tq, std::int64_t Tk, bool is_causal)
      : query_blocks((Tq + kBlockQ - 1) / kBlockQ), key_tiles((Tk + kBlockK - 1) / kBlockK), causal(is_causal) {
    per_head = before(key_tiles);
  }
  // Values kept for B * H heads.
  std::int64_t values(std::int64_t heads) const { return heads * per_head * kSlotValues; }
  // Tiles of a head's key tiles before kb. Causally, key tile kb is seen by
  // query blocks kb and later only (kBlockQ == kBlockK).
  std::int64_t before(std::int64_t kb) const {
    if (!causal) return kb * query_blocks;
    const std::int64_t n = std::min(kb, query_blocks);
    return n * query_blocks - n * (n - 1) / 2;
  }
  std::int64_t index(std::int64_t bh, std::int64_t qb, std::int64_t kb) const {
    return bh * per_head + before(kb) + (causal ? qb - kb : qb);
  }
  bool kept(std::int64_t bh) const { return data != nullptr && bh < heads; }
  T* tile(std::int64_t bh, std::int64_t qb, std::int64_t kb) const { return data + index(bh, qb, kb) * kSlotValues; }
  T* tile_max(std::int64_t bh, std::int64_t qb, std::int64_t kb) const { return tile(bh, qb, kb) + kTileValues; }
};
static_assert(kBlockQ == kBlockK, "SavedProbs::before counts causal tiles for square tiles");

// ---- forward ------------------------------------------------------------------------------

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
    const std::int64_t diag = P.diagonal(i0, j0);
    if (w.from_head) hold_head_rows(P, b, h, j0 + nkp, Dp, w.head);
    // The next tile's keys and values, a few rows after each row group of this tile's two
    // products, unless w.head holds them already.
    const bool next_held = w.from_head && w.head.rows >= std::min(j0 + 2 * kBlockK, key_end);
    const std::int64_t next_nk = next_held ? 0 : std::clamp<std::int64_t>(key_end - j0 - kBlockK, 0, kBlockK);
    PrefetchQueue<T> next_tile(D);
    next_tile.add(P.k, b, h, j0 + kBlockK, next_nk);
    next_tile.add(P.v, b, h, j0 + kBlockK, next_nk);
    next_tile.pace(nkp / MR + nqp / MR);
    auto prefetch_next_tile = [&next_tile] { next_tile.template step<kNextTileLocality>(); };
    successor.request((successor.rows() + tiles - 1) / tiles);
    const Panel<T> k = w.keys(P, b, h, j0, nk, nkp, Dp);
    const Panel<T> v = w.values(P, b, h, j0, nk, Dp);
    // The score tile: the saved one itself where the probabilities are kept,
    // written as it is made (copying it from scratch afterwards cost more).
    // On AVX-512 a forward that keeps them takes about 7% longer (one thread,
    // L: 10.6 ms against 9.9); requesting the next tile's lines ahead did not
    // change that.
    const std::int64_t bh = b * P.H + h, qb = i0 / kBlockQ, kb = j0 / kBlockK;
    T* __restrict st = O.saved.kept(bh) ? O.saved.tile(bh, qb, kb) : s;
    product_scores<T, Tile, kKeyRows>(nkp, nqp, D, k.data, k.ld, w.qt.data(), kBlockQ, st, kBlockQ, diag,
                                      prefetch_next_tile);  // S^T
    hide_causal<kKeyRows>(st, kBlockQ, nkp, nk, nqp, diag, neg_inf);
    hide_masked<kKeyRows>(P, b, h, i0, nq, j0, nk, st, kBlockQ);
    online_softmax_tile<T, Tile>(st, nkp, nqp, m, l, rescale);
    if (O.saved.kept(bh)) std::copy(m, m + nqp, O.saved.tile_max(bh, qb, kb));
    const T* weights_tile = st;  // P^T, or P^T Z with dropout
    if (P.dropout_p > 0) {
      T* __restrict z = w.z.data();
      dropout_tile<kKeyRows>(P, b, h, i0, nq, j0, nk, w.z_row.data(), z, kBlockQ);
      for (std::int64_t c = 0; c < nk; ++c)
        for (std::int64_t r = 0; r < nqp; ++r) z[c * kBlockQ + r] *= st[c * kBlockQ + r];
      weights_tile = z;
    }
    accumulate_queries<T, Tile, kKeyRows>(nqp, Dp, nk, weights_tile, kBlockQ, v.data, v.ld, acc, Dp, diag,
                                          Into::rescale_and_accumulate, rescale,
                                          prefetch_next_tile);  // acc = rescale acc + P v
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
    const std::int64_t diag = P.diagonal(i0, j0);
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

// ---- backward -------------------------------------------------------------------------------

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
// head, dk or dv of a key tile): straight into the output when its rows are
// as the micro-kernel writes them (Dp wide, no padding rows), however far
// apart they are, else into scratch, copied out by finish(). (For dq,
// accumulating in scratch and copying out gained nothing clear, and with the
// copies of q and do it lost on short heads.) The first tile that reaches a
// row writes it rather than accumulating (trimmed row groups write zeros),
// so only rows no tile reaches need zero().
template <typename T>
struct GradRows {
  T* data;
  std::int64_t ld;
  bool direct;
  GradRows(const OutRows<T>& out, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
           std::int64_t n_padded, std::int64_t D, std::int64_t Dp, Scratch<T>& scratch)
      : direct(D == Dp && n == n_padded) {
    data = direct ? out.row(b, h, t0) : scratch.data();
    ld = direct ? out.st : Dp;
  }
  T* row(std::int64_t r) const { return data + r * ld; }
  void zero(std::int64_t rows, std::int64_t Dp) const {
    for (std::int64_t r = 0; r < rows; ++r) std::fill(row(r), row(r) + Dp, T(0));
  }
  void finish(const OutRows<T>& out, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
              std::int64_t D) const {
    if (!direct)
      for (std::int64_t r = 0; r < n; ++r) std::copy(row(r), row(r) + D, out.row(b, h, t0 + r));
  }
};

// Backward of (b, h), FlashAttention-2's order: for each key tile, for each
// query tile that can see it, P = exp(S - lse) (recomputed) and dS are
// built, then folded into dq, dk, dv. With Z the dropout factors and
// S = (scale q) k^T:
//   forward: o_i = sum_j P_ij Z_ij v_j
//   so  dv_j += P_ij Z_ij do_i;  dP_ij = Z_ij (do_i . v_j);
//       dS_ij = P_ij (dP_ij - delta_i) with delta_i = sum_j P_ij dP_ij = do_i . o_i;
//       dq_i += scale dS_ij k_j;  dk_j += scale dS_ij q_i.
// The tiles hold scale dS, so dq and dk need no scaling afterwards.
//
// Unlike the forward's, the score tiles have queries for rows: S = q (scale
// k)^T and dP = do v^T read q and do rows where they lie, and only the key
// tile's k and v are transposed, once per tile. Kept the other way round, a
// whole head's q and do were transposed up front, and q, do, their
// transposes and dq (1.25 MiB at T = 1024, D = 64) no longer fit in L2 with
// the tiles.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void backward_head(const Problem<T>& P, const BackwardIo<T>& io, BackwardScratch<T>& w,
                                    std::int64_t b, std::int64_t h, PrefetchQueue<T>& successor) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes, MR = Tile::kRows;
  constexpr std::int64_t KP = std::max<std::int64_t>(W, MR);  // keys are score columns and rows of dk, dv
  constexpr TileRows kQueryRows = TileRows::queries;
  const std::int64_t D = P.D, Tq = P.Tq, Tk = P.Tk, Dp = round_up(D, W), Tp = round_up(Tq, kBlockQ);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  T* __restrict p = w.p.data();
  T* __restrict ds = w.ds.data();
  T* __restrict delta = w.delta.data();
  T* __restrict shift = w.shift.data();
  backward_row_terms<T, Tile>(P, io, b, h, Tp, delta, shift);
  // Queries are rows of the score tiles, so q and do are read in whole row groups (zero padding rows).
  const std::int64_t Tqp = round_up(Tq, MR);
  const Panel<T> q = rows_panel(P.q, b, h, 0, Tq, Tqp, D, Dp, Tk, w.q.data());
  const Panel<T> dout = rows_panel(io.dout, b, h, 0, Tq, Tqp, D, Dp, Tk, w.dout.data());
  const GradRows<T> dq(io.dq, b, h, 0, Tq, Tqp, D, Dp, w.dq);
  if (Tk == 0) dq.zero(Tqp, Dp);
  std::int64_t tiles = 0;
  for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK)
    tiles += std::max<std::int64_t>(0, Tq - P.first_query_tile(j0) + kBlockQ - 1) / kBlockQ;
  const std::int64_t successor_rows_per_tile = (successor.rows() + tiles - 1) / std::max<std::int64_t>(tiles, 1);
  for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
    const std::int64_t nk = std::min(kBlockK, Tk - j0), nkp = round_up(nk, KP);
    const std::int64_t next_nk = std::clamp<std::int64_t>(Tk - j0 - kBlockK, 0, kBlockK);
    prefetch_rows(P.k, b, h, j0 + kBlockK, next_nk, D);
    prefetch_rows(P.v, b, h, j0 + kBlockK, next_nk, D);
    pack_transposed<T, Tile>(P.k, b, h, j0, nk, nkp, D, kBlockK, P.scale, w.kt.data());
    pack_transposed<T, Tile>(P.v, b, h, j0, nk, nkp, D, kBlockK, T(1), w.vt.data());
    const Panel<T> k = rows_panel(P.k, b, h, j0, nk, nkp, D, Dp, Tq, w.k.data());
    const GradRows<T> dk(io.dk, b, h, j0, nk, nkp, D, Dp, w.dk), dv(io.dv, b, h, j0, nk, nkp, D, Dp, w.dv);
    if (P.first_query_tile(j0) >= Tq) {
      dk.zero(nkp, Dp);
      dv.zero(nkp, Dp);
    }
    for (std::int64_t i0 = P.first_query_tile(j0); i0 < Tq; i0 += kBlockQ) {
      const std::int64_t nq = std::min(kBlockQ, Tq - i0), nqp = round_up(nq, MR);
      const std::int64_t diag = P.diagonal(i0, j0);
      const Into into_dkv = i0 == P.first_query_tile(j0) ? Into::overwrite : Into::accumulate;
      const Into into_dq = j0 == 0 ? Into::overwrite : Into::accumulate;
      const T* q_tile = q.data + i0 * q.ld;
      const T* dout_tile = dout.data + i0 * dout.ld;
      successor.request(successor_rows_per_tile);
      product_scores<T, Tile, kQueryRows>(nqp, nkp, D, q_tile, q.ld, w.kt.data(), kBlockK, p, kBlockK, diag);  // S
      product_scores<T, Tile, kQueryRows>(nqp, nkp, D, dout_tile, dout.ld, w.vt.data(), kBlockK, ds, kBlockK,
                                          diag);  // do v^T
      hide_causal<kQueryRows>(p, kBlockK, nqp, nk, nkp, diag, neg_inf);
      hide_causal<kQueryRows>(ds, kBlockK, nqp, nk, nkp, diag, T(0));
      hide_masked<kQueryRows>(P, b, h, i0, nq, j0, nk, p, kBlockK);
      if (P.dropout_p > 0) {
        T* __restrict z = w.z.data();
        std::fill(z, z + nqp * kBlockK, T(0));
        dropout_tile<kQueryRows>(P, b, h, i0, nq, j0, nk, nullptr, z, kBlockK);
      }
      for (std::int64_t r = 0; r < nqp; ++r) {
        T* __restrict pr = p + r * kBlockK;
        T* __restrict dr = ds + r * kBlockK;
        const T* __restrict zr = w.z.data() + r * kBlockK;
        const Vec shift_r = Vec{} + shift[i0 + r], delta_r = Vec{} + delta[i0 + r];
        for (std::int64_t c = 0; c < nkp; c += W) {
          Vec x, dp;
          load(x, pr + c);
          load(dp, dr + c);
          x -= shift_r;
          exp_softmax(x);  // P_ij
          if (P.dropout_p > 0) {
            Vec z;
            load(z, zr + c);
            store(dr + c, P.scale * x * (dp * z - delta_r));
            store(pr + c, x * z);
          } else {
            store(dr + c, P.scale * x * (dp - delta_r));
            store(pr + c, x);
          }
        }
      }
      accumulate_keys<T, Tile, kQueryRows>(nkp, Dp, nq, p, kBlockK, dout_tile, dout.ld, dv.data, dv.ld, diag,
                                           into_dkv);
      accumulate_keys<T, Tile, kQueryRows>(nkp, Dp, nq, ds, kBlockK, q_tile, q.ld, dk.data, dk.ld, diag, into_dkv);
      accumulate_queries<T, Tile, kQueryRows>(nqp, Dp, nk, ds, kBlockK, k.data, k.ld, dq.row(i0), dq.ld, diag,
                                              into_dq);
    }
    dk.finish(io.dk, b, h, j0, nk, D);
    dv.finish(io.dv, b, h, j0, nk, D);
  }
  dq.finish(io.dq, b, h, 0, Tq, D);
}

// Backward of (b, h) from the forward's saved tiles (SavedProbs), in
// backward_head's order and with its formulas, but with the tiles kept the
// forward's way round, keys for rows: P^T = saved exp(s - m) times
// exp(m - lse) per query, dP^T = v do^T, read with the head's do transposed
// once, and dS^T from them; dv += P^T do and dk += dS^T q read the tiles as
// they lie, and dq += dS k reads them transposed, as the forward's P v does.
template <typename T, typename Tile>
AG_ALWAYS_INLINE void backward_head_saved(const Problem<T>& P, const BackwardIo<T>& io, BackwardScratch<T>& w,
                                          std::int64_t b, std::int64_t h, PrefetchQueue<T>& successor) {
  using Vec = typename Simd<T, Tile::kBytes>::Vec;
  constexpr std::int64_t W = Simd<T, Tile::kBytes>::kLanes, MR = Tile::kRows;
  constexpr std::int64_t QP = std::max<std::int64_t>(W, MR);  // queries are score columns and rows of dq
  constexpr TileRows kKeyRows = TileRows::keys;
  const std::int64_t D = P.D, Tq = P.Tq, Tk = P.Tk, Dp = round_up(D, W), Tp = round_up(Tq, kBlockQ);
  const std::int64_t bh = b * P.H + h;
  const SavedProbs<T>& saved = io.saved;
  T* __restrict p = w.p.data();
  T* __restrict ds = w.ds.data();
  T* __restrict z = w.z.data();
  T* __restrict delta = w.delta.data();
  T* __restrict shift = w.shift.data();
  T* __restrict correction = w.correction.data();
  backward_row_terms<T, Tile>(P, io, b, h, Tp, delta, shift);
  const std::int64_t Tqp = round_up(Tq, MR);
  const Panel<T> q = rows_panel(P.q, b, h, 0, Tq, Tqp, D, Dp, Tk, w.q.data());
  const Panel<T> dout = rows_panel(io.dout, b, h, 0, Tq, Tqp, D, Dp, Tk, w.dout.data());
  // do transposed block by block, (D, kBlockQ) each: one (D, Tp) with rows
  // 4 KiB apart (at T = 1024) made the tile product that reads it miss L1 on
  // its 64 rows' shared cache sets, and the whole backward slower than
  // recomputing.
  for (std::int64_t i0 = 0; i0 < Tq; i0 += kBlockQ)
    pack_transposed<T, Tile>(io.dout, b, h, i0, std::min(kBlockQ, Tq - i0), kBlockQ, D, kBlockQ, T(1),
                             w.dout_t.data() + i0 * D);
  const GradRows<T> dq(io.dq, b, h, 0, Tq, Tqp, D, Dp, w.dq);
  if (Tk == 0) dq.zero(Tqp, Dp);
  const std::int64_t tiles = std::max<std::int64_t>(saved.per_head, 1);
  const std::int64_t successor_rows_per_tile = (successor.rows() + tiles - 1) / tiles;
  for (std::int64_t j0 = 0; j0 < Tk; j0 += kBlockK) {
    const std::int64_t kb = j0 / kBlockK, nk = std::min(kBlockK, Tk - j0), nkp = round_up(nk, MR);
    const std::int64_t next_nk = std::clamp<std::int64_t>(Tk - j0 - kBlockK, 0, kBlockK);
    prefetch_rows(P.k, b, h, j0 + kBlockK, next_nk, D);
    prefetch_rows(P.v, b, h, j0 + kBlockK, next_nk, D);
    const Panel<T> k = rows_panel(P.k, b, h, j0, nk, nkp, D, Dp, Tq, w.k.data());
    const Panel<T> v = rows_panel(P.v, b, h, j0, nk, nkp, D, Dp, Tq, w.v.data());
    const GradRows<T> dk(io.dk, b, h, j0, nk, nkp, D, Dp, w.dk), dv(io.dv, b, h, j0, nk, nkp, D, Dp, w.dv);
    if (P.first_query_tile(j0) >= Tq) {
      dk.zero(nkp, Dp);
      dv.zero(nkp, Dp);
    }
    for (std::int64_t i0 = P.first_query_tile(j0); i0 < Tq; i0 += kBlockQ) {
      const std::int64_t qb = i0 / kBlockQ, nq = std::min(kBlockQ, Tq - i0), nqp = round_up(nq, QP);
      const std::int64_t diag = P.diagonal(i0, j0);
      const Into into_dkv = i0 == P.first_query_tile(j0) ? Into::overwrite : Into::accumulate;
      const Into into_dq = j0 == 0 ? Into::overwrite : Into::accumulate;
      const T* saved_tile = saved.tile(bh, qb, kb);
      const T* saved_max = saved.tile_max(bh, qb, kb);
      // The head's next tile, from memory, a slice after each row group of this tile's first
      // and last products: read without it, the tiles' loads stalled the AVX-512 path for a
      // tenth of its time and it gained nothing over recomputing them.
      const bool last_tile = saved.index(bh, qb, kb) + 1 == (bh + 1) * saved.per_head;
      SpanPrefetch next_tile(saved_tile + SavedProbs<T>::kSlotValues,
                             last_tile ? 0 : SavedProbs<T>::kSlotValues * std::int64_t(sizeof(T)),
                             nkp / MR + round_up(nq, MR) / MR);
      auto prefetch_next_tile = [&next_tile] { next_tile.step(); };
      successor.request(successor_rows_per_tile);
      product_scores<T, Tile, kKeyRows>(nkp, nqp, D, v.data, v.ld, w.dout_t.data() + i0 * D, kBlockQ, ds, kBlockQ,
                                        diag, prefetch_next_tile);  // dP^T = v do^T
      hide_causal<kKeyRows>(ds, kBlockQ, nkp, nk, nqp, diag, T(0));
      if (P.dropout_p > 0) {
        std::fill(z, z + nkp * kBlockQ, T(0));
        dropout_tile<kKeyRows>(P, b, h, i0, nq, j0, nk, w.z_row.data(), z, kBlockQ);
      }
      for (std::int64_t r = 0; r < nqp; r += W) {
        Vec m, lse;
        load(m, saved_max + r);
        load(lse, shift + i0 + r);
        Vec x = m - lse;
        exp_softmax(x);
        store(correction + r, x);
      }
      for (std::int64_t c = 0; c < nkp; ++c) {
        const T* __restrict sc = saved_tile + c * kBlockQ;
        T* __restrict pc = p + c * kBlockQ;
        T* __restrict dc = ds + c * kBlockQ;
        const T* __restrict zc = z + c * kBlockQ;
        for (std::int64_t r = 0; r < nqp; r += W) {
          Vec x, f, dp, delta_r;
          load(x, sc + r);
          load(f, correction + r);
          load(dp, dc + r);
          load(delta_r, delta + i0 + r);
          x *= f;  // P_ij
          if (P.dropout_p > 0) {
            Vec zr;
            load(zr, zc + r);
            store(dc + r, P.scale * x * (dp * zr - delta_r));
            store(pc + r, x * zr);
          } else {
            store(dc + r, P.scale * x * (dp - delta_r));
            store(pc + r, x);
          }
        }
      }
      accumulate_keys<T, Tile, kKeyRows>(nkp, Dp, nq, p, kBlockQ, dout.data + i0 * dout.ld, dout.ld, dv.data, dv.ld,
                                         diag, into_dkv);
      accumulate_keys<T, Tile, kKeyRows>(nkp, Dp, nq, ds, kBlockQ, q.data + i0 * q.ld, q.ld, dk.data, dk.ld, diag,
                                         into_dkv);
      accumulate_queries<T, Tile, kKeyRows>(round_up(nq, MR), Dp, nk, ds, kBlockQ, k.data, k.ld, dq.row(i0), dq.ld,
                                            diag, into_dq, nullptr, prefetch_next_tile);
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
      backward_head_saved<T, Tile>(P, io, scratch, bh / P.H, bh % P.H, successor);
    else
      backward_head<T, Tile>(P, io, scratch, bh / P.H, bh % P.H, successor);
  }
}

// ---- entry points per instruction set ---------------------------------------------------

template <typename T>
AG_TARGET_AVX512 void forward_tasks_avx512(const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) {
  forward_tasks<T, TileAvx512>(P, O, tasks);
}
template <typename T>
AG_TARGET_AVX2 void forward_tasks_avx2(const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) {
  forward_tasks<T, TileAvx2>(P, O, tasks);
}
template <typename T>
void forward_tasks_baseline(const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) {
  forward_tasks<T, TileBaseline>(P, O, tasks);
}
template <typename T>
void forward_tasks_any(Isa isa, const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) {
  switch (isa) {
    case Isa::avx512: return forward_tasks_avx512(P, O, tasks);
    case Isa::avx2: return forward_tasks_avx2(P, O, tasks);
    case Isa::baseline: return forward_tasks_baseline(P, O, tasks);
  }
}

template <typename T>
AG_TARGET_AVX512 void backward_heads_avx512(const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {
  backward_heads<T, TileAvx512>(P, io, heads);
}
template <typename T>
AG_TARGET_AVX2 void backward_heads_avx2(const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {
  backward_heads<T, TileAvx2>(P, io, heads);
}
template <typename T>
void backward_heads_baseline(const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {
  backward_heads<T, TileBaseline>(P, io, heads);
}
template <typename T>
void backward_heads_any(Isa isa, const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {
  switch (isa) {
    case Isa::avx512: return backward_heads_avx512(P, io, heads);
    case Isa::avx2: return backward_heads_avx2(P, io, heads);
    case Isa::baseline: return backward_heads_baseline(P, io, heads);
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

const char* attention_isa() { return kIsaNames[static_cast<int>(cpu_isa())]; }

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
  const Isa isa = cpu_isa();  // here, not in the workers: a bad ATTOGRAD_ATTENTION_ISA throws to the caller
  AG_DISPATCH_FLOAT(q.dtype(), "attention", [&] {
    using T = scalar_t;
    const Problem<T> P = make_problem<T>(q, k, v, mask, options);
    ForwardOutputs<T> O{out_bthd.data<T>(), r.lse.data<T>(),
                        options.return_weights ? r.weights.data<T>() : nullptr, {}};
    SavedProbs<T> saved(Tq, Tk, options.causal);
    const std::int64_t bytes = attention_probs_bytes(B * H, Tq, Tk, options.causal, sizeof(T), options.probs_budget);
    if (bytes > 0) {
      saved.heads = bytes / (saved.values(1) * static_cast<std::int64_t>(sizeof(T)));
      r.probs = empty({saved.values(saved.heads)}, q.options());
      saved.data = r.probs.data<T>();
      O.saved = saved;
    }
    const std::int64_t blocks = (Tq + kBlockQ - 1) / kBlockQ;
    parallel_tasks(0, B * H * blocks, 1, [&](TaskQueue& tasks) { forward_tasks_any(isa, P, O, tasks); });
  });
  return r;
}

std::int64_t attention_probs_bytes(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal,
                                   std::int64_t element_bytes, std::int64_t budget) {
  const std::int64_t per_head = SavedProbs<float>(Tq, Tk, causal).values(1) * element_bytes;  // any T: one layout
  return per_head > 0 && budget >= per_head ? std::min(heads, budget / per_head) * per_head : 0;
}

kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask, const Tensor& out, const Tensor& lse,
                                           const Tensor& probs, const kernels::AttentionKernelOptions& options,
                                           const kernels::AttentionGrads& into) {
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2);
  kernels::AttentionGrads g{into.dq.defined() ? into.dq : empty(q.sizes(), q.options()),
                            into.dk.defined() ? into.dk : empty(k.sizes(), k.options()),
                            into.dv.defined() ? into.dv : empty(v.sizes(), v.options())};
  if (g.dq.numel() == 0 && g.dk.numel() == 0) return g;
  const Isa isa = cpu_isa();
  AG_DISPATCH_FLOAT(q.dtype(), "attention backward", [&] {
    using T = scalar_t;
    const Problem<T> P = make_problem<T>(q, k, v, mask, options);
    BackwardIo<T> io{rows_of<T>(dout),    rows_of<T>(out),      lse.data<T>(),
                     out_rows_of<T>(g.dq), out_rows_of<T>(g.dk), out_rows_of<T>(g.dv), {}};
    if (probs.defined()) {
      SavedProbs<T> saved(Tq, Tk, options.causal);
      const std::int64_t per_head = saved.values(1);
      AG_CHECK(probs.dtype() == q.dtype() && probs.is_contiguous() && per_head > 0 && probs.numel() > 0 &&
                   probs.numel() % per_head == 0 && probs.numel() <= saved.values(B * H),
               "attention backward",
               "probs {} {} is not the forward's saved tiles for q {}, k {} (whole heads of {} values, at most {})",
               dtype_name(probs.dtype()), shape_str(probs.sizes()), shape_str(q.sizes()), shape_str(k.sizes()),
               per_head, B * H);
      saved.heads = probs.numel() / per_head;
      saved.data = const_cast<T*>(probs.data<T>());
      io.saved = saved;
    }
    parallel_tasks(0, B * H, 1, [&](TaskQueue& heads) { backward_heads_any(isa, P, io, heads); });
  });
  return g;
}

}  // namespace attograd::cpu
