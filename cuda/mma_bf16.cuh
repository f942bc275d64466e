#pragma once
// Warp-level tensor-core products on bfloat16 operands with float32
// accumulation: mma.sync m16n8k16 .bf16 (sm_80 and newer). One instruction
// is 16 x 8 x 16 multiply-adds; a bfloat16 operand is exact as it is (8
// significant bits each, so every product is exact in float32), and the sums
// are the tensor core's float32 ones.
//
// The fragments, as the PTX ISA lays them out for m16n8k16 .bf16, with
// g = lane / 4 and t = lane % 4. Each 32-bit register holds two bfloat16
// values of consecutive k, the lower k in the low 16 bits:
//   A (16 x 16, row major): a[0] = A[g][2t, 2t+1]       a[1] = A[g + 8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9]     a[3] = A[g + 8][2t+8, 2t+9]
//   B (16 x 8, K x N):      b[0] = B[2t, 2t+1][g]       b[1] = B[2t+8, 2t+9][g]
//   C (16 x 8, float32):    c[0] = C[g][2t]   c[1] = C[g][2t + 1]   c[2] = C[g + 8][2t]   c[3] = C[g + 8][2t + 1]
// (C is m16n8k8's layout, cuda/mma.cuh, whose emulated_mma models both.) load_matrices
// below reads A's and B's registers from tiles stored with k along their rows
// or down them. In the emulated build (tests/cuda_emulator) the product
// is computed on the CPU from the whole warp's fragments, which the lanes
// exchange, reading them back through this layout.
#include <cstdint>

#include "base/bfloat16.h"
#include "cuda/device_utils.cuh"
#include "cuda/mma.cuh"

namespace attograd::cuda {

// Two bfloat16 values in one register, lo at the lower k.
__device__ __forceinline__ std::uint32_t bf16_pair(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// lo and hi rounded to bfloat16 in one register, lo in the low half: the
// probabilities of an attention as the A operand of its next product.
__device__ __forceinline__ std::uint32_t round_pair(float lo, float hi) {
#if defined(__CUDA_ARCH__) && !defined(ATTOGRAD_CUDA_EMULATION)
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));  // the first source goes to the upper half
  return r;
#else
  return bf16_pair(bfloat16_bits(lo), bfloat16_bits(hi));
#endif
}

// Two neighbouring bfloat16 values (aligned to 4 bytes) as one register.
__device__ __forceinline__ std::uint32_t pair_at(const std::uint16_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// Four 8 x 8 matrices of 16-bit values from shared memory in one instruction
// (ldmatrix.sync.aligned.m8n8.x4, sm_75 and newer), where 32-bit reads take
// four. Lanes 8i to 8i + 7 give the addresses of matrix i's rows 0 to 7 (16
// bytes each, aligned to 16); lane (g, t) gets in r[i] row g's values 2t and
// 2t + 1, the lower in the low half, which is the fragments' layout above for
// a tile stored with k running fastest. With Trans (.trans) it gets column g's
// values in rows 2t and 2t + 1, the matrix transposed: the same fragments from
// a tile stored with k running slowest, as a row-major B or a transposed A lie.
template <bool Trans>
__device__ __forceinline__ void load_matrices(std::uint32_t (&r)[4], const std::uint16_t* row) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0)
    ::emu::device_fault("ldmatrix: a row address not aligned to 16 bytes");
  const std::uint16_t* rows[kWarp];
  ::emu::warp_all_gather(kFullMask, row, rows);
  const int g = ::emu::lane() / 4, t = ::emu::lane() % 4;
  for (int i = 0; i < 4; ++i) {
    const std::uint16_t* const* matrix = rows + 8 * i;
    r[i] = Trans ? bf16_pair(matrix[2 * t][g], matrix[2 * t + 1][g]) : pair_at(matrix[g] + 2 * t);
  }
#else
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#endif
}

// The row this lane gives load_matrices for a 16 x 16 block of a tile whose
// stored rows are `pitch` values apart, as an offset from the block's first
// value. Matrix q = lane / 8 is one quarter of the block, and the lane gives
// its row lane % 8. Quarters down first (q: rows 8 (q % 2), columns 8 (q / 2)):
//   plain, an A fragment from A's rows (k along them);
//   transposing, two B fragments (columns n, n + 8) from B's rows (columns along them).
// Quarters across first (q: rows 8 (q / 2), columns 8 (q % 2)):
//   plain, two B fragments from B^T's rows (k along them);
//   transposing, an A fragment from A^T's rows (A's rows along them).
__device__ __forceinline__ int quarters_down_row(int pitch) {
  const int q = threadIdx.x % kWarp / 8;
  return (q % 2 * 8 + threadIdx.x % 8) * pitch + q / 2 * 8;
}
__device__ __forceinline__ int quarters_across_row(int pitch) {
  const int q = threadIdx.x % kWarp / 8;
  return (q / 2 * 8 + threadIdx.x % 8) * pitch + q % 2 * 8;
}

#if defined(ATTOGRAD_CUDA_EMULATION)
// The bfloat16 in half `k % 2` of a register, widened exactly.
inline float bf16_half_value(std::uint32_t pair, int k) {
  return bits_float((k % 2 ? pair >> 16 : pair & 0xffffu) << 16);
}
#endif

// c += A B for one 16 x 8 x 16 tile on bfloat16 operands. Every lane of the warp calls it together.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  emulated_mma_sequence(c, MmaOperands<1>{{{a[0], a[1], a[2], a[3]}}, {{b[0], b[1]}}, {c[0], c[1], c[2], c[3]}},
                        [](WarpC& sums, const WarpA& wa, const WarpB& wb) {
                          // A[row][k] and B[k][col] from the lanes that hold them (the layout above).
                          emulated_mma<16>(
                              sums, wa, wb,
                              [](const WarpA& all, int row, int k) {
                                return bf16_half_value(all[row % 8 * 4 + k % 8 / 2][row / 8 + 2 * (k / 8)], k);
                              },
                              [](const WarpB& all, int k, int col) {
                                return bf16_half_value(all[col * 4 + k % 8 / 2][k / 8], k);
                              });
                        });
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

}  // namespace attograd::cuda
