// matmul and linear with their backward. Transposes in the backward are views;
// BLAS reads them through transpose flags (cpu/matmul.cpp).
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/rows.h"
#include "tensor/kernels.h"

namespace attograd {
namespace {
using rows::as_rows;
using rows::mT;

// The (N, out) rows of a product as x's leading dims (..., out).
Tensor with_leading_dims(const Tensor& y, const Shape& x_shape) {
  Shape shape = x_shape;
  shape.back() = y.size(1);
  return make_view(y, shape, contiguous_strides(shape), y.offset());
}

// g, the gradient of a (..., out) result in any layout, as one (N, out) matrix, contiguous.
Tensor grad_rows(const Tensor& g, std::int64_t rows, std::int64_t out) {
  const Tensor c = kernels::contiguous(g);
  return make_view(c, {rows, out}, {out, 1}, c.offset());
}

// A linear layer's parameter gradients from g2, its output's gradient as (N,
// out), and x2, its input as (N, in): dW = g^T @ x, db = sum_rows(g) (or undefined).
std::vector<Tensor> parameter_grads(const Tensor& g2, const Tensor& x2, bool has_bias) {
  return {kernels::matmul(mT(g2), x2), has_bias ? kernels::sum(g2, {0}, false) : Tensor()};
}

// linear's gradients, g the gradient of its (..., out) result in any layout:
// y = x @ W^T + b; so dx = g @ W, dW = g^T @ x, db = sum_rows(g). x2 is x as (N, in).
std::vector<Tensor> linear_grads(const Tensor& g, const Tensor& x2, const Tensor& w, const Shape& x_shape,
                                 bool has_bias) {
  const Tensor g2 = grad_rows(g, x2.size(0), w.size(0));
  const Tensor dx = make_view(kernels::matmul(g2, w), x_shape, contiguous_strides(x_shape), 0);
  std::vector<Tensor> grads = parameter_grads(g2, x2, has_bias);
  grads.insert(grads.begin(), dx);
  return grads;
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  AG_CHECK(a_in.defined() && b_in.defined(), "matmul", "operand is an undefined tensor");
  const Tensor a = autocast_low(a_in), b = autocast_low(b_in);  // in bfloat16 under autocast
  AG_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul", "operands must be at least 1-d, got {} and {}",
           shape_str(a.sizes()), shape_str(b.sizes()));
  // NumPy: a 1-d operand gains a dim for the product, which is removed after.
  if (a.dim() == 1) return squeeze(matmul(unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return squeeze(matmul(a, unsqueeze(b, 1)), -1);
  return record("matmul", kernels::matmul(a, b), {a, b}, {a, b},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: c = a @ b; so da = g @ b^T, db = a^T @ g (summed over broadcast batch dims)
                  const Tensor &a = s[0], &b = s[1];
                  return {kernels::sum_to(kernels::matmul(g, mT(b)), a.sizes()),
                          kernels::sum_to(kernels::matmul(mT(a), g), b.sizes())};
                });
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  AG_CHECK(x_in.defined() && weight_in.defined(), "linear", "input or weight is an undefined tensor");
  // In bfloat16 under autocast: the weight's and bias's casts made once per guard.
  const Tensor x = autocast_low(x_in), weight = autocast_low(weight_in), bias = autocast_low(bias_in);
  AG_CHECK(weight.dim() == 2, "linear", "weight must be 2-d (out, in), got {}", shape_str(weight.sizes()));
  AG_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear", "input {} does not match weight {} (out, in)",
           shape_str(x.sizes()), shape_str(weight.sizes()));
  if (bias.defined())
    AG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear", "bias {} does not match weight {}",
             shape_str(bias.sizes()), shape_str(weight.sizes()));
  // All leading dims fold into the rows of one GEMM: (N, in) @ (in, out).
  const std::int64_t in = weight.size(1);
  const Tensor x2 = as_rows(x, in);
  const Tensor y = with_leading_dims(kernels::matmul(x2, mT(weight), bias), x.sizes());
  return record("linear", y, {x, weight, bias}, {x2, weight},
                [x_shape = x.sizes(), has_bias = bias.defined()](const Tensor& g,
                                                                  const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  return linear_grads(g, s[0], s[1], x_shape, has_bias);
                });
}

