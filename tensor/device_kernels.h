#pragma once
// The kernels every device implements, listed once. From this one list come
// the declarations of the CPU side (namespace cpu, cpu/), of the CUDA
// side (namespace gpu, the bridges in cuda/bridge/ over cuda/'s launchers) and
// the no-GPU stubs of a build without CUDA (cuda/bridge/no_gpu/gpu_kernels.cpp), so
// the devices cannot drift apart: a kernel has one signature, and a definition
// that does not match it is a compile error (the files that define kernels
// are built with -Werror=missing-declarations, see CMakeLists.txt).
//
// The dispatch (tensor/dispatch*.cpp) is the only caller. It checks every user-facing
// precondition first (dtypes, devices, shapes, options, what a device's
// kernels support), makes the operands the kernels read packed where they
// need it, then calls cpu::name or gpu::name for the device of the op's
// tensors. The kernels assume all that and only compute.
//
// bfloat16: the element-wise kernels (but comparisons), sum, the products,
// cross-entropy's logits and layer_norm's bfloat16 result of a float32 input
// are bfloat16 loops on both devices; every other kernel gets bfloat16
// operands widened to float32 by the dispatch (tensor/dispatch_checks.h). The
// fused attention's policy differs by device: attention_takes_bf16 below.
//
// Adding a kernel: its public entry in tensor/kernels.h and its checks in
// tensor/dispatch*.cpp, one line here, then its CPU definition in
// cpu/<family>.cpp and its CUDA bridge in cuda/bridge/<family>.cpp.
#include <cstdint>
#include <vector>

#include "tensor/attention_call.h"
#include "tensor/kernels.h"

// X(name, result, (parameters)), one line a kernel, grouped by the file of
// cpu/ (and cuda/bridge/) that implements it.
#define AG_DEVICE_KERNELS(X)                                                                                        \
  /* elementwise.cpp: out has out_shape; a comparison's out_dtype is bool */                                      \
  X(unary, Tensor, (kernels::Unary op, const Tensor& x, double s))                                                 \
  X(binary, Tensor, (kernels::Binary op, const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype)) \
  X(where, Tensor, (const Tensor& mask, const Tensor& a, const Tensor& b, const Shape& out_shape))                  \
  X(copy_, void, (const Tensor& dst, const Tensor& src)) /* one device, any dtypes and layouts */                  \
  X(fill_, void, (const Tensor& dst, double value))                                                                \
  X(add_, void, (const Tensor& y, const Tensor& x, double alpha))                                                  \
  /* reduce.cpp: dims in range, sorted, unique */                                                                  \
  X(sum, Tensor, (const Tensor& x, const std::vector<int>& dims, bool keepdim))                                    \
  X(max, kernels::MaxResult, (const Tensor& x, int dim, bool keepdim))                                             \
  /* matmul.cpp: bias undefined or contiguous (N) */                                                               \
  X(matmul, Tensor, (const Tensor& a, const Tensor& b, const Shape& batch_shape, const Tensor& bias))              \
  /* matmul.cpp, the fusions: operands contiguous; a device with no fused kernel for them returns an undefined */ \
  /* result, and the dispatch composes the op from matmul and the element-wise kernels */                         \
  X(linear_heads, Tensor,                                                                                          \
    (const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts, std::int64_t heads))           \
  X(linear_gelu, kernels::LinearGelu, (const Tensor& x, const Tensor& weight, const Tensor& bias))                 \
  X(matmul_gelu_grad, Tensor, (const Tensor& g, const Tensor& weight, const Tensor& pre))                          \
  X(matmul_add_, bool, (const Tensor& c, const Tensor& a, const Tensor& b)) /* c (M, N) contiguous; false: declined */ \
  /* softmax.cpp, layer_norm.cpp, cross_entropy.cpp: every operand contiguous */                                  \
  X(softmax_forward, Tensor, (const Tensor& x))                                                                    \
  X(softmax_backward, Tensor, (const Tensor& y, const Tensor& dy))                                                 \
  X(log_softmax_forward, Tensor, (const Tensor& x))                                                                \
  X(log_softmax_backward, Tensor, (const Tensor& y, const Tensor& dy))                                             \
  /* layer_norm: y_dtype (forward) and dy (backward) x's dtype, or bfloat16 with a float32 x */                  \
  X(layer_norm_forward, kernels::LayerNormResult,                                                                  \
    (const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, DType y_dtype))                        \
  X(layer_norm_backward, kernels::LayerNormGrads,                                                                  \
    (const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd))              \
  X(cross_entropy_forward, kernels::CrossEntropyResult,                                                            \
    (const Tensor& logits, const Tensor& targets, std::int64_t ignore_index))                                      \
  X(cross_entropy_backward, void, /* dx as the logits, or the logits themselves */                               \
    (const Tensor& dx, const Tensor& logits, const Tensor& targets, const Tensor& lse, std::int64_t ignore_index,  \
     std::int64_t count, double dloss))                                                                            \
  /* embedding.cpp: ids in range */                                                                                \
  X(embedding_forward, Tensor, (const Tensor& weight, const Tensor& ids))                                          \
  X(embedding_backward, Tensor, (const Tensor& dy, const Tensor& ids, std::int64_t num_rows))                      \
  /* dropout.cpp */                                                                                                \
  X(dropout_mask, Tensor,                                                                                          \
    (const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, TensorOptions options))               \
  /* attention: fill the outputs dispatch allocated (tensor/attention_call.h). bfloat16 operands as they are */    \
  /* where the device's attention_takes_bf16 (the bfloat16 policy of the one kernel whose policy differs by */   \
  /* device), else widened to float32 by the dispatch */                                                          \
  X(attention_takes_bf16, bool, (bool return_weights))                                                             \
  X(attention_forward, void, (const AttentionCall& call, kernels::AttentionForwardResult& result))                 \
  X(attention_backward, void,                                                                                      \
    (const AttentionCall& call, const AttentionSaved& saved, const kernels::AttentionGrads& grads))                 \
  /* adamw.cpp: param, grad, m, v contiguous, of one dtype and device */                                           \
  X(adamw_step_, void, (const std::vector<kernels::AdamWParameter>& params, const kernels::AdamWStep& step))      \
  /* grad_clip.cpp: contiguous tensors of one floating dtype (float32 on the GPU) and one device */               \
  X(sum_of_squares, double, (const std::vector<Tensor>& tensors))                                                  \
  X(scale_, void, (const std::vector<Tensor>& tensors, double scale))

#define AG_DECLARE_DEVICE_KERNEL(name, result, parameters) result name parameters;

namespace attograd::cpu {
AG_DEVICE_KERNELS(AG_DECLARE_DEVICE_KERNEL)
}  // namespace attograd::cpu

namespace attograd::gpu {
AG_DEVICE_KERNELS(AG_DECLARE_DEVICE_KERNEL)
}  // namespace attograd::gpu

#undef AG_DECLARE_DEVICE_KERNEL
