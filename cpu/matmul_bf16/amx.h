#pragma once
// The AMX kernel: one 32 x 32 block of C = A B in four 16 x 16 float32 tiles
// (tmm0-3), the K loop 32 values at a time: A's two 16 x 32 tiles (tmm4, 5),
// B's two (tmm6, 7), four TDPBF16PS. Written once against a tile machine: the
// hardware (AmxTiles: the instructions, as inline assembly, which needs no
// compiler target and runs only where bf16_kernel() found AMX) or a scalar
// model of them (AmxModel) over the very same packed buffers.
//
// TDPBF16PS, as the Intel SDM writes it: for each row m of C, each pair k of A's
// row and B's row k, each column n: c[m][n] += a[m][2k] b[k][2n] then
// += a[m][2k+1] b[k][2n+1], products of two bfloat16 exact in float32, each
// sum rounded to nearest even (the hardware also flushes denormals).
#include <cstdint>
#include <cstring>

#include "base/bfloat16.h"
#include "cpu/matmul_bf16/packing.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::bf16_gemm {

// The 64-byte tile configuration LDTILECFG reads: palette 1, each tile's rows
// and bytes per row.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Every tile this kernel uses: 16 rows of 64 bytes (16 float32 or 32 bfloat16).
inline TileConfig kernel_tile_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  return c;
}

#define AG_AMX_TILE_CASES(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)

