// float32 products: Goto's blocking (as BLIS and OpenBLAS do it), one thread.
//
//   for each K chunk of kc values:
//     for each block of nc columns:   pack B (kc x nc) as panels of kc x NR   [L2]
//       for each panel of MR rows:    A's MR x kc: a row-major A's rows where
//                                     they lie, else packed k by k            [L1]
//         for each panel of B:        C[MR x NR] (+)= A panel x B panel       [registers]
//
// The micro-kernel holds its MR x NR block of C in registers over the whole
// chunk, each step one row of B's panel (NR / lanes vector loads) and MR of
// A's values (broadcast), MR x NR / lanes multiply-adds. A C element's sum runs
// k = 0, 1, 2, ... whatever the block it falls in, so a product cut into row
// or column blocks for threads gives the same bits as one computed whole.
#include "cpu/matmul_f32/sgemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <type_traits>

#include "base/error.h"
#include "cpu/bf16_rounding.h"
#include "cpu/blas_setup.h"
#include "cpu/gelu_rows.h"
#include "cpu/scratch.h"
#include "cpu/vec_math.h"
#include "cpu/vec_transpose.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define AG_F32_AVX512_KERNEL 1
#define AG_TARGET_F32_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define AG_TARGET_F32_AVX2 __attribute__((target("avx2,fma")))
#else
#define AG_F32_AVX512_KERNEL 0
#define AG_TARGET_F32_AVX512
#define AG_TARGET_F32_AVX2
#endif

namespace attograd::cpu {
namespace {

constexpr const char* kNames[] = {"avx512", "avx2", "portable", "openblas"};

// K chunk and column block: an A panel (6 x 384 floats, 9 KiB) stays in L1
// while the column block's B panels (384 x 64, 96 KiB each; 768 KiB in all)
// stream from L2 (1-2 MiB a core on current CPUs). An L2 of 512 KiB holds only
// half of them, yet blocks of 256 columns that fit ran the AVX2 tile no faster
// on GPT-2 small's and shakespeare_char's products.
constexpr std::int64_t kKc = 384, kNc = 512;

// The register block: kRows rows of C, each kVecs vectors of kLanes floats.
// AVX-512 has 32 registers: 24 for C, 4 for B's row, 1 for the broadcast; 6 x 64
// takes fewer loads a multiply-add (10 for 24) than 12 x 32 (14 for 24) or
// 8 x 48, and was the fastest of the three. The baseline's 16 of 16 bytes: 12 for C.
struct TileAvx512 {
  static constexpr int kBytes = 64, kRows = 6, kVecs = 4;
};
struct TileAvx2 {
  static constexpr int kBytes = 32, kRows = 6, kVecs = 2;
};
struct TilePortable {
  static constexpr int kBytes = 16, kRows = 6, kVecs = 2;
};

// How many steps ahead of the micro-kernel B's panel is asked into L1.
constexpr std::int64_t kPrefetchSteps = 8;

// Where C's element (i, j) lies, and the block of columns from j, within one panel.
inline float* c_block(const F32Gemm& g, std::int64_t i, std::int64_t j) {
  if (g.c_panel_cols == 0) return g.c + i * g.ldc + j;
  return g.c + j / g.c_panel_cols * g.c_panel_stride + i * g.ldc + j % g.c_panel_cols;
}

// The epilogue over C's rows i0.. (rows of them), columns j0.. (cols), their
// sums complete: each row one call of the element-wise loop, on values just
// stored (in L1 or L2 for a band of the kernel's, where a separate pass read
// them back from memory).
void epilogue_rows(const F32Gemm& g, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) {
  for (std::int64_t r = i0; r < i0 + rows; ++r) {
    float* c = g.c + r * g.ldc + j0;
    float* companion = g.companion + r * g.ldc + j0;
    if (g.epilogue == F32Gemm::Epilogue::gelu)
      gelu_f32(companion, c, cols);
    else
      scale_by_gelu_grad_f32(c, companion, cols);
  }
}

template <typename Tile>
struct Kernel {
  static constexpr int kLanes = Tile::kBytes / 4, MR = Tile::kRows, NR = Tile::kVecs * kLanes;
  typedef float Vec __attribute__((vector_size(Tile::kBytes)));

