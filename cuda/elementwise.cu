// Elementwise kernels: unary, binary, comparisons, where, copy/cast, fill and
// axpy. One grid-stride kernel walks any StridedLayout (cuda/strided.h) and
// hands each element's operand offsets to a small "body" that does the op;
// each op is its own instantiation, so no kernel switches per element.
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/gelu.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

template <int N, typename Body>
__global__ void for_each_kernel(StridedLayout<N> layout, Body body) {
  for (std::int64_t i = global_thread(); i < layout.numel; i += grid_threads()) {
    std::int64_t offset[N];
    offsets_at(layout, i, offset);
    body(offset);
  }
}

template <int N, typename Body>
void for_each(const StridedLayout<N>& layout, const Body& body, cudaStream_t stream) {
  if (layout.numel == 0) return;
  launch(for_each_kernel<N, Body>, grid_for(layout.numel), kThreads, 0, stream, layout, body);
  CUDA_CHECK_LAUNCH();
}

// ---- the ops --------------------------------------------------------------------------

template <UnaryOp op, typename T>
__device__ __forceinline__ T apply_unary(T x, T s) {
  if constexpr (op == UnaryOp::neg) return -x;
  else if constexpr (op == UnaryOp::exp) return dmath::exp(x);
  else if constexpr (op == UnaryOp::log) return dmath::log(x);
  else if constexpr (op == UnaryOp::sqrt) return dmath::sqrt(x);
  else if constexpr (op == UnaryOp::tanh) return dmath::tanh(x);
  else if constexpr (op == UnaryOp::abs) return dmath::abs(x);
  else if constexpr (op == UnaryOp::relu) return x > T(0) ? x : T(0);
  else if constexpr (op == UnaryOp::step) return x > T(0) ? T(1) : T(0);
  else if constexpr (op == UnaryOp::gelu) return gelu(x);
  else if constexpr (op == UnaryOp::gelu_grad) return gelu_grad(x);
  else if constexpr (op == UnaryOp::add_scalar) return x + s;
  else if constexpr (op == UnaryOp::mul_scalar) return x * s;
  else if constexpr (op == UnaryOp::rsub_scalar) return s - x;
  else if constexpr (op == UnaryOp::rdiv_scalar) return s / x;
  else return dmath::pow(x, s);  // pow_scalar
}

template <BinaryOp op, typename T>
__device__ __forceinline__ T apply_binary(T x, T y) {
  if constexpr (op == BinaryOp::add) return x + y;
  else if constexpr (op == BinaryOp::sub) return x - y;
  else if constexpr (op == BinaryOp::mul) return x * y;
  else if constexpr (op == BinaryOp::div) return x / y;
  else if constexpr (op == BinaryOp::pow) return dmath::pow(x, y);
  else if constexpr (op == BinaryOp::gelu_backward) return x * gelu_grad(y);
  else return x >= y ? x : y;  // maximum
}

template <BinaryOp op, typename T>
__device__ __forceinline__ bool apply_compare(T x, T y) {
  if constexpr (op == BinaryOp::gt) return x > y;
  else if constexpr (op == BinaryOp::lt) return x < y;
  else return x == y;  // eq
}

// ---- bodies: one element, given its operand offsets -------------------------------------

// Each reads its operands as compute_t<T> (bfloat16 widened to float32) and
// converts its result back to T (bfloat16: one rounding).
template <UnaryOp op, typename T>
struct UnaryBody {
  T* out;
  const T* x;
  compute_t<T> s;
  __device__ void operator()(const std::int64_t (&o)[2]) const {
    out[o[0]] = T(apply_unary<op>(compute_t<T>(x[o[1]]), s));
  }
};

// A and B are T, or (widening) one of them bfloat16 with a float32 T: read
// as float32, as T's other operand is.
template <BinaryOp op, typename T, typename A = T, typename B = T>
struct BinaryBody {
  T* out;
  const A* a;
  const B* b;
  __device__ void operator()(const std::int64_t (&o)[3]) const {
    out[o[0]] = T(apply_binary<op>(compute_t<T>(a[o[1]]), compute_t<T>(b[o[2]])));
  }
};

template <BinaryOp op, typename T>
struct CompareBody {
  bool* out;
  const T *a, *b;
  __device__ void operator()(const std::int64_t (&o)[3]) const {
    out[o[0]] = apply_compare<op>(compute_t<T>(a[o[1]]), compute_t<T>(b[o[2]]));
  }
};

template <typename T>
struct WhereBody {
  T* out;
  const bool* mask;
  const T *a, *b;
  __device__ void operator()(const std::int64_t (&o)[4]) const { out[o[0]] = mask[o[1]] ? a[o[2]] : b[o[3]]; }
};

template <typename Out, typename In>
struct CopyBody {
  Out* dst;
  const In* src;
  __device__ void operator()(const std::int64_t (&o)[2]) const { dst[o[0]] = static_cast<Out>(src[o[1]]); }
};

template <typename T>
struct FillBody {
  T* dst;
  T value;
  __device__ void operator()(const std::int64_t (&o)[1]) const { dst[o[0]] = value; }
};

template <typename T>
struct AxpyBody {
  T* y;
  const T* x;
  compute_t<T> alpha;
  __device__ void operator()(const std::int64_t (&o)[2]) const {
    y[o[0]] = T(compute_t<T>(y[o[0]]) + alpha * compute_t<T>(x[o[1]]));
  }
};

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

