// The composed references of autograd/ops/reference.h: each line is one
// primitive op, so autograd derives the backward on its own.
#include "autograd/ops/reference.h"

#include <cmath>

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd::reference {

Tensor softmax(const Tensor& x, std::int64_t dim) {
  // softmax(x) = softmax(x - c) for any constant c; c = max keeps exp <= 1.
  // The shift is detached: its gradient is exactly zero in theory.
  const Tensor shifted = x - max(x, dim, /*keepdim=*/true).detach();
  const Tensor e = exp(shifted);
  return e / sum(e, {dim}, /*keepdim=*/true);
}

Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  const Tensor shifted = x - max(x, dim, /*keepdim=*/true).detach();
  return shifted - log(sum(exp(shifted), {dim}, /*keepdim=*/true));
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor centered = x - mean(x, {-1}, /*keepdim=*/true);
  const Tensor var = mean(centered * centered, {-1}, /*keepdim=*/true);  // biased, as PyTorch
  Tensor y = centered * pow(var + eps, -0.5);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index) {
  const std::int64_t classes = logits.size(-1);
  const Tensor logp = reference::log_softmax(reshape(logits, {-1, classes}), -1);  // (N, V)
  // onehot[n, v] = (targets[n] == v); an ignored target matches no class.
  const Tensor target_col = reshape(kernels::cast(targets, logits.dtype()), {-1, 1});  // (N, 1)
  const Tensor classes_row = reshape(kernels::cast(arange(classes), logits.dtype()), {1, classes});  // (1, V)
  const Tensor onehot = eq(target_col, classes_row);  // (N, V) bool
  const Tensor picked = where(onehot, logp, zeros({}, logp.options()));
  std::int64_t count = 0;
  for (std::int64_t t : kernels::contiguous(targets).to_vector<std::int64_t>()) count += t != ignore_index;
  // No counted rows: 0 * the sum keeps a graph (with zero gradient) instead of 0/0.
  return mul(sum(picked), count > 0 ? -1.0 / static_cast<double>(count) : 0.0);
}

Tensor gelu(const Tensor& x) {
  const double k = std::sqrt(2.0 / M_PI);
  return x * 0.5 * (1.0 + tanh((x + pow(x, 3.0) * 0.044715) * k));
}

}  // namespace attograd::reference