  // A panel of W lanes, k by k (dst[k * W + lane]), from `count` lanes of a
  // matrix whose lanes lie side by side: lane c of step k at src[k * step + c].
  // Lanes past count are 0. S: float, or bfloat16 widened on the way.
  template <int W, typename S>
  AG_ALWAYS_INLINE static void pack_lanes_side_by_side(const S* src, std::int64_t step, std::int64_t count,
                                                       std::int64_t kc, float* dst) {
    for (std::int64_t k = 0; k < kc; ++k, dst += W, src += step) {
      if constexpr (std::is_same_v<S, bfloat16>) {
        if (count == W) {  // apart from the edge's: vector widening, not a choice per value
#pragma GCC unroll 16
          for (int c = 0; c < W; ++c) dst[c] = bfloat16_to_float(src[c].bits);
        } else {
          for (int c = 0; c < W; ++c) dst[c] = c < count ? static_cast<float>(src[c]) : 0.0f;
        }
      } else if (count == W) {  // a copy of known length: a few moves, not a rep movs
        std::memcpy(dst, src, sizeof(float) * W);
      } else {
        std::memcpy(dst, src, sizeof(float) * count);
        std::fill(dst + count, dst + W, 0.0f);
      }
    }
  }

  // v = kLanes values from p, widened if bfloat16 (a bfloat16 is a float's
  // upper half: bfloat16_to_float's rule on a whole vector). Spelled as
  // bfloat16_to_float in an unrolled loop, as pack_lanes_side_by_side is, GCC
  // 12 packs more slowly (same bits). AVX-512's tile only (GCC takes no vector_size that
  // depends on a template's parameter in __builtin_convertvector).
  template <typename S>
  AG_ALWAYS_INLINE static void load_lanes(const S* p, Vec& v) {
    if constexpr (std::is_same_v<S, bfloat16>) {
      typedef std::uint16_t Halves __attribute__((vector_size(32)));
      typedef std::uint32_t Words __attribute__((vector_size(64)));
      Halves h;
      std::memcpy(&h, p, sizeof h);
      const Words w = __builtin_convertvector(h, Words) << 16;
      std::memcpy(&v, &w, sizeof v);
    } else {
      std::memcpy(&v, p, sizeof v);
    }
  }

  // The same from a matrix whose lanes are its rows: lane c of step k at
  // src[c * step + k]. A Linear's forward packs its weight so (B^T). With
  // AVX-512, blocks of kLanes x kLanes go through a transpose in registers
  // (cpu/vec_transpose.h), the rest value by value: one value at a time
  // the packing of a 512 x 512 weight took a tenth of the product.
  template <int W, typename S>
  AG_ALWAYS_INLINE static void pack_lanes_from_rows(const S* src, std::int64_t step, std::int64_t count,
                                                    std::int64_t kc, float* dst) {
    std::int64_t whole_cols = 0;  // columns [0, whole_cols) are done for K values [0, whole_k)
    const std::int64_t whole_k = kc / kLanes * kLanes;
    if constexpr (Tile::kBytes == 64) {  // elsewhere GCC lowers the shuffles poorly
      whole_cols = count / kLanes * kLanes;
      for (std::int64_t c0 = 0; c0 < whole_cols; c0 += kLanes)
        for (std::int64_t k0 = 0; k0 < whole_k; k0 += kLanes) {
          Vec v[kLanes];
          for (int i = 0; i < kLanes; ++i) load_lanes(src + (c0 + i) * step + k0, v[i]);
          transpose_in_registers(v);
          for (int i = 0; i < kLanes; ++i) std::memcpy(dst + (k0 + i) * W + c0, &v[i], sizeof(Vec));
        }
    }
    for (int c = 0; c < W; ++c)
      for (std::int64_t k = c < whole_cols ? whole_k : 0; k < kc; ++k)
        dst[k * W + c] = c < count ? static_cast<float>(src[c * step + k]) : 0.0f;
  }

  // op(A)'s rows [i0, i0 + MR) and K values [k0, k0 + kc) of a row-major
  // float32 A; rows past m are 0.
  AG_ALWAYS_INLINE static void pack_a_rows(const F32Gemm& g, std::int64_t i0, std::int64_t k0, std::int64_t kc,
                                           float* ap) {
    pack_lanes_from_rows<MR>(g.a + i0 * g.lda + k0, g.lda, std::min<std::int64_t>(MR, g.m - i0), kc, ap);
  }

