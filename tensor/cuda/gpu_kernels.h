#pragma once
// CUDA implementations behind tensor/kernels.h, the GPU twin of
// tensor/cpu/cpu_kernels.h. Inputs arrive validated by tensor/dispatch.cpp
// (dtypes agree, shapes fit, every tensor on the same CUDA device); these
// functions turn Tensors into raw pointers, sizes and strides and call the
// launchers of cuda/launchers.h on the device's stream. They return as soon as
// the work is queued. Built from tensor/cuda/*.cpp when CUDA is enabled, and
// from tensor/no_gpu/gpu_kernels.cpp otherwise, where each one throws.
//
// float32 and float64 are supported everywhere except matmul, attention and
// AdamW, which are float32 only ("[matmul] float64 is CPU-only").
#include "tensor/kernels.h"

namespace attograd::gpu {

Tensor unary(kernels::Unary op, const Tensor& x, double s);
Tensor binary(kernels::Binary op, const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype);
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b, const Shape& out_shape);
void copy_(const Tensor& dst, const Tensor& src);  // one CUDA device, any dtypes and layouts
void fill_(const Tensor& dst, double value);
void add_(const Tensor& y, const Tensor& x, double alpha);

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim);
kernels::MaxResult max(const Tensor& x, int dim, bool keepdim);

Tensor matmul(const Tensor& a, const Tensor& b, const Shape& batch_shape);

Tensor softmax_forward(const Tensor& x);
Tensor softmax_backward(const Tensor& y, const Tensor& dy);
Tensor log_softmax_forward(const Tensor& x);
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy);
kernels::LayerNormResult layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
kernels::LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                            const Tensor& mean, const Tensor& rstd);
Tensor embedding_forward(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, std::int64_t num_rows);
kernels::CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                                  std::int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              std::int64_t ignore_index, std::int64_t count, double dloss);
Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, TensorOptions options);
kernels::AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                                  const kernels::AttentionKernelOptions& options);
kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionKernelOptions& options);
// grads contiguous, every tensor on one device.
void adamw_step_(const std::vector<kernels::AdamWParameter>& params, const kernels::AdamWStep& step);

}  // namespace attograd::gpu
