#pragma once
// The CPU's MLP products (tensor/kernels.h linear_gelu, matmul_gelu_grad): a
// float32 product whose kernel makes GELU's pass over C as it stores each
// band of C's rows (F32Gemm::Epilogue), so the activations are not read back
// from memory by a separate element-wise pass. Equal to the composed ops to the bit.
#include "tensor/tensor.h"

namespace attograd::cpu {

// Returns pre = x @ weight^T + bias and writes out = gelu(pre); x (N, in),
// weight (hidden, in), bias (hidden) or undefined, out (N, hidden): float32,
// contiguous.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

// (g @ weight) * gelu'(pre): GELU's backward made by the product that makes
// the gradient of its output. g (N, out), weight (out, hidden), pre (N,
// hidden): float32, contiguous.
Tensor matmul_gelu_grad(const Tensor& g, const Tensor& weight, const Tensor& pre);

}  // namespace attograd::cpu
