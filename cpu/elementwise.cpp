// Elementwise CPU kernels: unary, binary, where, copy/cast, fill, axpy. Each is
// an inner loop handed to cpu::strided_loop; the contiguous case (all strides
// equal to the element size) is written out separately so the compiler
// vectorises it.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/bf16_rounding.h"
#include "cpu/gelu_rows.h"
#include "cpu/loops.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"

namespace attograd::cpu {
namespace {

// GELU, tanh form: 0.5 x (1 + tanh(u)) with u = k (x + c x^3), written as
// x s with s = sigmoid(2u) = 1 / (1 + exp(-2u)), since 0.5 (1 + tanh(u)) =
// sigmoid(2u): one exponential and one division, about half the vector
// instructions of a tanh (no sign or small-argument handling). exp(-2u)
// overflows to inf for very negative x, giving s = 0 as it should.
template <typename T>
T gelu_sigmoid(T x) {
  const T k = kGeluScale<T>, c = kGeluCubic<T>;
  return T(1) / (T(1) + exp_of(T(-2) * k * (x + c * x * x * x)));
}
// The same in float32 without a division, nor exp_fast's handling of NaN and
// the edges (perf put most of the forward loop on the instruction after its
// VDIVPS, and on those masks and blends). The exponent
// -2u is clamped to [kExpMin, 69], where e^-2u stays normal and 1 + e^-2u
// within reciprocal_in_range's [1, 2^100]; past 69 s is 0 (1 / (1 + e^69) ~
// 1e-30; exactly what it rounds to matters only as x s for huge |x|). A NaN x
// gives a NaN y = x s and a NaN gradient through its x terms, whatever s is.
template <>
float gelu_sigmoid(float x) {
  const float k = kGeluScale<float>, c = kGeluCubic<float>;
  constexpr float kLargest = 69.0f;  // e^69 < 2^100
  const float z = -2.0f * k * (x + c * x * x * x);
  const float zc = z > kExpMin ? (z < kLargest ? z : kLargest) : kExpMin;
  const float s = reciprocal_in_range(1.0f + exp_in_range(zc));
  return z < kLargest ? s : 0.0f;
}
template <typename T>
T gelu(T x) {
  return x * gelu_sigmoid(x);
}
template <typename T>
T gelu_grad(T x) {
  // forward: y = x s, s = sigmoid(2u), u = k (x + c x^3)
  // so dy/dx = s + x s (1 - s) 2 du/dx = s + 2 x s (1 - s) k (1 + 3 c x^2)
  const T k = kGeluScale<T>, c = kGeluCubic<T>;
  const T s = gelu_sigmoid(x);
  return s + T(2) * x * s * (T(1) - s) * k * (T(1) + T(3) * c * x * x);
}

template <typename T>
T apply_unary(kernels::Unary op, T x, T s) {
  using U = kernels::Unary;
  switch (op) {
    case U::neg: return -x;
    case U::exp: return exp_of(x);
    case U::log: return std::log(x);
    case U::sqrt: return std::sqrt(x);
    case U::tanh: return tanh_of(x);
    case U::abs: return std::abs(x);
    case U::relu: return x > T(0) ? x : T(0);
    case U::step: return x > T(0) ? T(1) : T(0);
    case U::gelu: return gelu(x);
    case U::gelu_grad: return gelu_grad(x);
    case U::add_scalar: return x + s;
    case U::mul_scalar: return x * s;
    case U::rsub_scalar: return s - x;
    case U::rdiv_scalar: return s / x;
    case U::pow_scalar: return std::pow(x, s);
  }
  return x;
}

// Runs f(x) -> y over two operands (out, in), with the op resolved outside
// the element loop so each loop body is a single inlinable lambda.
template <typename Out, typename In, typename F>
void map1(const Tensor& out, const Tensor& in, F f) {
  Operands<2> ops;
  set_operand(ops, 0, out, out.sizes());
  set_operand(ops, 1, in, out.sizes());
  strided_loop<2>(out.sizes(), ops, [&](std::array<char*, 2> p, std::array<std::int64_t, 2> s, std::int64_t n) {
    auto* y = reinterpret_cast<Out*>(p[0]);
    auto* x = reinterpret_cast<const In*>(p[1]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
      for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const In*>(p[1] + i * s[1]));
    }
  });
}

template <typename Out, typename A, typename B, typename F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  Operands<3> ops;
  set_operand(ops, 0, out, out.sizes());
  set_operand(ops, 1, a, out.sizes());
  set_operand(ops, 2, b, out.sizes());
  strided_loop<3>(out.sizes(), ops, [&](std::array<char*, 3> p, std::array<std::int64_t, 3> s, std::int64_t n) {
    auto* y = reinterpret_cast<Out*>(p[0]);
    auto* x0 = reinterpret_cast<const A*>(p[1]);
    auto* x1 = reinterpret_cast<const B*>(p[2]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == sizeof(B)) {
      for (std::int64_t i = 0; i < n; ++i) y[i] = f(x0[i], x1[i]);
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == 0) {  // tensor op scalar-like row
      const B v = *x1;
      for (std::int64_t i = 0; i < n; ++i) y[i] = f(x0[i], v);
    } else {
      for (std::int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            f(*reinterpret_cast<const A*>(p[1] + i * s[1]), *reinterpret_cast<const B*>(p[2] + i * s[2]));
    }
  });
}

// The transcendental float32 ops on contiguous data: out of line so each is
// compiled once per SIMD level (AG_SIMD_CLONES) around the inlined polynomial.
AG_SIMD_CLONES void exp_f32(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = exp_fast(x[i]);
}
AG_SIMD_CLONES void tanh_f32(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = tanh_fast(x[i]);
}
AG_SIMD_CLONES void gelu_grad_f32(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = gelu_grad(x[i]);
}

}  // namespace

