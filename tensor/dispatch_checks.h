#pragma once
// What the dispatch files (tensor/dispatch*.cpp) share: the checks every op
// makes, the bfloat16 policy of ops without a bfloat16 loop, and the choice of
// a device kernel. Private to them: users see the checks through their messages.
#include "tensor/kernels.h"
#include "tensor/device_kernels.h"

// The implementation of device kernel `name` (tensor/device_kernels.h) for
// the device of tensor t: gpu::name on a CUDA device, else cpu::name. The
// checks before each call have made sure all the op's tensors share t's device.
#define AG_DEVICE_KERNEL(t, name) ((t).device().is_cuda() ? ::attograd::gpu::name : ::attograd::cpu::name)

namespace attograd::kernels {

// Kernels that read their operands as packed rows (row ops, gathers, a GEMM's
// bias) get them contiguous from here, the same for both devices; an
// undefined optional operand stays undefined.
inline Tensor dense(const Tensor& t) { return t.defined() ? contiguous(t) : t; }

// The attention kernels read (B, H, T, D) rows through strides but need each
// row itself contiguous: a copy only when its last dim is strided.
inline Tensor rows_contiguous(const Tensor& x) { return x.size(-1) <= 1 || x.stride(-1) == 1 ? x : clone(x); }

inline void check_defined(const char* op, const Tensor& t, const char* what) {
  AG_CHECK(t.defined(), op, "{} is an undefined tensor", what);
}

// Tensors of one op must share a device: "[add] tensors on different devices: cpu and cuda:0".
inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  AG_CHECK(a.device() == b.device(), op, "tensors on different devices: {} and {}", a.device().str(),
           b.device().str());
}

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  AG_CHECK(a.dtype() == b.dtype(), op, "dtypes differ: {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
}

inline void check_floating(const char* op, const Tensor& t) {
  AG_CHECK(is_floating(t.dtype()), op, "expected a floating tensor, got {} {}", dtype_name(t.dtype()),
           shape_str(t.sizes()));
}

// bfloat16 through float32: an op whose kernels have no bfloat16 loop widens its
// bfloat16 operands to float32 (exactly), computes there, and rounds its
// floating results once to bfloat16, which is what a bfloat16 loop computing
// in float32 gives too. Ops with a loop of their own skip this: the products,
// the element-wise unary, binary and add_ (a chunk at a time on the CPU, an
// element at a time in float32 on the GPU), float32 with bfloat16 operands
// and sum (widened as read, on both devices).
inline bool is_bf16(const Tensor& t) { return t.defined() && t.dtype() == DType::bf16; }
inline Tensor widen(const Tensor& t) { return is_bf16(t) ? cast(t, DType::f32) : t; }
inline Tensor to_bf16(const Tensor& t) { return t.defined() ? cast(t, DType::bf16) : t; }

// The GPU's kernels take float32 and bfloat16 (a bfloat16 operand of a
// float32-only kernel comes widened); float64, the CPU's reference dtype, is
// refused with a message that says why.
inline void check_not_cuda_float64(const char* op, const Tensor& t) {
  AG_CHECK(!t.device().is_cuda() || t.dtype() != DType::f64, op,
           "float64 is CPU-only (the CUDA kernels are float32 and bfloat16), got {}", t.str());
}

}  // namespace attograd::kernels
