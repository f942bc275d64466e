#pragma once
// Composed reference versions of the fused ops, built only from primitive
// differentiable ops (exp, log, sub, div, sum, max, mean, mul, tanh, pow,
// where, ...). They are slower and keep every intermediate; they exist so each
// fused kernel can be tested against an independent derivation of the same
// function, forward and backward.
#include <cstdint>

#include "tensor/tensor.h"

namespace attograd::reference {

Tensor softmax(const Tensor& x, std::int64_t dim);
Tensor log_softmax(const Tensor& x, std::int64_t dim);
// Over the last dim; weight and bias (C) may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// logits (..., V), int64 targets of the leading shape; mean over targets != ignore_index (0 when none).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index = -100);
// GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x);

}  // namespace attograd::reference