// Outside the anonymous namespace: the float32 products' GELU epilogue
// (F32Gemm::Epilogue) runs these very loops, so that the MLP's fused products
// and the composed ops agree to the bit.
AG_SIMD_CLONES void gelu_f32(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}
AG_SIMD_CLONES void gelu_backward_f32(float* y, const float* dy, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = dy[i] * gelu_grad(x[i]);
}
// Restrict: y and x apart, so that the loop vectorises with no overlap test.
AG_SIMD_CLONES void scale_by_gelu_grad_f32(float* __restrict y, const float* __restrict x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = y[i] * gelu_grad(x[i]);
}

namespace {

// The float32 arithmetic on contiguous data, compiled per SIMD level too: the
// generic loop is built for the baseline (SSE2), and float32 adds and products
// (gradients accumulated, residual streams) are a visible part of a bfloat16 step.
AG_SIMD_CLONES void add_f32(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
AG_SIMD_CLONES void sub_f32(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
}
AG_SIMD_CLONES void mul_f32(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}
AG_SIMD_CLONES void div_f32(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] / b[i];
}

// ---- bfloat16 operands through float32, a chunk at a time ----
// Each bfloat16 operand is widened (exactly) a chunk at a time into a buffer
// on the stack, the float32 loop runs there, and the result is rounded once on
// the way out: the float32 op of the widened tensors, to the bit, without
// writing them to memory. (Widening whole tensors, then rounding, cost a fifth
// of a bfloat16 training step.)
constexpr std::int64_t kChunk = 512;  // 2 KiB of float32 per operand: L1-resident

void load_chunk(float* dst, const char* p, std::int64_t stride, std::int64_t n) {
  if (stride == sizeof(bfloat16)) return widen_bf16(dst, reinterpret_cast<const std::uint16_t*>(p), n);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = *reinterpret_cast<const bfloat16*>(p + i * stride);
}
void store_chunk(char* p, std::int64_t stride, const float* src, std::int64_t n) {
  if (stride == sizeof(bfloat16)) return round_to_bf16(reinterpret_cast<std::uint16_t*>(p), src, n);
  for (std::int64_t i = 0; i < n; ++i) *reinterpret_cast<bfloat16*>(p + i * stride) = bfloat16(src[i]);
}

// The float32 loops the chunks run: the contiguous loops of unary_typed<float>
// and binary_typed<float> below, so a bfloat16 op rounds what float32 computes.
void unary_f32_chunk(kernels::Unary op, float* y, const float* x, std::int64_t n, float s) {
  using U = kernels::Unary;
  switch (op) {
    case U::exp: return exp_f32(y, x, n);
    case U::tanh: return tanh_f32(y, x, n);
    case U::gelu: return gelu_f32(y, x, n);
    case U::gelu_grad: return gelu_grad_f32(y, x, n);
    case U::add_scalar: for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] + s; return;
    case U::mul_scalar: for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * s; return;
    case U::neg: for (std::int64_t i = 0; i < n; ++i) y[i] = -x[i]; return;
    default: for (std::int64_t i = 0; i < n; ++i) y[i] = apply_unary(op, x[i], s); return;
  }
}
void binary_f32_chunk(kernels::Binary op, float* y, const float* a, const float* b, std::int64_t n) {
  using B = kernels::Binary;
  switch (op) {
    case B::add: return add_f32(y, a, b, n);
    case B::sub: return sub_f32(y, a, b, n);
    case B::mul: return mul_f32(y, a, b, n);
    case B::div: return div_f32(y, a, b, n);
    case B::pow: for (std::int64_t i = 0; i < n; ++i) y[i] = std::pow(a[i], b[i]); return;
    case B::maximum: for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] >= b[i] ? a[i] : b[i]; return;
    case B::gelu_backward: return gelu_backward_f32(y, a, b, n);
    default: fail(kernels::binary_name(op), "a comparison has no bfloat16 result");
  }
}