  // A transposed A's panels are packed kGroupPanels at a time: op(A)'s rows
  // [i0, i0 + kGroupRows) and K values [k0, k0 + kc), panel p (rows i0 + p MR..)
  // at ap + p * MR * kc, k by k; rows past m are 0, panels past them not written.
  // op(A)'s rows lie side by side in A's rows, lda apart (6 KiB in a
  // weight gradient of 1536 rows): packed one panel at a time, each of the
  // chunk's 342 rows of A was read for 24 bytes and its line read again from
  // L2 by the next two or three panels; now each row is read once, 192 bytes
  // (three whole lines).
  static constexpr std::int64_t kGroupPanels = 8, kGroupRows = kGroupPanels * MR;
  template <typename S>
  AG_ALWAYS_INLINE static void pack_transposed_a_group(const F32Gemm& g, const S* a, std::int64_t i0, std::int64_t k0,
                                                       std::int64_t kc, float* ap) {
    const std::int64_t rows = std::min(kGroupRows, g.m - i0);
    const S* src = a + k0 * g.lda + i0;
    if (rows < kGroupRows) {
      for (std::int64_t r = 0; r < rows; r += MR)
        pack_lanes_side_by_side<MR>(src + r, g.lda, std::min<std::int64_t>(MR, rows - r), kc, ap + r * kc);
      return;
    }
    for (std::int64_t k = 0; k < kc; ++k, src += g.lda)
#pragma GCC unroll 8
      for (std::int64_t p = 0; p < kGroupPanels; ++p)
        pack_lanes_side_by_side<MR>(src + p * MR, g.lda, MR, 1, ap + p * MR * kc + k * MR);
  }

  // `rows` rows (ld apart) of kc bfloat16 values widened into an MR x kc
  // row-major panel; the rows past them are 0.
  AG_ALWAYS_INLINE static void widen_rows(const bfloat16* src, std::int64_t ld, std::int64_t rows, std::int64_t kc,
                                          float* dst) {
    for (std::int64_t r = 0; r < MR; ++r, dst += kc) {
      if (r >= rows) {
        std::fill(dst, dst + kc, 0.0f);
        continue;
      }
      widen_bf16(dst, &src[r * ld].bits, kc);
    }
  }

  // op(B)'s K values [k0, k0 + kc) and columns [j0, j0 + nc) of B (g.b or
  // g.b_bf16) as panels of NR columns, each kc rows of NR; columns past n are 0.
  template <typename S>
  AG_ALWAYS_INLINE static void pack_b(const F32Gemm& g, const S* b, std::int64_t k0, std::int64_t kc,
                                      std::int64_t j0, std::int64_t nc, float* bp) {
    for (std::int64_t p = 0; p < nc; p += NR, bp += kc * NR) {
      const std::int64_t cols = std::min<std::int64_t>(NR, nc - p), j = j0 + p;
      if (g.b_transposed)  // B^T: op(B)'s columns are rows
        pack_lanes_from_rows<NR>(b + j * g.ldb + k0, g.ldb, cols, kc, bp);
      else
        pack_lanes_side_by_side<NR>(b + k0 * g.ldb + j, g.ldb, cols, kc, bp);
    }
  }

