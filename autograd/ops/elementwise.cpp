// Elementwise ops with their backward. Broadcast inputs get their gradient
// reduced back to their own shape by kernels::sum_to, the one place that does it.
#include <cmath>
#include <utility>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {

using kernels::Binary;
using kernels::Unary;

namespace {
Tensor unbroadcast(const Tensor& g, const Tensor& input) { return kernels::sum_to(g, input.sizes()); }
Tensor unbroadcast(const Tensor& g, const Shape& shape) { return kernels::sum_to(g, shape); }

// A bfloat16 operand meets a float32 (or float64) one in the wider dtype, as
// PyTorch promotes them: a float32 residual plus a bfloat16 branch under
// autocast is float32. The cast is differentiable, so each operand's gradient
// comes back in its own dtype. float32 with float64 stays an error ("dtypes
// differ"): there a mix is a mistake (gradcheck's float64 leaking into a model).
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.dtype() == b.dtype() || !is_floating(a.dtype()) || !is_floating(b.dtype()))
    return {a, b};
  if (a.dtype() == DType::bf16) return {to(a, b.dtype()), b};
  if (b.dtype() == DType::bf16) return {a, to(b, a.dtype())};
  return {a, b};
}

// For add and sub, whose backward needs no operand: float32 with bfloat16 goes
// to the kernel as it is (kernels::binary widens the bfloat16 operand as it
// reads it: no widened copy), and that operand's gradient is rounded back to
// bfloat16 here, as the cast promoted() inserts would do in its backward.
std::pair<Tensor, Tensor> promoted_unless_widened_in_kernel(const Tensor& a, const Tensor& b) {
  const bool f32_with_bf16 = a.defined() && b.defined() &&
                             ((a.dtype() == DType::f32 && b.dtype() == DType::bf16) ||
                              (a.dtype() == DType::bf16 && b.dtype() == DType::f32));
  return f32_with_bf16 ? std::pair{a, b} : promoted(a, b);
}
Tensor in_dtype(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : kernels::cast(g, dtype); }
}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted_unless_widened_in_kernel(a_in, b_in);
  return record("add", kernels::binary(Binary::add, a, b), {a, b}, {},
                [sa = a.sizes(), sb = b.sizes(), ta = a.dtype(), tb = b.dtype()](
                    const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                  // forward: y = a + b
                  return {in_dtype(unbroadcast(g, sa), ta), in_dtype(unbroadcast(g, sb), tb)};
                });
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted_unless_widened_in_kernel(a_in, b_in);
  return record("sub", kernels::binary(Binary::sub, a, b), {a, b}, {},
                [sa = a.sizes(), sb = b.sizes(), ta = a.dtype(), tb = b.dtype()](
                    const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                  // forward: y = a - b
                  return {in_dtype(unbroadcast(g, sa), ta), in_dtype(unbroadcast(neg(g), sb), tb)};
                });
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  return record("mul", kernels::binary(Binary::mul, a, b), {a, b}, {a, b},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = a * b; so da = g * b, db = g * a
                  return {unbroadcast(g * s[1], s[0]), unbroadcast(g * s[0], s[1])};
                });
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  return record("div", kernels::binary(Binary::div, a, b), {a, b}, {a, b},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = a / b; so da = g / b, db = -g * a / b^2
                  const Tensor& a = s[0];
                  const Tensor& b = s[1];
                  return {unbroadcast(g / b, a), unbroadcast(neg(g * a / (b * b)), b)};
                });
}

Tensor pow(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor y = kernels::binary(Binary::pow, a, b);
  return record("pow", y, {a, b}, {a, b, y}, [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
    // forward: y = a ^ b; so da = g * b * a^(b-1), db = g * y * log(a)
    const Tensor &a = s[0], &b = s[1], &y = s[2];
    return {unbroadcast(g * b * pow(a, b - 1.0), a), unbroadcast(g * y * log(a), b)};
  });
}

Tensor add(const Tensor& a, double s) {
  return record("add_scalar", kernels::unary(Unary::add_scalar, a, s), {a}, {},
                [](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {g}; });
}

Tensor mul(const Tensor& a, double s) {
  return record("mul_scalar", kernels::unary(Unary::mul_scalar, a, s), {a}, {},
                [s](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {g * s}; });
}