void unary_bf16(kernels::Unary op, const Tensor& out, const Tensor& x, float s) {
  Operands<2> ops;
  set_operand(ops, 0, out, out.sizes());
  set_operand(ops, 1, x, out.sizes());
  strided_loop<2>(out.sizes(), ops, [&](std::array<char*, 2> p, std::array<std::int64_t, 2> st, std::int64_t n) {
    alignas(64) float in[kChunk], res[kChunk];
    for (std::int64_t i = 0; i < n; i += kChunk) {
      const std::int64_t m = std::min(kChunk, n - i);
      load_chunk(in, p[1] + i * st[1], st[1], m);
      unary_f32_chunk(op, res, in, m, s);
      store_chunk(p[0] + i * st[0], st[0], res, m);
    }
  });
}

// A chunk of m values of an operand as float32: bfloat16 widened into
// `buffer`, float32 read where it lies when contiguous.
const float* f32_chunk(DType dtype, const char* p, std::int64_t stride, std::int64_t m, float* buffer) {
  if (dtype == DType::bf16) {
    load_chunk(buffer, p, stride, m);
    return buffer;
  }
  if (stride == sizeof(float)) return reinterpret_cast<const float*>(p);
  for (std::int64_t j = 0; j < m; ++j) buffer[j] = *reinterpret_cast<const float*>(p + j * stride);
  return buffer;
}

