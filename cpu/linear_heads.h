#pragma once
// The CPU's linear_heads (tensor/kernels.h): a float32 projection stored head
// by head as the float32 kernel writes its blocks of C, in panels of D
// columns (F32Gemm::c_panel_cols), with no copy after it.
#include <cstdint>

#include "tensor/tensor.h"

namespace attograd::cpu {

// Whether f32_kernel() can write heads of head_dim columns as panels: its
// blocks of columns must not straddle two heads (not openblas).
bool linear_heads_direct(std::int64_t head_dim);

// y (B, parts, heads, T, D) = x (B, T, in) @ weight^T + bias; x, weight (parts
// * heads * D, in) and bias (or undefined) contiguous float32, in > 0, and
// linear_heads_direct(D).
Tensor linear_heads(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts,
                    std::int64_t heads);

}  // namespace attograd::cpu
