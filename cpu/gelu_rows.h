#pragma once
// GELU (tanh form, as GPT-2) over contiguous float32 values: the element-wise
// kernels' own loops (cpu/elementwise.cpp), which the float32 products
// also run on the rows of C they have just stored (F32Gemm::Epilogue), so the
// MLP's fused products and the composed ops agree to the bit.
#include <cstdint>

namespace attograd::cpu {

// y = gelu(x).
void gelu_f32(float* y, const float* x, std::int64_t n);
// y = dy * gelu'(x).
void gelu_backward_f32(float* y, const float* dy, const float* x, std::int64_t n);
// y *= gelu'(x), the same values as gelu_backward_f32(y, y, x, n); y and x must not overlap.
void scale_by_gelu_grad_f32(float* __restrict y, const float* __restrict x, std::int64_t n);

}  // namespace attograd::cpu