  // C[MR x V vectors] (+)= the panels' product over kc values of K (V < kVecs
  // for a last panel that narrow: the LM head's 65 columns are one whole panel
  // and one of a single vector), A's value (r, k) at a[r * row_step + k * k_step]:
  // a packed panel, or A's rows in place.
  template <int V>
  AG_ALWAYS_INLINE static void block(const float* a, std::int64_t row_step, std::int64_t k_step, const float* bp,
                                     std::int64_t kc, float* c, std::int64_t ldc, bool add, const float* bias) {
    Vec acc[MR][V] = {};
    // C's lines are wanted only after the loop, but from wherever they lie
    // (L3, at m = 4096): asked for now, they arrive while it runs.
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) __builtin_prefetch(c + r * ldc + v * kLanes, 1, 3);
    for (std::int64_t k = 0; k < kc; ++k, a += k_step, bp += NR) {
      // B's panel streams from L2 a row of NR floats a step: asked for 8 steps
      // ahead, it is in L1 when wanted (4 and 12 steps ahead did no better).
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) __builtin_prefetch(bp + kPrefetchSteps * NR + v * kLanes, 0, 3);
      Vec b[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) std::memcpy(&b[v], bp + v * kLanes, sizeof(Vec));
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const float a_rk = a[r * row_step];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] += a_rk * b[v];
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        float* out = c + r * ldc + v * kLanes;
        if (add) {
          Vec old;
          std::memcpy(&old, out, sizeof(Vec));
          acc[r][v] += old;
        }
        if (bias) {
          Vec b;
          std::memcpy(&b, bias + v * kLanes, sizeof(Vec));
          acc[r][v] += b;
        }
        std::memcpy(out, &acc[r][v], sizeof(Vec));
      }
    }
  }

  // The edge block of `cols` columns into `edge` (rows NR apart), on as few vectors as cover them.
  AG_ALWAYS_INLINE static void edge_block(const float* a, std::int64_t row_step, std::int64_t k_step,
                                          const float* bp, std::int64_t kc, std::int64_t cols, float* edge) {
    const std::int64_t vectors = (cols + kLanes - 1) / kLanes;
    if (vectors == 1) return block<1>(a, row_step, k_step, bp, kc, edge, NR, false, nullptr);
    if constexpr (Tile::kVecs > 2)
      if (vectors == 2) return block<2>(a, row_step, k_step, bp, kc, edge, NR, false, nullptr);
    if constexpr (Tile::kVecs > 3)
      if (vectors == 3) return block<3>(a, row_step, k_step, bp, kc, edge, NR, false, nullptr);
    block<Tile::kVecs>(a, row_step, k_step, bp, kc, edge, NR, false, nullptr);
  }

  AG_ALWAYS_INLINE static void run(const F32Gemm& g) {
    // Column blocks of whole panels; the buffers fit the largest chunk and block.
    constexpr std::int64_t kBlockCols = kNc / NR * NR;
    // K in chunks of equal length (2048 as 6 of 344, not 5 of 384 and one of 128):
    // each chunk loads and stores C's blocks once.
    const std::int64_t chunks = (g.k + kKc - 1) / kKc, kc_max = (g.k + chunks - 1) / chunks;
    const std::int64_t nc_max = std::min((g.n + NR - 1) / NR * NR, kBlockCols);
    // Grown, never shrunk: a vector resized up zero-fills what it adds, and the
    // products of a step alternate between shapes.
    thread_local Scratch<float> a_buf, b_buf;
    const std::int64_t a_panels = g.a_transposed ? kGroupPanels : 1;
    if (a_buf.size() < static_cast<std::size_t>(a_panels * MR * kc_max))
      a_buf.resize(static_cast<std::size_t>(a_panels * MR * kc_max));
    if (b_buf.size() < static_cast<std::size_t>(kc_max * nc_max)) b_buf.resize(static_cast<std::size_t>(kc_max * nc_max));
    float edge[MR * NR];  // a block of C cut by the matrix's edge
    for (std::int64_t k0 = 0; k0 < g.k; k0 += kc_max) {
      const std::int64_t kc = std::min(kc_max, g.k - k0);
      const bool add = g.accumulate || k0 > 0;
      const float* bias = k0 == 0 ? g.bias : nullptr;  // with the first chunk's sums
      for (std::int64_t j0 = 0; j0 < g.n; j0 += kBlockCols) {
        const std::int64_t nc = std::min(kBlockCols, g.n - j0);
        if (g.b_bf16)
          pack_b(g, g.b_bf16, k0, kc, j0, nc, b_buf.data());
        else
          pack_b(g, g.b, k0, kc, j0, nc, b_buf.data());
        for (std::int64_t i0 = 0; i0 < g.m; i0 += MR) {
          const std::int64_t rows = std::min<std::int64_t>(MR, g.m - i0);
          // A row-major A's whole panels are read where they lie: packing them
          // (a transpose, 6 rows to k by k) cost a quarter of the products' time at n = 128.
          // A row-major bfloat16 A's rows are widened into a panel of that layout, read so.
          const float* a = a_buf.data();
          std::int64_t row_step = 1, k_step = MR;  // a packed panel
          if (!g.a_transposed && g.a_bf16) {
            widen_rows(g.a_bf16 + i0 * g.lda + k0, g.lda, rows, kc, a_buf.data());
            row_step = kc, k_step = 1;
          } else if (!g.a_transposed && rows == MR) {
            a = g.a + i0 * g.lda + k0;
            row_step = g.lda, k_step = 1;
          } else if (!g.a_transposed) {  // the last rows of a row-major A, fewer than MR
            pack_a_rows(g, i0, k0, kc, a_buf.data());
          } else {
            const std::int64_t panel = i0 / MR % kGroupPanels;
            if (panel == 0 && g.a_bf16)
              pack_transposed_a_group(g, g.a_bf16, i0, k0, kc, a_buf.data());
            else if (panel == 0)
              pack_transposed_a_group(g, g.a, i0, k0, kc, a_buf.data());
            a = a_buf.data() + panel * MR * kc;
          }
          // The next panel's rows, read in place, come from L3 or memory (A
          // is 8 MiB at 4096 x 512): asked into L2 now, while this panel's
          // blocks run, they do not stall its first steps.
          if (!g.a_transposed && !g.a_bf16 && i0 + 2 * MR <= g.m)
            for (int r = 0; r < MR; ++r)
              for (std::int64_t k = 0; k < kc; k += 64 / sizeof(float))
                __builtin_prefetch(g.a + (i0 + MR + r) * g.lda + k0 + k, 0, 2);
          for (std::int64_t p = 0; p < nc; p += NR) {
            const float* bp = b_buf.data() + p / NR * kc * NR;
            float* c = c_block(g, i0, j0 + p);
            const std::int64_t cols = std::min<std::int64_t>(NR, nc - p);
            const float* block_bias = bias ? bias + j0 + p : nullptr;
            if (rows == MR && cols == NR) {
              block<Tile::kVecs>(a, row_step, k_step, bp, kc, c, g.ldc, add, block_bias);
              continue;
            }
            edge_block(a, row_step, k_step, bp, kc, cols, edge);
            // C = (the sums + C or 0) + bias, as block() does. One loop that chose
            // between edge + C and edge for each value became masked loads of C
            // that cost several times the product on AVX2.
            for (std::int64_t r = 0; r < rows; ++r) {
              float* c_row = c + r * g.ldc;
              const float* sums = edge + r * NR;
              if (add)
                for (std::int64_t col = 0; col < cols; ++col) c_row[col] += sums[col];
              else
                std::memcpy(c_row, sums, sizeof(float) * cols);
              if (block_bias)
                for (std::int64_t col = 0; col < cols; ++col) c_row[col] += block_bias[col];
            }
          }
          if (g.epilogue != F32Gemm::Epilogue::none && k0 + kc == g.k) epilogue_rows(g, i0, rows, j0, nc);
        }
      }
    }
  }
};