Tensor pow(const Tensor& a, double p) {
  return record("pow_scalar", kernels::unary(Unary::pow_scalar, a, p), {a}, {a},
                [p](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = a ^ p; so da = g * p * a^(p-1)
                  return {g * pow(s[0], p - 1.0) * p};
                });
}

Tensor rsub(double s, const Tensor& a) {
  return record("rsub_scalar", kernels::unary(Unary::rsub_scalar, a, s), {a}, {},
                [](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {neg(g)}; });
}

Tensor rdiv(double s, const Tensor& a) {
  Tensor y = kernels::unary(Unary::rdiv_scalar, a, s);
  return record("rdiv_scalar", y, {a}, {a, y}, [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
    // forward: y = s / a; so da = -g * y / a
    return {neg(g * s[1] / s[0])};
  });
}

Tensor neg(const Tensor& x) {
  return record("neg", kernels::unary(Unary::neg, x), {x}, {},
                [](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {neg(g)}; });
}

Tensor exp(const Tensor& x) {
  Tensor y = kernels::unary(Unary::exp, x);
  return record("exp", y, {x}, {y}, [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
    // forward: y = exp(x); so dx = g * y
    return {g * s[0]};
  });
}

Tensor log(const Tensor& x) {
  return record("log", kernels::unary(Unary::log, x), {x}, {x},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = log(x); so dx = g / x
                  return {g / s[0]};
                });
}

Tensor sqrt(const Tensor& x) {
  Tensor y = kernels::unary(Unary::sqrt, x);
  return record("sqrt", y, {x}, {y}, [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
    // forward: y = sqrt(x); so dx = g / (2 y)
    return {g / (s[0] * 2.0)};
  });
}

Tensor tanh(const Tensor& x) {
  Tensor y = kernels::unary(Unary::tanh, x);
  return record("tanh", y, {x}, {y}, [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
    // forward: y = tanh(x); so dx = g * (1 - y^2)
    return {g * rsub(1.0, s[0] * s[0])};
  });
}

Tensor relu(const Tensor& x) {
  return record("relu", kernels::unary(Unary::relu, x), {x}, {x},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = max(x, 0); so dx = g * (x > 0)
                  return {g * kernels::unary(Unary::step, s[0])};
                });
}

Tensor gelu(const Tensor& x) {
  const Tensor y = kernels::unary(Unary::gelu, x);
  // A product after it (an MLP's) keeps y for its weight's gradient; gelu keeps
  // x anyway, so a backward that reads y makes it again from x instead.
  if (any_requires_grad({x}))
    remade_from(y, "gelu", {x}, [](const std::vector<Tensor>& f) { return kernels::unary(Unary::gelu, f[0]); });
  return record("gelu", y, {x}, {x},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = gelu(x); so dx = g * gelu'(x) (derived in cpu/elementwise.cpp)
                  return {kernels::binary(Binary::gelu_backward, g, s[0])};
                });
}

Tensor gt(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::gt, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::lt, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::eq, a, b); }

Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  return record("where", kernels::where(mask, a, b), {a, b}, {mask},
                [sa = a.sizes(), sb = b.sizes()](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = mask ? a : b; so da = mask ? g : 0, db = mask ? 0 : g
                  const Tensor zero = zeros({}, g.options());
                  return {unbroadcast(kernels::where(s[0], g, zero), sa), unbroadcast(kernels::where(s[0], zero, g), sb)};
                });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  AG_CHECK(mask.defined() && mask.dtype() == DType::b8, "masked_fill", "mask must be a bool tensor, got {}",
           mask.defined() ? dtype_name(mask.dtype()) : "undefined");
  const Shape out = broadcast_shapes("masked_fill", x.sizes(), mask.sizes());
  AG_CHECK(out == x.sizes(), "masked_fill", "mask {} does not broadcast to the input {}", shape_str(mask.sizes()),
           shape_str(x.sizes()));
  const Tensor fill = full({}, value, x.options());
  return record("masked_fill", kernels::where(mask, fill, x), {x}, {mask},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = mask ? value : x; so dx = mask ? 0 : g
                  return {kernels::where(s[0], zeros({}, g.options()), g)};
                });
}

}  // namespace attograd
