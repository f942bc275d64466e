#pragma once
// The element-wise ops, listed once: tensor/kernels.h (kernels::Unary and
// kernels::Binary), the CPU loops and the CUDA kernels (cuda/elementwise.cu)
// all take these enums, so an op cannot be known to one device and not the
// other. `s` is the scalar operand of the *_scalar forms.

namespace attograd {

// GELU's tanh-form constants, for both devices: k = sqrt(2/pi), and c, the
// cubic term's weight.
template <typename T>
constexpr T kGeluScale = T(0.7978845608028654);
template <typename T>
constexpr T kGeluCubic = T(0.044715);

#define AG_UNARY_OPS(X)                                                    \
  X(neg)          /* -x */                                                 \
  X(exp) X(log) X(sqrt) X(tanh) X(abs)                                     \
  X(relu)         /* max(x, 0) */                                          \
  X(step)         /* x > 0 ? 1 : 0 (relu's derivative) */                  \
  X(gelu)         /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */    \
  X(gelu_grad)    /* d gelu / dx */                                        \
  X(add_scalar)   /* x + s */                                              \
  X(mul_scalar)   /* x * s */                                              \
  X(rsub_scalar)  /* s - x */                                              \
  X(rdiv_scalar)  /* s / x */                                              \
  X(pow_scalar)   /* x ^ s */

enum class UnaryOp {
#define AG_ENUM(name) name,
  AG_UNARY_OPS(AG_ENUM)
#undef AG_ENUM
};

// Binary ops broadcast (NumPy rules). Comparisons (gt, lt, eq) give bool.
// gelu_backward(dy, x) = dy * gelu'(x): gelu's backward in one pass instead of
// gelu_grad's temporary and a multiply.
#define AG_BINARY_OPS(X) \
  X(add) X(sub) X(mul) X(div) X(pow) X(maximum) X(gelu_backward) X(gt) X(lt) X(eq)

enum class BinaryOp {
#define AG_ENUM(name) name,
  AG_BINARY_OPS(AG_ENUM)
#undef AG_ENUM
};

constexpr bool is_comparison(BinaryOp op) { return op == BinaryOp::gt || op == BinaryOp::lt || op == BinaryOp::eq; }

}  // namespace attograd
