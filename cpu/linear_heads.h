#pragma once
// The CPU's linear_heads (tensor/device_kernels.h): a float32 projection stored
// head by head as the float32 kernel writes its blocks of C, in panels of D
// columns (F32Gemm::c_panel_cols), with no copy after it.
#include <cstdint>

namespace attograd::cpu {

// Whether f32_kernel() can write heads of head_dim columns as panels: its
// blocks of columns must not straddle two heads (not openblas). Where it
// cannot, cpu::linear_heads declines and the dispatch composes the op.
bool linear_heads_direct(std::int64_t head_dim);

}  // namespace attograd::cpu
