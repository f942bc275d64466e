#pragma once
// Warp-level tensor-core products in float32 accuracy: mma.sync m16n8k8 on TF32
// operands (sm_80 and newer), with every float32 operand split into two TF32
// numbers, x = big + small, and each product made of three:
//   a b ~ a_small b_big + a_big b_small + a_big b_big   (a_small b_small, ~2^-22 a b, is dropped)
// This is "3xTF32" (CUTLASS's OpMultiplyAddFastF32, which PyTorch's float32
// attention kernels use): one TF32 product alone keeps 10 mantissa bits of each
// operand, too few to match the CPU's float32 results.
//
// The split is six instructions where two cvt.rna.tf32.f32 would be eight (at
// sm_90 each is an add, a compare, a select and a mask): the big part is x
// truncated to TF32 (its low 13 bits cleared), and the small part is the rest,
// x - big (exact in float32), rounded to nearest by adding half of TF32's last
// place before clearing the same bits (CUTLASS's round_toward_zero big and
// round_half_ulp_truncate small parts). Both are exact TF32 numbers, so the
// product does not depend on what the tensor core makes of low bits.
//
// The fragments, as the PTX ISA lays them out for m16n8k8 .tf32, with
// g = lane / 4 and t = lane % 4 (a lane holds 4 values of A, 2 of B, 4 of C):
//   A (16 x 8, row major):  a[0] = A[g][t]    a[1] = A[g + 8][t]    a[2] = A[g][t + 4]    a[3] = A[g + 8][t + 4]
//   B (8 x 8, K x N):       b[0] = B[t][g]    b[1] = B[t + 4][g]
//   C (16 x 8):             c[0] = C[g][2t]   c[1] = C[g][2t + 1]   c[2] = C[g + 8][2t]   c[3] = C[g + 8][2t + 1]
// CUTLASS's CuTe writes the same three for SM80_16x8x8_F32TF32TF32F32_TN (cute/atom/mma_traits_sm80.hpp:
// A ((4,8),(2,2)):((16,1),(8,64)), B ((4,8),2):((8,1),32), C SM80_16x8_Row ((4,8),(2,2)):((32,1),(16,8)),
// thread t0 + 4 t1 and value v0 + 2 v1 mapped to a column-major index m + 16 k, n + 8 k and m + 16 n).
// In the emulated build (tests/cuda_emulator) the product is computed on the CPU
// from the whole warp's fragments, which the lanes exchange.
#include <cstdint>

#include "cuda/device_utils.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attograd's tensor-core kernels (cuda/mma.cuh) need sm_80 or newer: set CMAKE_CUDA_ARCHITECTURES to 80 or above"
#endif

#if defined(ATTOGRAD_CUDA_EMULATION)
#include <bit>
#include <cmath>
#endif

namespace attograd::cuda {

__device__ __forceinline__ std::uint32_t float_bits(float x) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  return std::bit_cast<std::uint32_t>(x);
#else
  return __float_as_uint(x);
#endif
}

__device__ __forceinline__ float bits_float(std::uint32_t bits) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  return std::bit_cast<float>(bits);
#else
  return __uint_as_float(bits);
#endif
}

constexpr std::uint32_t kTf32Mask = 0xffffe000u;  // the bits of a float32 that a TF32 operand keeps

// A TF32 operand's value as the emulator reads it: the low 13 bits dropped (zero in every operand made here).
__device__ __forceinline__ float tf32_operand_value(std::uint32_t bits) { return bits_float(bits & kTf32Mask); }

// The big part of x: x truncated to TF32. inf and NaN stay themselves.
__device__ __forceinline__ std::uint32_t tf32_big(float x) { return float_bits(x) & kTf32Mask; }

// The small part of x: x - big, rounded to TF32 (half of TF32's last place
// added, then truncated). 0 for inf and NaN, whose big part carries them
// through the product as a float32 FMA would (inf - inf would make every product NaN).
__device__ __forceinline__ std::uint32_t tf32_small(float x) {
  const float rest = x - bits_float(tf32_big(x));
  return rest == rest ? (float_bits(rest) + 0x1000u) & kTf32Mask : 0u;
}

// N float32 values of a fragment, each as its big and small TF32 parts.
template <int N>
struct SplitFragment {
  std::uint32_t big[N], small[N];
};

template <int N>
__device__ __forceinline__ SplitFragment<N> split_tf32(const float (&x)[N]) {
  SplitFragment<N> f;
#pragma unroll
  for (int i = 0; i < N; ++i) f.big[i] = tf32_big(x[i]), f.small[i] = tf32_small(x[i]);
  return f;
}