#if AG_F32_AVX512_KERNEL
AG_TARGET_F32_AVX512 void gemm_avx512(const F32Gemm& g) { Kernel<TileAvx512>::run(g); }
AG_TARGET_F32_AVX2 void gemm_avx2(const F32Gemm& g) { Kernel<TileAvx2>::run(g); }
#endif
void gemm_portable(const F32Gemm& g) { Kernel<TilePortable>::run(g); }

// C's rows (+)= bias: where the product is then accumulated onto C (OpenBLAS's
// beta = 1, or K = 0).
void add_bias_rows(const F32Gemm& g) {
  for (std::int64_t i = 0; i < g.m; ++i) {
    float* row = g.c + i * g.ldc;
    if (g.accumulate)
      for (std::int64_t j = 0; j < g.n; ++j) row[j] += g.bias[j];
    else
      std::copy(g.bias, g.bias + g.n, row);
  }
}

// op(X)'s stored matrix, `rows` x `cols` with rows ld apart, widened into
// `buffer` as a compact one (rows cols apart).
const float* widened(const bfloat16* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                     Scratch<float>& buffer) {
  if (buffer.size() < static_cast<std::size_t>(rows * cols)) buffer.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) widen_bf16(buffer.data() + r * cols, &x[r * ld].bits, cols);
  return buffer.data();
}

void gemm_openblas(const F32Gemm& given) {
  F32Gemm g = given;
  thread_local Scratch<float> a_wide, b_wide;
  if (g.a_bf16) {
    const std::int64_t rows = g.a_transposed ? g.k : g.m, cols = g.a_transposed ? g.m : g.k;
    g.a = widened(g.a_bf16, rows, cols, g.lda, a_wide), g.lda = cols, g.a_bf16 = nullptr;
  }
  if (g.b_bf16) {
    const std::int64_t rows = g.b_transposed ? g.n : g.k, cols = g.b_transposed ? g.k : g.n;
    g.b = widened(g.b_bf16, rows, cols, g.ldb, b_wide), g.ldb = cols, g.b_bf16 = nullptr;
  }
  prepare_blas();
  if (g.bias) add_bias_rows(g);
  cblas_sgemm(CblasRowMajor, g.a_transposed ? CblasTrans : CblasNoTrans, g.b_transposed ? CblasTrans : CblasNoTrans,
              g.m, g.n, g.k, 1.0f, g.a, g.lda, g.b, g.ldb, g.accumulate || g.bias ? 1.0f : 0.0f, g.c, g.ldc);
  if (g.epilogue != F32Gemm::Epilogue::none) epilogue_rows(g, 0, g.m, 0, g.n);
}