// The hardware. Tile numbers are part of the instruction, hence templates.
struct AmxTiles {
  void configure(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" ::"m"(c)); }
  void release() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int T>
  AG_ALWAYS_INLINE void zero() {
#define AG_ZERO(t) \
  if constexpr (T == t) __asm__ volatile("tilezero %%tmm" #t ::);
    AG_AMX_TILE_CASES(AG_ZERO)
#undef AG_ZERO
  }
  template <int T>
  AG_ALWAYS_INLINE void load(const void* base, std::int64_t stride_bytes) {
#define AG_LOAD(t) \
  if constexpr (T == t) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(stride_bytes) : "memory");
    AG_AMX_TILE_CASES(AG_LOAD)
#undef AG_LOAD
  }
  template <int T>
  AG_ALWAYS_INLINE void store(void* base, std::int64_t stride_bytes) {
#define AG_STORE(t) \
  if constexpr (T == t) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(stride_bytes) : "memory");
    AG_AMX_TILE_CASES(AG_STORE)
#undef AG_STORE
  }
  // C += A B for the four (C, A, B) of amx_block; AT&T order: tdpbf16ps B, A, C.
  template <int C, int A, int B>
  AG_ALWAYS_INLINE void dot() {
    static_assert(A == 4 + C / 2 && B == 6 + C % 2, "C tile c is A tile 4 + c / 2 times B tile 6 + c % 2");
    if constexpr (C == 0) __asm__ volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0" ::);
    if constexpr (C == 1) __asm__ volatile("tdpbf16ps %%tmm7, %%tmm4, %%tmm1" ::);
    if constexpr (C == 2) __asm__ volatile("tdpbf16ps %%tmm6, %%tmm5, %%tmm2" ::);
    if constexpr (C == 3) __asm__ volatile("tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  }
};
#undef AG_AMX_TILE_CASES

// The same instructions in scalar C++, on tiles held in memory.
struct AmxModel {
  TileConfig config;
  alignas(64) unsigned char tiles[8][16][64] = {};

  void configure(const TileConfig& c) { config = c; }
  void release() {}
  template <int T>
  void zero() {
    std::memset(tiles[T], 0, sizeof tiles[T]);
  }
  template <int T>
  void load(const void* base, std::int64_t stride_bytes) {
    for (int r = 0; r < config.rows[T]; ++r)
      std::memcpy(tiles[T][r], static_cast<const unsigned char*>(base) + r * stride_bytes, config.colsb[T]);
  }
  template <int T>
  void store(void* base, std::int64_t stride_bytes) {
    for (int r = 0; r < config.rows[T]; ++r)
      std::memcpy(static_cast<unsigned char*>(base) + r * stride_bytes, tiles[T][r], config.colsb[T]);
  }
  template <int C, int A, int B>
  void dot() {
    for (int m = 0; m < config.rows[C]; ++m)
      for (int k = 0; k < config.colsb[A] / 4; ++k)
        for (int n = 0; n < config.colsb[C] / 4; ++n) {
          float c;
          std::memcpy(&c, tiles[C][m] + 4 * n, 4);
          c += pair_product(tiles[A][m] + 4 * k, tiles[B][k] + 4 * n, 0);
          c += pair_product(tiles[A][m] + 4 * k, tiles[B][k] + 4 * n, 1);
          std::memcpy(tiles[C][m] + 4 * n, &c, 4);
        }
  }

 private:
  // a[e] b[e] of the bfloat16 pairs at a and b: exact in float32.
  static float pair_product(const unsigned char* a, const unsigned char* b, int e) {
    std::uint16_t ab, bb;
    std::memcpy(&ab, a + 2 * e, 2);
    std::memcpy(&bb, b + 2 * e, 2);
    return bfloat16_to_float(ab) * bfloat16_to_float(bb);
  }
};

// `blocks` 32 x 32 blocks of one 32-column strip of C (float32, rows ldc
// apart) = (accumulate ? C : 0) + A B over `steps` steps of 32 K values, the
// blocks sharing B's panels at b0 and b1 (step s's tile the 1 KiB at 512 s
// values on): block i's A tiles a_of(i), its C at c + i * c_step. AMX's
// tiles are not renamed, so a block's C could only be loaded once the last
// one's was stored, after its last product: over 8 steps (a K chunk of 256)
// the tile unit then waited a C store and load in every 40 instructions. Here
// C tiles 0 and 1 are stored and the next block's loaded while the last step's
// products into tiles 2 and 3 run, and tiles 2 and 3 while the next block's
// first products into 0 and 1 do.
template <typename Tiles, typename AOf>
AG_ALWAYS_INLINE void amx_strip(Tiles& t, AOf a_of, std::int64_t blocks, const bfloat16* b0, const bfloat16* b1,
                                std::int64_t steps, float* c, std::int64_t c_step, std::int64_t ldc, bool accumulate) {
  constexpr std::int64_t kTileRow = 64, kTileValues = 16 * kKStep;
  const std::int64_t c_stride = ldc * 4;  // bytes from one row to the next
  if (accumulate) {
    t.template load<0>(c, c_stride);
    t.template load<1>(c + 16, c_stride);
    t.template load<2>(c + 16 * ldc, c_stride);
    t.template load<3>(c + 16 * ldc + 16, c_stride);
  } else {
    t.template zero<0>();
    t.template zero<1>();
    t.template zero<2>();
    t.template zero<3>();
  }
  for (std::int64_t i = 0; i < blocks; ++i) {
    const ATiles a = a_of(i);
    const std::int64_t a_stride = a.row * 2;
    float* block_c = c + i * c_step;
    float* next_c = block_c + c_step;
    const bool more = i + 1 < blocks;
    for (std::int64_t s = 0; s < steps; ++s) {
      t.template load<4>(a.rows0 + s * a.step, a_stride);
      t.template load<5>(a.rows16 + s * a.step, a_stride);
      t.template load<6>(b0 + s * kTileValues, kTileRow);
      t.template load<7>(b1 + s * kTileValues, kTileRow);
      t.template dot<0, 4, 6>();
      t.template dot<1, 4, 7>();
      if (s == 0 && i > 0) {  // the last block's tiles 2 and 3 are done
        float* last_c = block_c - c_step;
        t.template store<2>(last_c + 16 * ldc, c_stride);
        t.template store<3>(last_c + 16 * ldc + 16, c_stride);
        if (accumulate) {
          t.template load<2>(block_c + 16 * ldc, c_stride);
          t.template load<3>(block_c + 16 * ldc + 16, c_stride);
        } else {
          t.template zero<2>();
          t.template zero<3>();
        }
      }
      if (s + 1 == steps) {  // tiles 0 and 1 are done
        t.template store<0>(block_c, c_stride);
        t.template store<1>(block_c + 16, c_stride);
        if (more && accumulate) {
          t.template load<0>(next_c, c_stride);
          t.template load<1>(next_c + 16, c_stride);
        } else if (more) {
          t.template zero<0>();
          t.template zero<1>();
        }
      }
      t.template dot<2, 5, 6>();
      t.template dot<3, 5, 7>();
    }
  }
  float* last_c = c + (blocks - 1) * c_step;
  t.template store<2>(last_c + 16 * ldc, c_stride);
  t.template store<3>(last_c + 16 * ldc + 16, c_stride);
}

// One 32 x 32 block of C over `steps` steps of 32 K values: c (float32, rows
// ldc apart) = (accumulate ? c : 0) + A B, with A's tiles as ATiles says, B's
// from the panels at b0 and b1 (step s's tile the 1 KiB at 512 s values on):
// a strip of one block.
template <typename Tiles>
AG_ALWAYS_INLINE void amx_block(Tiles& t, const ATiles& a, const bfloat16* b0, const bfloat16* b1, std::int64_t steps,
                                float* c, std::int64_t ldc, bool accumulate) {
  amx_strip(t, [&a](std::int64_t) { return a; }, 1, b0, b1, steps, c, 0, ldc, accumulate);
}

// amx_block on Tiles behind the interface code written for every kernel runs
// on (the bfloat16 attention; Dpbf16Blocks in dpbf16.h is the other): begin()
// and end() around a thread's products (the tile configuration, and its
// release), block() for each 32 x 32 block.
template <typename Tiles>
struct AmxBlocks {
  Tiles tiles;
  void begin() { tiles.configure(kernel_tile_config()); }
  void end() { tiles.release(); }
  AG_ALWAYS_INLINE void block(const ATiles& a, const bfloat16* b0, const bfloat16* b1, std::int64_t steps, float* c,
                              std::int64_t ldc, bool accumulate) {
    amx_block(tiles, a, b0, b1, steps, c, ldc, accumulate);
  }
};

}  // namespace attograd::cpu::bf16_gemm
