#pragma once
// The AVX512_BF16 kernel: one 32 x 32 block of C = A B as four groups of 8
// rows, each 8 x 2 vectors of 16 float32 accumulators; per pair of K values,
// one 512-bit row of pairs from each B panel and a broadcast pair of each A
// row feed 16 VDPBF16PS. Written once against a vector machine: the hardware
// (Dpbf16Vectors: GCC's vectors, VDPBF16PS as inline assembly, compiled for
// AVX-512 by the entry point that inlines it) or a scalar model of the
// instruction (Dpbf16Model) over the very same packed buffers.
//
// VDPBF16PS, as the Intel SDM writes it: for each lane j, with a and b the two
// sources' bfloat16 pairs of lane j: acc[j] += a[1] b[1], then += a[0] b[0],
// the products exact in float32, each sum rounded to nearest even.
#include <cstdint>
#include <cstring>

#include "base/bfloat16.h"
#include "cpu/matmul_bf16/isa.h"
#include "cpu/matmul_bf16/packing.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::bf16_gemm {

#if AG_BF16_AVX512_KERNEL
// The hardware, on 512-bit vectors. Only inlined into an AVX-512 entry point.
struct Dpbf16Vectors {
  typedef float Vec __attribute__((vector_size(64)));
  typedef std::int32_t Lanes __attribute__((vector_size(64)));
  // (Vectors are passed by reference, never returned: a 512-bit return value
  // would change the ABI of a function not compiled for AVX-512.)
  static AG_ALWAYS_INLINE void zero(Vec& v) { v = Vec{}; }
  static AG_ALWAYS_INLINE void load(Vec& v, const void* p) { std::memcpy(&v, p, sizeof v); }
  // The bfloat16 pair at p in every lane.
  static AG_ALWAYS_INLINE void broadcast_pair(Vec& v, const bfloat16* p) {
    std::int32_t pair;
    std::memcpy(&pair, p, sizeof pair);
    const Lanes lanes = Lanes{} + pair;
    std::memcpy(&v, &lanes, sizeof v);
  }
  // acc += the pairwise products of a's and b's bfloat16 pairs (AT&T order: b, a, acc).
  static AG_ALWAYS_INLINE void dot(Vec& acc, const Vec& a, const Vec& b) {
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  }
  static AG_ALWAYS_INLINE void store(float* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }
};
#endif

// The same in scalar C++.
struct Dpbf16Model {
  struct Vec {
    float lane[16];
  };
  static void zero(Vec& v) { v = Vec{}; }
  static void load(Vec& v, const void* p) { std::memcpy(v.lane, p, sizeof v.lane); }
  static void broadcast_pair(Vec& v, const bfloat16* p) {
    std::int32_t pair;
    std::memcpy(&pair, p, sizeof pair);
    for (float& lane : v.lane) std::memcpy(&lane, &pair, sizeof lane);
  }
  static void dot(Vec& acc, const Vec& a, const Vec& b) {
    for (int j = 0; j < 16; ++j) {
      std::uint16_t ap[2], bp[2];
      std::memcpy(ap, &a.lane[j], sizeof ap);
      std::memcpy(bp, &b.lane[j], sizeof bp);
      acc.lane[j] += bfloat16_to_float(ap[1]) * bfloat16_to_float(bp[1]);
      acc.lane[j] += bfloat16_to_float(ap[0]) * bfloat16_to_float(bp[0]);
    }
  }
  static void store(float* p, const Vec& v) { std::memcpy(p, v.lane, sizeof v.lane); }
};

// One 32 x 32 block of C over `steps` steps of 32 K values, as amx_block: c
// (float32, rows ldc apart) = (accumulate ? c : 0) + A B, A's tiles as ATiles
// says, B's panels at b0 and b1.
template <typename V>
AG_ALWAYS_INLINE void dpbf16_block(const ATiles& a, const bfloat16* b0, const bfloat16* b1, std::int64_t steps,
                                   float* c, std::int64_t ldc, bool accumulate) {
  using Vec = typename V::Vec;
  constexpr int kRows = 8;  // 16 accumulators, 2 B vectors and a broadcast: 19 of 32 registers
  constexpr std::int64_t kTileValues = 16 * kKStep;
  for (int r0 = 0; r0 < kBlock; r0 += kRows) {
    const bfloat16* rows = (r0 < 16 ? a.rows0 : a.rows16) + (r0 % 16) * a.row;  // row r0's first step
    Vec acc[kRows][2];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      if (accumulate) {
        V::load(acc[i][0], c + (r0 + i) * ldc);
        V::load(acc[i][1], c + (r0 + i) * ldc + 16);
      } else {
        V::zero(acc[i][0]);
        V::zero(acc[i][1]);
      }
    }
    for (std::int64_t s = 0; s < steps; ++s)
      for (std::int64_t q = 0; q < kKStep / 2; ++q) {  // the step's pairs
        Vec w0, w1;
        V::load(w0, b0 + s * kTileValues + q * 2 * kPanel);
        V::load(w1, b1 + s * kTileValues + q * 2 * kPanel);
#pragma GCC unroll 8
        for (int i = 0; i < kRows; ++i) {
          Vec x;
          V::broadcast_pair(x, rows + s * a.step + i * a.row + 2 * q);
          V::dot(acc[i][0], x, w0);
          V::dot(acc[i][1], x, w1);
        }
      }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      V::store(c + (r0 + i) * ldc, acc[i][0]);
      V::store(c + (r0 + i) * ldc + 16, acc[i][1]);
    }
  }
}

// One 32 x 32 block of the AVX512_BF16 kernel, a function of its own: inlined
// into the macro-block loops, GCC kept its 16 accumulators on the stack (a load
// and a store around every VDPBF16PS). Not measurably slower on the Xeons here,
// where VDPBF16PS itself issues once every 2 cycles or so (isa.cpp), but a chain
// through memory on every accumulator wherever it issues faster.
template <typename Vectors>
void dpbf16_block_call(const ATiles& a, const bfloat16* b0, const bfloat16* b1, std::int64_t steps, float* c,
                       std::int64_t ldc, bool accumulate) {
  dpbf16_block<Vectors>(a, b0, b1, steps, c, ldc, accumulate);
}
#if AG_BF16_AVX512_KERNEL
template <>
inline AG_TARGET_AVX512_BF16 __attribute__((noinline)) void dpbf16_block_call<Dpbf16Vectors>(
    const ATiles& a, const bfloat16* b0, const bfloat16* b1, std::int64_t steps, float* c, std::int64_t ldc,
    bool accumulate) {
  dpbf16_block<Dpbf16Vectors>(a, b0, b1, steps, c, ldc, accumulate);
}
#endif

// dpbf16_block_call on V behind the interface code written for every kernel
// runs on (the bfloat16 attention; AmxBlocks in amx.h is the other): begin()
// and end() around a thread's products (nothing to set up here), block() for
// each 32 x 32 block, amx_block's contract.
template <typename V>
struct Dpbf16Blocks {
  void begin() {}
  void end() {}
  AG_ALWAYS_INLINE void block(const ATiles& a, const bfloat16* b0, const bfloat16* b1, std::int64_t steps, float* c,
                              std::int64_t ldc, bool accumulate) {
    dpbf16_block_call<V>(a, b0, b1, steps, c, ldc, accumulate);
  }
};

}  // namespace attograd::cpu::bf16_gemm