#if defined(ATTOGRAD_CUDA_EMULATION)
// The emulated mma.sync of shape m16n8kK, for the whole warp at once: each
// lane's four C values (the C layout above, the same for every K), each plus
// its sum over k of A[row][k] B[k][col], which a_at(a, row, k) and b_at(b, k,
// col) read back from the lanes' A and B registers. The products of TF32 or
// bfloat16 numbers are exact in double; the tensor core's sum order is its own.
// The sum is rounded toward zero, not to nearest: the tensor cores truncate
// their float32 sums (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior
// of NVIDIA tensor cores", 2021, for V100 to A100; on Hopper the [cuda] probe
// "the tensor cores' float32 sums round toward zero" checks it). The hardware
// truncates each term as it aligns them too, which can lose a little more
// than this one rounding.
inline float rounded_toward_zero(double sum) {
  const float nearest = static_cast<float>(sum);
  return std::abs(static_cast<double>(nearest)) > std::abs(sum) ? std::nextafter(nearest, 0.0f) : nearest;
}

using WarpA = std::uint32_t[kWarp][4];
using WarpB = std::uint32_t[kWarp][2];
using WarpC = float[kWarp][4];
template <int K, typename AAt, typename BAt>
void emulated_mma(WarpC& c, const WarpA& a, const WarpB& b, AAt a_at, BAt b_at) {
  double a_values[16][K], b_values[K][8];
  for (int k = 0; k < K; ++k) {
    for (int row = 0; row < 16; ++row) a_values[row][k] = a_at(a, row, k);
    for (int col = 0; col < 8; ++col) b_values[k][col] = b_at(b, k, col);
  }
  for (int lane = 0; lane < kWarp; ++lane)
    for (int r = 0; r < 4; ++r) {
      const int row = lane / 4 + r / 2 * 8, col = lane % 4 * 2 + r % 2;
      double sum = c[lane][r];
      for (int k = 0; k < K; ++k) sum += a_values[row][k] * b_values[k][col];
      c[lane][r] = rounded_toward_zero(sum);
    }
}

// One m16n8k8 .tf32 product: A[row][k] and B[k][col] from the lanes that hold
// them (the layout above), truncated.
struct EmulatedTf32Product {
  void operator()(WarpC& c, const WarpA& a, const WarpB& b) const {
    emulated_mma<8>(
        c, a, b,
        [](const WarpA& all, int row, int k) {
          return tf32_operand_value(all[row % 8 * 4 + k % 4][row / 8 + 2 * (k / 4)]);
        },
        [](const WarpB& all, int k, int col) { return tf32_operand_value(all[col * 4 + k % 4][k / 4]); });
  }
};

// What a lane hands its warp for a product, and gets back.
template <int Products>
struct MmaOperands {
  std::uint32_t a[Products][4], b[Products][2];
  float c[4];
};
struct MmaResult {
  float c[4];
};

// The warp's products of `Products` (A, B) pairs, made one after the other
// into C, once for the warp: `product(c, a, b)` makes one.
template <int Products, typename Product>
void emulated_mma_sequence(float (&c)[4], const MmaOperands<Products>& mine, Product) {
  const MmaResult result = ::emu::warp_combine<MmaResult>(
      kFullMask, mine, [](const MmaOperands<Products> (&all)[kWarp], MmaResult (&each)[kWarp]) {
        WarpA a;
        WarpB b;
        WarpC sums;
        for (int lane = 0; lane < kWarp; ++lane)
          for (int r = 0; r < 4; ++r) sums[lane][r] = all[lane].c[r];
        for (int p = 0; p < Products; ++p) {
          for (int lane = 0; lane < kWarp; ++lane) {
            for (int r = 0; r < 4; ++r) a[lane][r] = all[lane].a[p][r];
            for (int r = 0; r < 2; ++r) b[lane][r] = all[lane].b[p][r];
          }
          Product{}(sums, a, b);
        }
        for (int lane = 0; lane < kWarp; ++lane)
          for (int r = 0; r < 4; ++r) each[lane].c[r] = sums[lane][r];
      });
  for (int r = 0; r < 4; ++r) c[r] = result.c[r];
}
#endif

// c += A B for one 16 x 8 x 8 tile, on TF32 operands. Every lane of the warp calls it together.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  emulated_mma_sequence(c, MmaOperands<1>{{{a[0], a[1], a[2], a[3]}}, {{b[0], b[1]}}, {c[0], c[1], c[2], c[3]}},
                        EmulatedTf32Product{});
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// c += A B in float32 accuracy (3xTF32): the small products first, so they are
// not lost against the big one.
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const SplitFragment<4>& a, const SplitFragment<2>& b) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  // The same three products, the warp's operands exchanged once.
  const MmaOperands<3> operands{{{a.small[0], a.small[1], a.small[2], a.small[3]},
                                 {a.big[0], a.big[1], a.big[2], a.big[3]},
                                 {a.big[0], a.big[1], a.big[2], a.big[3]}},
                                {{b.big[0], b.big[1]}, {b.small[0], b.small[1]}, {b.big[0], b.big[1]}},
                                {c[0], c[1], c[2], c[3]}};
  emulated_mma_sequence(c, operands, EmulatedTf32Product{});
#else
  mma_tf32(c, a.small, b.big);
  mma_tf32(c, a.big, b.small);
  mma_tf32(c, a.big, b.big);
#endif
}

}  // namespace attograd::cuda