// out = a op b where a bfloat16 tensor is among them: bfloat16 with bfloat16
// (then out is bfloat16, rounded once), or float32 with bfloat16 (out float32:
// a float32 residual plus a bfloat16 branch under autocast, without a widened
// copy of the branch, a pass of its own over every residual). Also add_'s
// y += alpha x (op add, with b scaled first when alpha != 1).
void binary_bf16(kernels::Binary op, const Tensor& out, const Tensor& a, const Tensor& b, float alpha = 1) {
  Operands<3> ops;
  set_operand(ops, 0, out, out.sizes());
  set_operand(ops, 1, a, out.sizes());
  set_operand(ops, 2, b, out.sizes());
  const DType ta = a.dtype(), tb = b.dtype(), tout = out.dtype();
  strided_loop<3>(out.sizes(), ops, [&](std::array<char*, 3> p, std::array<std::int64_t, 3> st, std::int64_t n) {
    alignas(64) float buf_a[kChunk], buf_b[kChunk], res[kChunk];
    for (std::int64_t i = 0; i < n; i += kChunk) {
      const std::int64_t m = std::min(kChunk, n - i);
      const float* in_a = f32_chunk(ta, p[1] + i * st[1], st[1], m, buf_a);
      const float* in_b = f32_chunk(tb, p[2] + i * st[2], st[2], m, buf_b);
      if (alpha != 1) {
        for (std::int64_t j = 0; j < m; ++j) buf_b[j] = in_b[j] * alpha;
        in_b = buf_b;
      }
      char* dst = p[0] + i * st[0];
      if (tout == DType::f32 && st[0] == sizeof(float)) {
        binary_f32_chunk(op, reinterpret_cast<float*>(dst), in_a, in_b, m);
        continue;
      }
      binary_f32_chunk(op, res, in_a, in_b, m);
      if (tout == DType::bf16) {
        store_chunk(dst, st[0], res, m);
      } else {
        for (std::int64_t j = 0; j < m; ++j) *reinterpret_cast<float*>(dst + j * st[0]) = res[j];
      }
    }
  });
}

// The casts between float32 and bfloat16, of whole tensors or of views
// (attention's heads, a transposed gradient): every contiguous inner run
// (a whole dense tensor is one) through the vectorised loops above.
void round_strided(const Tensor& dst, const Tensor& src) {
  Operands<2> ops;
  set_operand(ops, 0, dst, dst.sizes());
  set_operand(ops, 1, src, dst.sizes());
  strided_loop<2>(dst.sizes(), ops, [](std::array<char*, 2> p, std::array<std::int64_t, 2> s, std::int64_t n) {
    if (s[1] == sizeof(float)) return store_chunk(p[0], s[0], reinterpret_cast<const float*>(p[1]), n);
    for (std::int64_t i = 0; i < n; ++i)
      *reinterpret_cast<bfloat16*>(p[0] + i * s[0]) = bfloat16(*reinterpret_cast<const float*>(p[1] + i * s[1]));
  });
}
void widen_strided(const Tensor& dst, const Tensor& src) {
  Operands<2> ops;
  set_operand(ops, 0, dst, dst.sizes());
  set_operand(ops, 1, src, dst.sizes());
  strided_loop<2>(dst.sizes(), ops, [](std::array<char*, 2> p, std::array<std::int64_t, 2> s, std::int64_t n) {
    if (s[0] == sizeof(float)) return load_chunk(reinterpret_cast<float*>(p[0]), p[1], s[1], n);
    for (std::int64_t i = 0; i < n; ++i)
      *reinterpret_cast<float*>(p[0] + i * s[0]) = *reinterpret_cast<const bfloat16*>(p[1] + i * s[1]);
  });
}

// Runs a contiguous float32 kernel over (out, in), or the generic strided map otherwise.
template <typename F>
void map1_f32(const Tensor& out, const Tensor& in, void (*contiguous_kernel)(float*, const float*, std::int64_t),
              F scalar) {
  Operands<2> ops;
  set_operand(ops, 0, out, out.sizes());
  set_operand(ops, 1, in, out.sizes());
  strided_loop<2>(out.sizes(), ops, [&](std::array<char*, 2> p, std::array<std::int64_t, 2> s, std::int64_t n) {
    if (s[0] == sizeof(float) && s[1] == sizeof(float)) {
      contiguous_kernel(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]), n);
    } else {
      for (std::int64_t i = 0; i < n; ++i)
        *reinterpret_cast<float*>(p[0] + i * s[0]) = scalar(*reinterpret_cast<const float*>(p[1] + i * s[1]));
    }
  });
}

