// bfloat16 matrix products: both operands packed once per product (packing.h),
// then the 32 x 32 blocks of C handed out to the pool's threads, each computed
// over the whole of K by the chosen kernel into float32 and rounded once into
// C, the bias added first.
#include "cpu/matmul_bf16/matmul_bf16.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "cpu/bf16_rounding.h"
#include "cpu/matmul_bf16/amx.h"
#include "cpu/matmul_bf16/dpbf16.h"
#include "cpu/matmul_f32/sgemm.h"
#include "cpu/scratch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"
#include "tensor/kernels.h"
#include "cpu/parallel.h"

namespace attograd::cpu {
namespace {

using namespace bf16_gemm;

// A product with its operands packed, cut into macro blocks of C: mc x nc,
// computed kc values of K at a time. A block's float32 sums stay in a
// per-thread buffer (256 KiB at 256 x 256) across its K chunks, in L2; a
// 32 x kc panel of B stays in L1 while the block's row blocks stream past it.
struct Packed {
  const Bf16Gemm& g;
  std::int64_t kp, mp, np;   // K, M and N rounded up to whole steps and blocks
  // A row-major A whose K is a whole number of steps is read where it lies, but
  // for the rows of its last, partial, block: rows from a_packed_from on are in
  // the packed buffer `a` (tiles of 16 x 32, packed_a_index, rows counted from it).
  std::int64_t a_packed_from;
  const bfloat16* a;
  const bfloat16* b;         // np / 16 panels of (kp / 2, 16, 2)
  std::int64_t mc, nc, kc;   // a macro block and a K chunk: multiples of 32
  std::int64_t row_macros() const { return (mp + mc - 1) / mc; }
  std::int64_t macros() const { return row_macros() * ((np + nc - 1) / nc); }
  // Macro block t: its first row and column and its extent (whole blocks of 32).
  struct Macro {
    std::int64_t r0, c0, rows, cols;
  };
  Macro macro(std::int64_t t) const {
    const std::int64_t r0 = t % row_macros() * mc, c0 = t / row_macros() * nc;
    return {r0, c0, std::min(mc, mp - r0), std::min(nc, np - c0)};
  }
  const bfloat16* panel(std::int64_t col, std::int64_t k) const { return b + (col / kPanel) * kp * kPanel + k * kPanel; }
  // The 32-row block of A from row r, from K value k on.
  ATiles a_tiles(std::int64_t r, std::int64_t k) const {
    if (r < a_packed_from) {
      const bfloat16* row = g.a.data + r * g.a.row_stride + k;
      return {row, row + 16 * g.a.row_stride, kKStep, g.a.row_stride};
    }
    r -= a_packed_from;
    return {a + packed_a_index(r, k, kp), a + packed_a_index(r + 16, k, kp), 16 * kKStep, kKStep};
  }
};

// The slowest thread's work over an even share's (1 when the threads' shares
// are even), for macro blocks handed out in order to whichever thread is free
// and threads running at one speed.
double slowest_share(const Packed& p, int threads) {
  std::vector<std::int64_t> work(static_cast<std::size_t>(threads), 0);
  std::int64_t total = 0;
  for (std::int64_t t = 0; t < p.macros(); ++t) {
    const Packed::Macro macro = p.macro(t);
    const std::int64_t block = macro.rows * macro.cols;
    *std::min_element(work.begin(), work.end()) += block;
    total += block;
  }
  return static_cast<double>(*std::max_element(work.begin(), work.end())) * threads / static_cast<double>(total);
}

// Macro blocks per thread: enough that a few spare ones even out the threads'
// shares, yet blocks big enough to reuse what L2 holds. Where few blocks
// split unevenly they are cut smaller: 768 x 768 in nine blocks of 256 x 256
// kept one of two threads busy for five while the other finished four; 18
// even them out. K up to 512 in one chunk (B's 32-column panel then up to
// 32 KiB): at K = 384 two chunks (256 + 128) would store every block's sums
// and load them back.
void choose_blocking(Packed& p, int threads) {
  constexpr double kUnevenShare = 1.05;  // the slowest thread's work over an even share's worth cutting for
  p.kc = p.kp <= 512 ? p.kp : std::min<std::int64_t>(p.kp, 256);
  p.mc = std::min<std::int64_t>(p.mp, 256);
  p.nc = std::min<std::int64_t>(p.np, 256);
  const auto too_few = [&] {
    return p.macros() < 4 * threads || (p.macros() < 16 * threads && slowest_share(p, threads) > kUnevenShare);
  };
  while (too_few() && (p.mc > kBlock || p.nc > kBlock)) {
    if (p.mc >= p.nc)
      p.mc = std::max<std::int64_t>(kBlock, p.mc / 2 / kBlock * kBlock);
    else
      p.nc = std::max<std::int64_t>(kBlock, p.nc / 2 / kBlock * kBlock);
  }
}

// A macro block's float32 sums, a 32 x 32 block of C after another (row
// blocks of nc / 32 of them), each 4 KiB with rows 128 bytes apart: with the
// macro block's rows 1 KiB apart, a C tile's 16 rows fell into 4 of L1's 64
// sets, and the kernel's C loads and stores into conflicts with A's and B's.
struct BlockedSums {
  float* sums;
  std::int64_t nc;
  static constexpr std::int64_t kLd = kBlock;  // floats from one row of a block to the next
  // Row r, columns [j, j + 32 - j % 32) of the macro block.
  float* at(std::int64_t r, std::int64_t j) const {
    return sums + ((r / kBlock) * (nc / kBlock) + j / kBlock) * kBlock * kBlock + (r % kBlock) * kLd + j % kBlock;
  }
};

// C's rows [r0, r0 + rows) and columns [c0, c0 + cols) = the float32 sums plus
// the bias, rounded once.
AG_ALWAYS_INLINE void round_into_c(const Bf16Gemm& g, std::int64_t r0, std::int64_t rows, std::int64_t c0,
                                   std::int64_t cols, const BlockedSums& sums) {
  if (g.c_col_stride != 1) {  // a transposed C (see transposed_product): written along its columns
    for (std::int64_t j = 0; j < cols; ++j) {
      bfloat16* out = g.c + r0 * g.ldc + (c0 + j) * g.c_col_stride;
      const float bias = g.bias ? static_cast<float>(g.bias[c0 + j]) : 0.0f;
      for (std::int64_t r = 0; r < rows; ++r) out[r * g.ldc] = bfloat16(*sums.at(r, j) + bias);
    }
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j0 = 0; j0 < cols; j0 += kBlock) {
      bfloat16* out = g.c + (r0 + r) * g.ldc + c0 + j0;
      const float* in = sums.at(r, j0);
      const std::int64_t n = std::min(kBlock, cols - j0);
      if (g.bias) {
        const bfloat16* bias = g.bias + c0 + j0;
        for (std::int64_t j = 0; j < n; ++j) out[j] = bfloat16(in[j] + static_cast<float>(bias[j]));
      } else {
        for (std::int64_t j = 0; j < n; ++j) out[j] = bfloat16(in[j]);
      }
    }
}
using RoundIntoC = void (*)(const Bf16Gemm&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, const BlockedSums&);
void round_into_c_baseline(const Bf16Gemm& g, std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols,
                           const BlockedSums& sums) {
  round_into_c(g, r0, rows, c0, cols, sums);
}
#if AG_BF16_AVX512_KERNEL
// The same for the hardware kernels, a row of a block at a time by
// VCVTNE2PS2BF16 (bf16_rounding.h: the same bits), along C's rows: block by
// block (each block's sums read in order, C's rows 64 bytes at a time) took
// longer. A transposed C (the weight gradient's C^T, no bias) is written a
// column of a block at a time, its 32 sums gathered, rather than value by value.
AG_TARGET_AVX512_BF16 void round_into_c_avx512(const Bf16Gemm& g, std::int64_t r0, std::int64_t rows, std::int64_t c0,
                                               std::int64_t cols, const BlockedSums& sums) {
  if (g.c_col_stride != 1 && g.ldc == 1 && !g.bias) {  // column j of C^T: contiguous in C
    for (std::int64_t rb = 0; rb < rows; rb += kBlock)
      for (std::int64_t j = 0; j < cols; ++j)
        round_bf16_strided_avx512(reinterpret_cast<std::uint16_t*>(g.c + r0 + rb + (c0 + j) * g.c_col_stride),
                                  sums.at(rb, j), BlockedSums::kLd, std::min(kBlock, rows - rb));
    return;
  }
  if (g.c_col_stride != 1) return round_into_c(g, r0, rows, c0, cols, sums);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j0 = 0; j0 < cols; j0 += kBlock)
      round_bf16_avx512(reinterpret_cast<std::uint16_t*>(g.c + (r0 + r) * g.ldc + c0 + j0), sums.at(r, j0),
                        g.bias ? reinterpret_cast<const std::uint16_t*>(g.bias + c0 + j0) : nullptr,
                        std::min(kBlock, cols - j0));
}
#endif

// Macro blocks [lo, hi), each over the whole of K, with `strip` computing the
// 32 x 32 blocks of a K chunk down one 32-column strip as amx_strip does.
template <typename Strip>
AG_ALWAYS_INLINE void macro_blocks(const Packed& p, std::int64_t lo, std::int64_t hi, float* buffer, Strip strip,
                                   RoundIntoC round) {
  const BlockedSums sums{buffer, p.nc};
  for (std::int64_t t = lo; t < hi; ++t) {
    const Packed::Macro m = p.macro(t);
    for (std::int64_t k0 = 0; k0 < p.kp; k0 += p.kc) {
      const std::int64_t steps = std::min(p.kc, p.kp - k0) / kKStep;
      for (std::int64_t j = 0; j < m.cols; j += kBlock)
        strip([&](std::int64_t i) { return p.a_tiles(m.r0 + i * kBlock, k0); }, m.rows / kBlock,
              p.panel(m.c0 + j, k0), p.panel(m.c0 + j + kPanel, k0), steps, sums.at(0, j),
              sums.at(kBlock, j) - sums.at(0, j), BlockedSums::kLd, k0 > 0);
    }
    round(p.g, m.r0, std::min(m.rows, p.g.m - m.r0), m.c0, std::min(m.cols, p.g.n - m.c0), sums);
  }
}

// The two kernels as macro_blocks calls them. Functors with force-inlined
// calls, not lambdas: a lambda's body is compiled for the build's baseline,
// not for the target of the entry point that calls it. (The A tiles' lambda
// is only called from inside them, where it is inlined.)
template <typename Tiles>
struct AmxStrip {
  Tiles& tiles;
  template <typename AOf>
  AG_ALWAYS_INLINE void operator()(AOf a_of, std::int64_t blocks, const bfloat16* b0, const bfloat16* b1,
                                   std::int64_t steps, float* c, std::int64_t c_step, std::int64_t ldc,
                                   bool accumulate) const {
    amx_strip(tiles, a_of, blocks, b0, b1, steps, c, c_step, ldc, accumulate);
  }
};
template <typename Vectors>
struct Dpbf16Strip {
  template <typename AOf>
  AG_ALWAYS_INLINE void operator()(AOf a_of, std::int64_t blocks, const bfloat16* b0, const bfloat16* b1,
                                   std::int64_t steps, float* c, std::int64_t c_step, std::int64_t ldc,
                                   bool accumulate) const {
    for (std::int64_t i = 0; i < blocks; ++i)
      dpbf16_block_call<Vectors>(a_of(i), b0, b1, steps, c + i * c_step, ldc, accumulate);
  }
};

template <typename Tiles>
AG_ALWAYS_INLINE void amx_macro_blocks(Tiles& tiles, const Packed& p, std::int64_t lo, std::int64_t hi, float* sums,
                                       RoundIntoC round) {
  tiles.configure(kernel_tile_config());
  macro_blocks(p, lo, hi, sums, AmxStrip<Tiles>{tiles}, round);
  tiles.release();
}

template <typename Vectors>
AG_ALWAYS_INLINE void dpbf16_macro_blocks(const Packed& p, std::int64_t lo, std::int64_t hi, float* sums,
                                          RoundIntoC round) {
  macro_blocks(p, lo, hi, sums, Dpbf16Strip<Vectors>{}, round);
}

// The entry points: the hardware ones only where bf16_kernel() found their instructions.
#if AG_BF16_AMX_KERNEL
AG_TARGET_AVX512_BF16 void blocks_amx(const Packed& p, std::int64_t lo, std::int64_t hi, float* sums) {
  AmxTiles tiles;
#if AG_BF16_AVX512_KERNEL
  amx_macro_blocks(tiles, p, lo, hi, sums, round_into_c_avx512);
#else
  amx_macro_blocks(tiles, p, lo, hi, sums, round_into_c_baseline);
#endif
}
#endif
#if AG_BF16_AVX512_KERNEL
AG_TARGET_AVX512_BF16 void blocks_avx512_bf16(const Packed& p, std::int64_t lo, std::int64_t hi, float* sums) {
  dpbf16_macro_blocks<Dpbf16Vectors>(p, lo, hi, sums, round_into_c_avx512);
}
#endif
void blocks_amx_model(const Packed& p, std::int64_t lo, std::int64_t hi, float* sums) {
  AmxModel tiles;
  amx_macro_blocks(tiles, p, lo, hi, sums, round_into_c_baseline);
}
void blocks_avx512_bf16_model(const Packed& p, std::int64_t lo, std::int64_t hi, float* sums) {
  dpbf16_macro_blocks<Dpbf16Model>(p, lo, hi, sums, round_into_c_baseline);
}

// The packing, for the hardware kernels compiled for AVX-512 (see above), for the models as the build is.
struct Packing {
  void (*a_rows)(const Bf16Matrix&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bfloat16*);
  void (*b_panels)(const Bf16Matrix&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bfloat16*);
};
void pack_a_baseline(const Bf16Matrix& a, std::int64_t m, std::int64_t k, std::int64_t kp, std::int64_t r0,
                     std::int64_t r1, bfloat16* out) {
  pack_a_rows(a, m, k, kp, r0, r1, out);
}
void pack_b_baseline(const Bf16Matrix& b, std::int64_t k, std::int64_t n, std::int64_t kp, std::int64_t p0,
                     std::int64_t p1, bfloat16* out) {
  pack_b_panels(b, k, n, kp, p0, p1, out);
}
#if AG_BF16_AVX512_KERNEL
AG_TARGET_AVX512_BF16 void pack_a_avx512(const Bf16Matrix& a, std::int64_t m, std::int64_t k, std::int64_t kp,
                                         std::int64_t r0, std::int64_t r1, bfloat16* out) {
  pack_a_rows<true>(a, m, k, kp, r0, r1, out);
}
AG_TARGET_AVX512_BF16 void pack_b_avx512(const Bf16Matrix& b, std::int64_t k, std::int64_t n, std::int64_t kp,
                                         std::int64_t p0, std::int64_t p1, bfloat16* out) {
  pack_b_panels(b, k, n, kp, p0, p1, out);
}
#endif
Packing packing_for(Bf16Kernel kernel) {
#if AG_BF16_AVX512_KERNEL
  if (kernel == Bf16Kernel::amx || kernel == Bf16Kernel::avx512_bf16) return {pack_a_avx512, pack_b_avx512};
#endif
  (void)kernel;
  return {pack_a_baseline, pack_b_baseline};
}

using Blocks = void (*)(const Packed&, std::int64_t, std::int64_t, float*);
Blocks blocks_of(Bf16Kernel kernel) {
  switch (kernel) {
#if AG_BF16_AMX_KERNEL
    case Bf16Kernel::amx: return blocks_amx;
#endif
#if AG_BF16_AVX512_KERNEL
    case Bf16Kernel::avx512_bf16: return blocks_avx512_bf16;
#endif
    case Bf16Kernel::amx_model: return blocks_amx_model;
    case Bf16Kernel::avx512_bf16_model: return blocks_avx512_bf16_model;
    default: break;
  }
  fail("matmul", "the {} bfloat16 kernel does not run here", bf16_kernel_name(kernel));
}

// Scratch kept between products (its pages already mapped), 64-byte aligned
// as tile and vector loads like.
template <typename T>
T* scratch(Scratch<T>& buffer, std::int64_t n) {
  if (static_cast<std::int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// Without bfloat16 instructions, one product as gemm_bf16 is handed it: the
// operands widened to float32 (exactly), float32's product (gemm_f32). (matmul_bf16, the
// tensors' product, widens whole tensors and runs float32's matmul instead.)
void gemm_widened(const Bf16Gemm& g) {
  std::vector<float> a(g.m * g.k), b(g.k * g.n), c(g.m * g.n);
  for (std::int64_t r = 0; r < g.m; ++r)
    for (std::int64_t kk = 0; kk < g.k; ++kk) a[r * g.k + kk] = g.a.at(r, kk);
  for (std::int64_t kk = 0; kk < g.k; ++kk)
    for (std::int64_t j = 0; j < g.n; ++j) b[kk * g.n + j] = g.b.at(kk, j);
  parallel_for(0, g.m, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(g.n, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 gemm_f32({false, false, hi - lo, g.n, g.k, a.data() + lo * g.k, g.k, b.data(), g.n,
                           c.data() + lo * g.n, g.n, false});
               });
  for (std::int64_t r = 0; r < g.m; ++r)
    for (std::int64_t j = 0; j < g.n; ++j)
      g.c[r * g.ldc + j * g.c_col_stride] = bfloat16(c[r * g.n + j] + (g.bias ? static_cast<float>(g.bias[j]) : 0.0f));
}

// Whether C^T = B^T A^T packs for less than C = A B: a transposed A (the
// weight gradient's dy^T) is packed by transposes of lines from rows far
// apart, at more cost per value than the row-major B (about twice with SSE2's
// 8 x 8 transposes, 1.3 times with AVX-512's 32 x 32), so the smaller of the
// two should be the transposed one. Each C value is the same sum in the same
// order either way.
bool transposed_pays(const Bf16Gemm& g) {
  const bool a_transposed = g.a.row_stride == 1 && g.a.col_stride != 1, b_row_major = g.b.col_stride == 1;
  return a_transposed && b_row_major && g.n < g.m && !g.bias;
}

// Whether a block's 32 rows of A, `row_stride` values apart, can stay in L1
// together when read where they lie: they must fall into at least 4 of its 64
// sets (of 64-byte lines), 4 x 12 ways for 32 lines on the Xeons here. Rows
// 4 KiB apart (K = 2048) all fall into one set and evict each other, so such an A
// is packed; where they spread (K = 768: rows 1.5 KiB apart, 8 sets) packing
// costs more than it saves.
bool rows_spread_in_l1(std::int64_t row_stride) {
  const std::int64_t bytes = row_stride * static_cast<std::int64_t>(sizeof(bfloat16));
  std::uint64_t sets = 0;
  for (std::int64_t r = 0; r < kBlock; ++r) sets |= std::uint64_t{1} << (r * bytes / 64 % 64);
  return std::popcount(sets) >= 4;
}

// C^T (n x m) = B^T A^T, written into C's place transposed.
Bf16Gemm transposed_product(const Bf16Gemm& g) {
  return {{g.b.data, g.b.col_stride, g.b.row_stride}, {g.a.data, g.a.col_stride, g.a.row_stride}, g.c,
          g.c_col_stride, nullptr, g.n, g.m, g.k, g.ldc};
}

}  // namespace

void gemm_bf16(const Bf16Gemm& g, Bf16Kernel kernel) {
  if (g.m == 0 || g.n == 0) return;
  if (kernel == Bf16Kernel::widen) return gemm_widened(g);
  if (transposed_pays(g)) return gemm_bf16(transposed_product(g), kernel);
  const Blocks blocks = blocks_of(kernel);
  const Packing pack = packing_for(kernel);
  const std::int64_t kp = round_up(g.k, kKStep), mp = round_up(g.m, kBlock), np = round_up(g.n, kBlock);
  const bool a_in_place = g.a.col_stride == 1 && g.k == kp && rows_spread_in_l1(g.a.row_stride);
  const std::int64_t a_packed_from = a_in_place ? g.m / kBlock * kBlock : 0;
  thread_local Scratch<bfloat16> a_buffer, b_buffer;
  bfloat16* a = scratch(a_buffer, (mp - a_packed_from) * kp);
  bfloat16* b = scratch(b_buffer, np * kp);
  const bf16_gemm::Bf16Matrix a_rest{g.a.data + a_packed_from * g.a.row_stride, g.a.row_stride, g.a.col_stride};
  parallel_for(0, (mp - a_packed_from) / 16, std::max<std::int64_t>(1, 1024 / std::max<std::int64_t>(kp, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 pack.a_rows(a_rest, g.m - a_packed_from, g.k, kp, lo * 16, hi * 16, a);
               });
  parallel_for(0, np / kPanel, 1, [&](std::int64_t lo, std::int64_t hi) { pack.b_panels(g.b, g.k, g.n, kp, lo, hi, b); });
  Packed packed{g, kp, mp, np, a_packed_from, a, b, 0, 0, 0};
  choose_blocking(packed, get_num_threads());
  // Macro blocks handed out one at a time to whichever thread is free, not in
  // fixed shares: the product lasts as long as its slowest thread, and on the
  // shared machines here a thread's tile unit has run at a fraction of its
  // speed for seconds at a time.
  parallel_tasks(0, packed.macros(), 1, [&](TaskQueue& macros) {
    thread_local Scratch<float> sums;
    float* buffer = scratch(sums, packed.mc * packed.nc);
    for (std::int64_t lo, hi; macros.next(lo, hi);) blocks(packed, lo, hi, buffer);
  });
}

Tensor matmul_bf16(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias) {
  const Bf16Kernel kernel = bf16_kernel();
  if (kernel == Bf16Kernel::widen) {
    // Without bfloat16 instructions: float32's matmul (its threading and
    // bias), the operands widened as the kernel packs them, rounded once.
    // Widened copies of both operands first would cost an allocation and a
    // pass over each.
    return matmul_widened(a_in, b_in, batch_shape, bias);
  }
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  Tensor out = matmul_output(a_in, b_in, batch_shape);
  if (out.numel() == 0) return out;
  const MatmulBatches batches(a_in, b_in, batch_shape);
  const auto* pa = a_in.data<bfloat16>();
  const auto* pb = b_in.data<bfloat16>();
  for (std::int64_t i = 0; i < batches.count(); ++i) {
    std::int64_t oa, ob;
    batches.offsets(i, oa, ob);
    gemm_bf16({{pa + oa, a_in.stride(-2), a_in.stride(-1)},
               {pb + ob, b_in.stride(-2), b_in.stride(-1)},
               out.data<bfloat16>() + i * m * n,
               n,
               bias.defined() ? bias.data<bfloat16>() : nullptr,
               m,
               n,
               k},
              kernel);
  }
  return out;
}

}  // namespace attograd::cpu