template <typename T>
void unary(UnaryOp op, T* out, const T* x, compute_t<T> s, const StridedLayout<2>& layout, cudaStream_t stream) {
  switch (op) {
#define AG_CASE(name) \
  case UnaryOp::name: return for_each(layout, UnaryBody<UnaryOp::name, T>{out, x, s}, stream);
    AG_UNARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

namespace {

template <typename T, typename A, typename B>
void binary_of(BinaryOp op, T* out, const A* a, const B* b, const StridedLayout<3>& layout, cudaStream_t stream) {
  switch (op) {
#define AG_CASE(name) \
  case BinaryOp::name: return for_each(layout, BinaryBody<BinaryOp::name, T, A, B>{out, a, b}, stream);
    AG_CASE(add)
    AG_CASE(sub)
    AG_CASE(mul)
    AG_CASE(div)
    AG_CASE(pow)
    AG_CASE(maximum)
    AG_CASE(gelu_backward)
#undef AG_CASE
    case BinaryOp::gt:
    case BinaryOp::lt:
    case BinaryOp::eq: break;
  }
  fail("cuda binary", "comparison op {} writes bool: use compare", static_cast<int>(op));
}

}  // namespace

template <typename T>
void binary(BinaryOp op, T* out, const T* a, const T* b, const StridedLayout<3>& layout, cudaStream_t stream) {
  binary_of(op, out, a, b, layout, stream);
}

template <typename A, typename B>
void binary_widening(BinaryOp op, float* out, const A* a, const B* b, const StridedLayout<3>& layout,
                     cudaStream_t stream) {
  binary_of(op, out, a, b, layout, stream);
}
template void binary_widening<float, bfloat16>(BinaryOp, float*, const float*, const bfloat16*,
                                               const StridedLayout<3>&, cudaStream_t);
template void binary_widening<bfloat16, float>(BinaryOp, float*, const bfloat16*, const float*,
                                               const StridedLayout<3>&, cudaStream_t);

template <typename T>
void compare(BinaryOp op, bool* out, const T* a, const T* b, const StridedLayout<3>& layout, cudaStream_t stream) {
  switch (op) {
    case BinaryOp::gt: return for_each(layout, CompareBody<BinaryOp::gt, T>{out, a, b}, stream);
    case BinaryOp::lt: return for_each(layout, CompareBody<BinaryOp::lt, T>{out, a, b}, stream);
    case BinaryOp::eq: return for_each(layout, CompareBody<BinaryOp::eq, T>{out, a, b}, stream);
    default: break;
  }
  fail("cuda compare", "op {} is not a comparison", static_cast<int>(op));
}

template <typename T>
void where(T* out, const bool* mask, const T* a, const T* b, const StridedLayout<4>& layout, cudaStream_t stream) {
  for_each(layout, WhereBody<T>{out, mask, a, b}, stream);
}

template <typename Out, typename In>
void copy(Out* dst, const In* src, const StridedLayout<2>& layout, cudaStream_t stream) {
  for_each(layout, CopyBody<Out, In>{dst, src}, stream);
}

template <typename T>
void fill(T* dst, T value, const StridedLayout<1>& layout, cudaStream_t stream) {
  for_each(layout, FillBody<T>{dst, value}, stream);
}

template <typename T>
void add_scaled(T* y, const T* x, compute_t<T> alpha, const StridedLayout<2>& layout, cudaStream_t stream) {
  for_each(layout, AxpyBody<T>{y, x, alpha}, stream);
}

// ---- instantiations ---------------------------------------------------------------------------

#define AG_FLOATING(T)                                                                                  \
  template void unary<T>(UnaryOp, T*, const T*, compute_t<T>, const StridedLayout<2>&, cudaStream_t);  \
  template void binary<T>(BinaryOp, T*, const T*, const T*, const StridedLayout<3>&, cudaStream_t);    \
  template void compare<T>(BinaryOp, bool*, const T*, const T*, const StridedLayout<3>&, cudaStream_t); \
  template void add_scaled<T>(T*, const T*, compute_t<T>, const StridedLayout<2>&, cudaStream_t);
AG_FLOATING(float)
AG_FLOATING(double)
AG_FLOATING(bfloat16)
#undef AG_FLOATING

#define AG_ANY(T)                                                                                           \
  template void where<T>(T*, const bool*, const T*, const T*, const StridedLayout<4>&, cudaStream_t);      \
  template void fill<T>(T*, T, const StridedLayout<1>&, cudaStream_t);                                     \
  template void copy<T, float>(T*, const float*, const StridedLayout<2>&, cudaStream_t);                   \
  template void copy<T, double>(T*, const double*, const StridedLayout<2>&, cudaStream_t);                 \
  template void copy<T, std::int64_t>(T*, const std::int64_t*, const StridedLayout<2>&, cudaStream_t);    \
  template void copy<T, bool>(T*, const bool*, const StridedLayout<2>&, cudaStream_t);                   \
  template void copy<T, bfloat16>(T*, const bfloat16*, const StridedLayout<2>&, cudaStream_t);
AG_ANY(float)
AG_ANY(double)
AG_ANY(std::int64_t)
AG_ANY(bool)
AG_ANY(bfloat16)
#undef AG_ANY

}  // namespace attograd::cuda
