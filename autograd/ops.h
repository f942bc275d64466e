#pragma once
// Every differentiable op of attograd. Each records a Node when grad mode is
// on and an input requires grad; forward and backward of each op live side by
// side in autograd/ops/<family>.cpp.
#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/rng.h"
#include "tensor/tensor.h"

namespace attograd {

// ---- elementwise (autograd/ops/elementwise.cpp); binary ops broadcast ----------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);  // a > 0 where b's gradient is wanted
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double p);
Tensor rsub(double s, const Tensor& a);  // s - a
Tensor rdiv(double s, const Tensor& a);  // s / a
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation, as GPT-2

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(s, a); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator/(double s, const Tensor& a) { return rdiv(s, a); }

// Comparisons: bool results, no gradient.
Tensor gt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);

// mask ? a : b (mask bool, all three broadcast); masked_fill puts `value` where mask is true.
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ---- reductions (autograd/ops/reduce.cpp) ----------------------------------------
Tensor sum(const Tensor& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false);  // {} = all
Tensor mean(const Tensor& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false);
// Max over one dim; the gradient goes to the first position of the maximum.
Tensor max(const Tensor& x, std::int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements, a scalar
Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim = false);  // int64, no gradient

// ---- views and copies (autograd/ops/view.cpp) ------------------------------------
// view: same storage, needs compatible strides (error otherwise); one size may be -1.
Tensor view(const Tensor& x, const Shape& sizes);
Tensor reshape(const Tensor& x, const Shape& sizes);  // a view when possible, else a copy
Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims);
Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length);
// Python's x[start:end:step] along dim (negative start/end count from the end; clamped).
Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1);
Tensor select(const Tensor& x, std::int64_t dim, std::int64_t index);  // drops dim
Tensor expand(const Tensor& x, const Shape& sizes);  // -1 keeps a size
Tensor unsqueeze(const Tensor& x, std::int64_t dim);
Tensor squeeze(const Tensor& x, std::int64_t dim);  // dim must have size 1
Tensor squeeze(const Tensor& x);                    // every size-1 dim
Tensor flatten(const Tensor& x, std::int64_t start_dim = 0, std::int64_t end_dim = -1);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);
Tensor to_cpu(const Tensor& x);

// ---- joins (autograd/ops/join.cpp) ---------------------------------------------------
Tensor cat(const std::vector<Tensor>& xs, std::int64_t dim);
// Pieces of `split_size` along dim (the last may be shorter); views of x.
std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim);

// ---- linear algebra (autograd/ops/matmul.cpp) -------------------------------------
// NumPy matmul: 1-D operands are promoted and the added dim removed; batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// x (..., in) @ weight^T (in -> out) + bias: weight is (out, in), as torch.nn.Linear.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// linear laid out head by head: x (B, T, in), weight (parts * heads * D, in)
// -> (B, parts, heads, T, D), y[b, p, h] the (T, D) block of columns (p *
// heads + h) * D on: MultiHeadAttention's q, k, v (parts = 3) as the fused
// attention reads them, written in place where the device's kernel can, else
// a view of linear's result (kernels::linear_heads). Equal to linear's result
// permuted, to the bit, in either layout.
Tensor linear_heads(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts,
                    std::int64_t heads);
// The position-wise MLP, linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight,
// proj_bias) (nn::MLP): x (..., in), fc_weight (hidden, in), proj_weight (out,
// hidden), biases or undefined. One op, so that GELU's passes ride on the
// products (kernels::linear_gelu, matmul_gelu_grad); equal to the composed
// ops to the bit, which it runs under autocast.
Tensor mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
           const Tensor& proj_bias);

// ---- neural-network functions --------------------------------------------------------
Tensor softmax(const Tensor& x, std::int64_t dim);      // autograd/ops/softmax.cpp
Tensor log_softmax(const Tensor& x, std::int64_t dim);
// Over the last dim; weight and bias of shape (C) (either may be undefined).  -> norm.cpp
// The result is in x's dtype unless `result` says bfloat16 from float32: then
// it is to(layer_norm(x, weight, bias, eps), bfloat16) to the bit, forward and
// backward, without the float32 result and its gradient in memory (on the CPU;
// mean and rstd stay float32). For a LayerNorm that feeds products under
// autocast (nn::LayerNorm::feeding_products). With `remade`, a backward that
// reads the result makes it again from x (the layer norm keeps x for its own
// backward) instead of keeping it: for a result that products read, which
// keep their input for their weight's gradient (autograd/node.h's Remake).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  std::optional<DType> result = {}, bool remade = false);
Tensor embedding(const Tensor& weight, const Tensor& ids);  // weight (V, C), int64 ids  -> embedding.cpp
// logits (N, V) or (..., V) with targets of the leading shape, int64; mean over
// targets != ignore_index.                                              -> loss.cpp
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index = -100);
// cross_entropy(linear(x, weight[:classes]), targets, ignore_index) without the
// (N, classes) logits or their gradient ever whole: made chunk_rows rows at a
// time, each chunk's gradients for x and the weight made at once in the
// forward (where a gradient is wanted) and scaled by the backward, as llm.c
// fuses its classifier. x (..., in), weight (rows, in)
// with classes <= rows (0: all; the rest, a padded vocabulary's, get zero
// gradient), targets of x's leading shape. chunk_rows 0: rows of about 128 MiB
// of float32 logits (classifier_chunk_rows). One chunk gives cross_entropy's
// bits.                                                                  -> loss.cpp
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            std::int64_t ignore_index = -100, std::int64_t classes = 0, std::int64_t chunk_rows = 0);
std::int64_t classifier_chunk_rows(std::int64_t classes);
// Inverted dropout: identity when !training or p == 0.                   -> dropout.cpp
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

}  // namespace attograd
