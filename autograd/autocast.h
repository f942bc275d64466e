#pragma once
// Mixed precision as PyTorch's autocast: while an AutocastGuard lives (in this
// thread), ops choose their own precision, whatever their inputs':
//   in bfloat16, accumulating in float32:  matmul, linear, linear_heads, attention
//     (their floating operands cast to bfloat16; results bfloat16)
//   in float32:  softmax, log_softmax, layer_norm, cross_entropy, sum, mean
//     (bfloat16 operands widened, statistics and results float32; a LayerNorm
//     that only feeds products may round its result for them in the same pass:
//     nn::LayerNorm::feeding_products)
//   as their inputs:  every other op; element-wise ops on bfloat16 stay bfloat16
//     (float32 arithmetic, rounded once), and an op mixing bfloat16 with float32
//     promotes to float32, as always (autograd/ops.h)
// A parameter (a leaf that requires grad) is cast once per guard, however many
// ops use it, and its gradient arrives float32: weights stay float32 master
// copies, and the optimizer never sees bfloat16. Casts are differentiable, so
// `nn` modules run under the guard unchanged.
#include "tensor/tensor.h"

namespace attograd {

class AutocastGuard {
 public:
  // dtype: the low precision of products and attention (bfloat16; float32 turns autocast off).
  explicit AutocastGuard(DType dtype = DType::bf16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  struct State;  // the guard's dtype and the parameters it has cast (autocast.cpp)

 private:
  State* previous_;
};

// Whether an AutocastGuard is active in this thread (with a low precision).
bool autocast_enabled();

// What the ops of autograd/ops/ apply to their floating operands under autocast
// (each returns x itself when autocast is off, x is not floating or already right):
Tensor autocast_low(const Tensor& x);      // to bfloat16, a parameter's cast kept for the guard's life
Tensor autocast_float32(const Tensor& x);  // bfloat16 to float32

}  // namespace attograd