// map2 for float32 with a contiguous kernel for the all-contiguous case (and
// map2's loop for a broadcast second operand: a scalar-like row).
template <typename F>
void map2_f32(const Tensor& out, const Tensor& a, const Tensor& b,
              void (*contiguous_kernel)(float*, const float*, const float*, std::int64_t), F scalar) {
  Operands<3> ops;
  set_operand(ops, 0, out, out.sizes());
  set_operand(ops, 1, a, out.sizes());
  set_operand(ops, 2, b, out.sizes());
  strided_loop<3>(out.sizes(), ops, [&](std::array<char*, 3> p, std::array<std::int64_t, 3> s, std::int64_t n) {
    if (s[0] == sizeof(float) && s[1] == sizeof(float) && s[2] == sizeof(float)) {
      contiguous_kernel(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]),
                        reinterpret_cast<const float*>(p[2]), n);
    } else if (s[0] == sizeof(float) && s[1] == sizeof(float) && s[2] == 0) {
      float* y = reinterpret_cast<float*>(p[0]);
      const float* x = reinterpret_cast<const float*>(p[1]);
      const float v = *reinterpret_cast<const float*>(p[2]);
      for (std::int64_t i = 0; i < n; ++i) y[i] = scalar(x[i], v);
    } else {
      for (std::int64_t i = 0; i < n; ++i)
        *reinterpret_cast<float*>(p[0] + i * s[0]) =
            scalar(*reinterpret_cast<const float*>(p[1] + i * s[1]), *reinterpret_cast<const float*>(p[2] + i * s[2]));
    }
  });
}

template <typename T>
void unary_typed(kernels::Unary op, const Tensor& out, const Tensor& x, T s) {
  using U = kernels::Unary;
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case U::exp: return map1_f32(out, x, exp_f32, [](float v) { return exp_fast(v); });
      case U::tanh: return map1_f32(out, x, tanh_f32, [](float v) { return tanh_fast(v); });
      case U::gelu: return map1_f32(out, x, gelu_f32, [](float v) { return gelu(v); });
      case U::gelu_grad: return map1_f32(out, x, gelu_grad_f32, [](float v) { return gelu_grad(v); });
      default: break;
    }
  }
  // The hot ones get their own loop so the op is not switched per element.
  switch (op) {
    case U::add_scalar: return map1<T, T>(out, x, [s](T v) { return v + s; });
    case U::mul_scalar: return map1<T, T>(out, x, [s](T v) { return v * s; });
    case U::neg: return map1<T, T>(out, x, [](T v) { return -v; });
    case U::exp: return map1<T, T>(out, x, [](T v) { return std::exp(v); });
    case U::relu: return map1<T, T>(out, x, [](T v) { return v > T(0) ? v : T(0); });
    case U::gelu: return map1<T, T>(out, x, [](T v) { return gelu(v); });
    case U::gelu_grad: return map1<T, T>(out, x, [](T v) { return gelu_grad(v); });
    default: return map1<T, T>(out, x, [op, s](T v) { return apply_unary(op, v, s); });
  }
}

template <typename T>
void binary_typed(kernels::Binary op, const Tensor& out, const Tensor& a, const Tensor& b) {
  using B = kernels::Binary;
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case B::add: return map2_f32(out, a, b, add_f32, [](float x, float y) { return x + y; });
      case B::sub: return map2_f32(out, a, b, sub_f32, [](float x, float y) { return x - y; });
      case B::mul: return map2_f32(out, a, b, mul_f32, [](float x, float y) { return x * y; });
      case B::div: return map2_f32(out, a, b, div_f32, [](float x, float y) { return x / y; });
      default: break;
    }
  }
  switch (op) {
    case B::add: return map2<T, T, T>(out, a, b, [](T x, T y) { return x + y; });
    case B::sub: return map2<T, T, T>(out, a, b, [](T x, T y) { return x - y; });
    case B::mul: return map2<T, T, T>(out, a, b, [](T x, T y) { return x * y; });
    case B::div: return map2<T, T, T>(out, a, b, [](T x, T y) { return x / y; });
    case B::pow: return map2<T, T, T>(out, a, b, [](T x, T y) { return std::pow(x, y); });
    case B::maximum: return map2<T, T, T>(out, a, b, [](T x, T y) { return x >= y ? x : y; });
    case B::gelu_backward:
      if constexpr (std::is_same_v<T, float>)
        return map2_f32(out, a, b, gelu_backward_f32, [](float dy, float x) { return dy * gelu_grad(x); });
      else
        return map2<T, T, T>(out, a, b, [](T dy, T x) { return dy * gelu_grad(x); });
    case B::gt: return map2<bool, T, T>(out, a, b, [](T x, T y) { return x > y; });
    case B::lt: return map2<bool, T, T>(out, a, b, [](T x, T y) { return x < y; });
    case B::eq: return map2<bool, T, T>(out, a, b, [](T x, T y) { return x == y; });
  }
}

}  // namespace

