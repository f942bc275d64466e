#pragma once
// bfloat16 matrix products on the CPU: operands in bfloat16, products and sums
// in float32, C rounded once to bfloat16 (cpu/matmul_bf16/: the kernel
// chosen in isa.h, operands packed as packing.h says, the AMX kernel in amx.h,
// the AVX512_BF16 one in dpbf16.h, the threads and the rounding here).
#include <cstdint>

#include "base/bfloat16.h"
#include "cpu/matmul_bf16/isa.h"
#include "cpu/matmul_bf16/packing.h"
#include "tensor/tensor.h"

namespace attograd::cpu {

// C (m x n: element (i, j) at c[i * ldc + j * c_col_stride]) = A (m x k) B (k x n)
// + bias (n values, or null).
struct Bf16Gemm {
  bf16_gemm::Bf16Matrix a, b;
  bfloat16* c;
  std::int64_t ldc;
  const bfloat16* bias;
  std::int64_t m, n, k;
  std::int64_t c_col_stride = 1;
};

// One product on `kernel` (which must run here: bf16_kernel_runs_here), on the
// pool's threads.
void gemm_bf16(const Bf16Gemm& g, Bf16Kernel kernel = bf16_kernel());

// cpu::matmul for bfloat16 operands: each batch's product by gemm_bf16, or
// by matmul_widened where the kernel is widen.
Tensor matmul_bf16(const Tensor& a, const Tensor& b, const Shape& batch_shape, const Tensor& bias);

// cpu::matmul of bfloat16 operands (and bias) on the float32 kernel that
// widens them exactly as it packs them (widening_f32_kernel): float32's sums
// plus the bias, rounded once into a bfloat16 result, with no widened copy of
// an operand and no float32 C written whole (matmul.cpp).
Tensor matmul_widened(const Tensor& a, const Tensor& b, const Shape& batch_shape, const Tensor& bias);

}  // namespace attograd::cpu