// The tiles are compiled only where AG_F32_AVX512_KERNEL says the compiler
// can target AVX-512 and AVX2 (both tiles live in this file's build).
bool avx512_runs_here() {
  static const bool runs = AG_F32_AVX512_KERNEL && cpu::this_cpu_vector_isa().avx512;
  return runs;
}

bool avx2_runs_here() {
  static const bool runs = AG_F32_AVX512_KERNEL && cpu::this_cpu_vector_isa().avx2_fma;
  return runs;
}

// The kernel ATTOGRAD_F32_GEMM names, if it names one (refusing a name it
// does not know and a kernel this CPU cannot run), read once for the float32
// and the widening choice alike.
std::optional<F32Kernel> asked_f32_kernel() {
  static const std::optional<F32Kernel> asked = []() -> std::optional<F32Kernel> {
    const char* env = std::getenv("ATTOGRAD_F32_GEMM");
    if (env == nullptr || *env == '\0') return std::nullopt;
    for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) {
      if (std::strcmp(env, kNames[i]) != 0) continue;
      const auto chosen = static_cast<F32Kernel>(i);
      AG_CHECK(f32_kernel_runs_here(chosen), "matmul", "ATTOGRAD_F32_GEMM={}: this CPU has no {}", env,
               chosen == F32Kernel::avx512 ? "AVX-512" : "AVX2 and FMA");
      return chosen;
    }
    fail("matmul", "ATTOGRAD_F32_GEMM={} is not one of avx512, avx2, portable, openblas", env);
  }();
  return asked;
}

}  // namespace

const char* f32_kernel_name(F32Kernel kernel) { return kNames[static_cast<int>(kernel)]; }

bool f32_kernel_runs_here(F32Kernel kernel) {
  if (kernel == F32Kernel::avx512) return avx512_runs_here();
  if (kernel == F32Kernel::avx2) return avx2_runs_here();
  return true;
}

F32Kernel f32_kernel() {
  if (const auto asked = asked_f32_kernel()) return *asked;
  return avx512_runs_here() ? F32Kernel::avx512 : F32Kernel::openblas;
}

F32Kernel widening_f32_kernel() {
  if (const auto asked = asked_f32_kernel()) return *asked;
  if (avx512_runs_here()) return F32Kernel::avx512;
  return avx2_runs_here() ? F32Kernel::avx2 : F32Kernel::openblas;
}

std::int64_t f32_block_cols(F32Kernel kernel) {
  switch (kernel) {
    case F32Kernel::avx512: return Kernel<TileAvx512>::NR;
    case F32Kernel::avx2: return Kernel<TileAvx2>::NR;
    case F32Kernel::portable: return Kernel<TilePortable>::NR;
    default: return 0;
  }
}

void gemm_f32(const F32Gemm& g, F32Kernel kernel) {
  if (g.m == 0 || g.n == 0) return;
  AG_CHECK(g.c_panel_cols == 0 || (f32_block_cols(kernel) > 0 && g.c_panel_cols % f32_block_cols(kernel) == 0),
           "matmul", "C in panels of {} columns on the {} kernel, whose blocks span {}", g.c_panel_cols,
           f32_kernel_name(kernel), f32_block_cols(kernel));
  AG_CHECK(g.epilogue == F32Gemm::Epilogue::none || (g.companion && !g.accumulate && g.c_panel_cols == 0), "matmul",
           "a GELU epilogue needs its companion matrix, and neither accumulate nor C in panels");
  if (g.k == 0) {
    AG_CHECK(g.c_panel_cols == 0, "matmul", "C in panels with K = 0");
    if (g.bias)
      add_bias_rows(g);
    else if (!g.accumulate)
      for (std::int64_t i = 0; i < g.m; ++i) std::fill(g.c + i * g.ldc, g.c + i * g.ldc + g.n, 0.0f);
    if (g.epilogue != F32Gemm::Epilogue::none) epilogue_rows(g, 0, g.m, 0, g.n);
    return;
  }
  switch (kernel) {
#if AG_F32_AVX512_KERNEL
    case F32Kernel::avx512: gemm_avx512(g); return;
    case F32Kernel::avx2: gemm_avx2(g); return;
#endif
    case F32Kernel::portable: gemm_portable(g); return;
    default: gemm_openblas(g); return;
  }
}

}  // namespace attograd::cpu