Tensor unary(kernels::Unary op, const Tensor& x, double s) {
  Tensor out = empty(x.sizes(), x.options());
  if (x.dtype() == DType::bf16) {
    unary_bf16(op, out, x, static_cast<float>(s));
    return out;
  }
  AG_DISPATCH_FLOAT(x.dtype(), kernels::unary_name(op), [&] { unary_typed<scalar_t>(op, out, x, scalar_t(s)); });
  return out;
}

Tensor binary(kernels::Binary op, const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype) {
  Tensor out = empty(out_shape, {out_dtype, a.device()});
  if (a.dtype() == DType::bf16 || b.dtype() == DType::bf16) {
    binary_bf16(op, out, a, b);
    return out;
  }
  AG_DISPATCH_FLOAT(a.dtype(), kernels::binary_name(op), [&] { binary_typed<scalar_t>(op, out, a, b); });
  return out;
}

Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = empty(out_shape, a.options());
  Operands<4> ops;
  set_operand(ops, 0, out, out_shape);
  set_operand(ops, 1, mask, out_shape);
  set_operand(ops, 2, a, out_shape);
  set_operand(ops, 3, b, out_shape);
  visit_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    strided_loop<4>(out_shape, ops, [](std::array<char*, 4> p, std::array<std::int64_t, 4> s, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const bool*>(p[1] + i * s[1])
                                                     ? *reinterpret_cast<const T*>(p[2] + i * s[2])
                                                     : *reinterpret_cast<const T*>(p[3] + i * s[3]);
    });
  });
  return out;
}

void copy_(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.sizes() == src.sizes()) {
    std::memcpy(dst.raw_data(), src.raw_data(), dst.numel() * dtype_size(dst.dtype()));
    return;
  }
  if (dst.dtype() == DType::bf16 && src.dtype() == DType::f32) return round_strided(dst, src);
  if (dst.dtype() == DType::f32 && src.dtype() == DType::bf16) return widen_strided(dst, src);
  visit_dtype(dst.dtype(), [&](auto out_zero) {
    visit_dtype(src.dtype(), [&](auto in_zero) {
      using Out = decltype(out_zero);
      using In = decltype(in_zero);
      map1<Out, In>(dst, src, [](In v) { return static_cast<Out>(v); });
    });
  });
}

void fill_(const Tensor& dst, double value) {
  visit_dtype(dst.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T v = static_cast<T>(value);
    // One operand: a fill never reads what it overwrites. (It did, through map1, and
    // empty() storage holds arbitrary bytes: loading one as a bool is undefined; UBSan.)
    Operands<1> ops;
    set_operand(ops, 0, dst, dst.sizes());
    strided_loop<1>(dst.sizes(), ops, [&](std::array<char*, 1> p, std::array<std::int64_t, 1> s, std::int64_t n) {
      if (s[0] == sizeof(T)) {
        std::fill_n(reinterpret_cast<T*>(p[0]), n, v);
      } else {
        for (std::int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      }
    });
  });
}

void add_(const Tensor& y, const Tensor& x, double alpha) {
  if (y.dtype() == DType::bf16) return binary_bf16(kernels::Binary::add, y, y, x, static_cast<float>(alpha));
  AG_DISPATCH_FLOAT(y.dtype(), "add_", [&] {
    const auto a = static_cast<scalar_t>(alpha);
    map2<scalar_t, scalar_t, scalar_t>(y, y, x, [a](scalar_t u, scalar_t v) { return u + a * v; });
  });
}

}  // namespace attograd::cpu
