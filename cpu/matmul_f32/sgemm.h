#pragma once
// float32 matrix products of our own, for CPUs with AVX-512: OpenBLAS's
// SkylakeX/Cooperlake sgemm, which Debian 12's 0.3.21 runs there, falls well
// short of MKL's on the products of a GPT's layers (K = 128..512, one operand
// transposed in the backward pass), which decide a training step's time;
// docs/performance.md compares the three. The kernels:
//   avx512    6 x 64 blocks of C in 24 registers of 16 floats, A's values
//             broadcast, B's rows loaded (sgemm.cpp says how it is blocked)
//   avx2      the same code on 32-byte vectors (6 x 16 blocks in 12 of
//             AVX2's 16 registers), for bfloat16 operands (below)
//   portable  the same code on 16-byte vectors (6 x 8 blocks), for every
//             machine: tests run the packing and the blocking everywhere
//   openblas  cblas_sgemm
// avx512 where the CPU has it, else openblas, or the one ATTOGRAD_F32_GEMM
// names (one the CPU cannot run is refused). Products of bfloat16 operands
// (a CPU without bfloat16 instructions) run on a kernel of ours, which widens
// them as it packs, where float32's run on OpenBLAS: avx2, about as fast as
// OpenBLAS's float32 on AVX2 CPUs, where OpenBLAS would want widened copies
// of whole operands first.
#include <cstdint>

#include "base/bfloat16.h"

namespace attograd::cpu {

enum class F32Kernel { avx512, avx2, portable, openblas };

// "avx512", "avx2", "portable", "openblas".
const char* f32_kernel_name(F32Kernel kernel);

// The kernel float32 products run on here (read once; a bad
// ATTOGRAD_F32_GEMM throws "[matmul] ATTOGRAD_F32_GEMM=... ").
F32Kernel f32_kernel();

// The kernel products of bfloat16 operands run on (F32Gemm's a_bf16, b_bf16):
// f32_kernel(), but avx2 in place of openblas where it runs (unless
// ATTOGRAD_F32_GEMM chose openblas).
F32Kernel widening_f32_kernel();

// Whether this CPU can run `kernel`: portable and openblas always can.
bool f32_kernel_runs_here(F32Kernel kernel);

// C (m x n, row-major, rows ldc apart) = op(A) op(B), or C += op(A) op(B)
// when `accumulate`, plus bias[j] in column j of every row when `bias` is
// given; op(A) is m x k: A row-major with rows lda apart, or (a_transposed)
// A^T of a row-major k x m; op(B) is k x n likewise. One thread: the caller
// cuts a product into blocks for its threads. The bias is added as the first
// K chunk's sums are stored, so C = (the chunk's sums + C or 0) + bias, then
// each later chunk's sums are added: without `accumulate`, the bits of
// C = bias, then C += op(A) op(B).
struct F32Gemm {
  bool a_transposed = false, b_transposed = false;
  std::int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  std::int64_t lda = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0;
  float* c = nullptr;
  std::int64_t ldc = 0;
  bool accumulate = false;
  const float* bias = nullptr;  // n values
  // C cut into panels of c_panel_cols columns (0: one panel, C as above),
  // panel p a matrix of its own at c + p * c_panel_stride, rows ldc apart:
  // a projection written head by head (kernels::linear_heads). c_panel_cols a
  // multiple of f32_block_cols(kernel); not on openblas.
  std::int64_t c_panel_cols = 0, c_panel_stride = 0;
  // Either operand may be bfloat16 instead: a_bf16 in place of a (b_bf16 of
  // b), laid out as a would be. Its values are widened (exactly) as the kernel
  // packs them, so C is float32's product of the widened operands, to the bit,
  // with no widened copy written: the bfloat16 product on a CPU without
  // bfloat16 instructions (matmul_bf16.h's widen). openblas widens a copy first.
  const bfloat16* a_bf16 = nullptr;
  const bfloat16* b_bf16 = nullptr;
  // A pass the MLP's GELU makes over C, made here on each band of C's rows
  // right after its last sums are stored (and the bias added), while they are
  // in cache, instead of by an element-wise kernel reading C back from memory:
  //   gelu       companion = gelu(C); C (the pre-activation) kept for the backward
  //   gelu_grad  C *= gelu'(companion): gelu's backward, C the gradient of its output
  // companion has C's layout (the value of c[i * ldc + j] at companion[i * ldc + j]).
  // Not with accumulate or c_panel_cols. The values are the element-wise
  // kernels', to the bit (cpu/gelu_rows.h).
  enum class Epilogue { none, gelu, gelu_grad };
  Epilogue epilogue = Epilogue::none;
  float* companion = nullptr;
};
void gemm_f32(const F32Gemm& g, F32Kernel kernel = f32_kernel());

// The columns of C one register block of `kernel` spans (64 for avx512); 0
// for openblas, which cannot write C in panels.
std::int64_t f32_block_cols(F32Kernel kernel);

}  // namespace attograd::cpu