Tensor mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
           const Tensor& proj_bias) {
  // Autocast's bfloat16 products and element-wise ops are the composed ones'.
  if (autocast_enabled()) return linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight, proj_bias);
  const char* op = "mlp";
  AG_CHECK(x.defined() && fc_weight.defined() && proj_weight.defined(), op,
           "input, fc weight or proj weight is an undefined tensor");
  AG_CHECK(fc_weight.dim() == 2 && proj_weight.dim() == 2 && proj_weight.size(1) == fc_weight.size(0), op,
           "fc weight {} (hidden, in) and proj weight {} (out, hidden) do not chain", shape_str(fc_weight.sizes()),
           shape_str(proj_weight.sizes()));
  AG_CHECK(x.dim() >= 1 && x.size(-1) == fc_weight.size(1), op, "input {} does not match fc weight {} (hidden, in)",
           shape_str(x.sizes()), shape_str(fc_weight.sizes()));
  for (const auto& [bias, weight] : {std::pair{fc_bias, fc_weight}, std::pair{proj_bias, proj_weight}})
    if (bias.defined())
      AG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, "bias {} does not match weight {}",
               shape_str(bias.sizes()), shape_str(weight.sizes()));
  const Tensor x2 = as_rows(x, fc_weight.size(1));
  const kernels::LinearGelu h = kernels::linear_gelu(x2, fc_weight, fc_bias);  // (N, hidden) each
  const Tensor y = with_leading_dims(kernels::matmul(h.out, mT(proj_weight), proj_bias), x.sizes());
  // Only pre is kept: gelu(pre) is remade in the backward, an element-wise
  // pass beside two products, so that the layer keeps 4 hidden-wide values a
  // token for its backward instead of 8.
  return record(op, y, {x, fc_weight, fc_bias, proj_weight, proj_bias}, {x2, fc_weight, h.pre, proj_weight},
                [x_shape = x.sizes(), fc_has_bias = fc_bias.defined(), proj_has_bias = proj_bias.defined()](
                    const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: h = x W1^T + b1, a = gelu(h), y = a W2^T + b2; so
                  // dW2 = g^T a, db2 = sum_rows(g), dh = (g W2) * gelu'(h) in one
                  // pass, and dx, dW1, db1 are linear's gradients of dh.
                  const Tensor &x2 = s[0], &w1 = s[1], &pre = s[2], &w2 = s[3];
                  const Tensor g2 = grad_rows(g, x2.size(0), w2.size(0));
                  // a lives only for its product: the same bits as the forward's (tensor/kernels.h).
                  std::vector<Tensor> proj_grads =
                      parameter_grads(g2, kernels::unary(kernels::Unary::gelu, pre), proj_has_bias);
                  const Tensor dh = kernels::matmul_gelu_grad(g2, w2, pre);
                  std::vector<Tensor> grads = linear_grads(dh, x2, w1, x_shape, fc_has_bias);
                  grads.insert(grads.end(), proj_grads.begin(), proj_grads.end());
                  return grads;
                });
}

Tensor linear_heads(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, std::int64_t parts,
                    std::int64_t heads) {
  AG_CHECK(x_in.defined() && weight_in.defined(), "linear_heads", "input or weight is an undefined tensor");
  const Tensor x = autocast_low(x_in), weight = autocast_low(weight_in), bias = autocast_low(bias_in);
  // x made contiguous once, for the product and for the rows its backward keeps.
  const Tensor xc = kernels::contiguous(x);
  const Tensor y = kernels::linear_heads(xc, weight, bias, parts, heads);  // checks the shapes
  const Tensor x2 = as_rows(xc, weight.size(1));
  return record("linear_heads", y, {x, weight, bias}, {x2, weight},
                [x_shape = x.sizes(), has_bias = bias.defined()](const Tensor& g,
                                                                  const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = linear(x)'s (B, T, parts, heads, D) permuted to (B, parts, heads, T, D);
                  // so linear's gradients of g permuted back: a view with no copy when g lies so,
                  // as the fused attention writes d(qkv) (autograd/ops/attention.cpp).
                  const Shape& gs = g.sizes();
                  const Shape& st = g.strides();
                  const Tensor g_rows =
                      make_view(g, {gs[0], gs[3], gs[1], gs[2], gs[4]}, {st[0], st[3], st[1], st[2], st[4]}, g.offset());
                  return linear_grads(g_rows, s[0], s[1], x_shape, has_bias);
                });
}

}  // namespace attograd
