#pragma once
// CPU implementations behind tensor/kernels.h. Inputs arrive validated by
// tensor/dispatch.cpp (dtypes agree, shapes fit, device is the CPU); these
// functions assume that and only compute.
#include "tensor/kernels.h"

namespace attograd::cpu {

Tensor unary(kernels::Unary op, const Tensor& x, double s);
Tensor binary(kernels::Binary op, const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype);
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b, const Shape& out_shape);
void copy_(const Tensor& dst, const Tensor& src);  // same device (CPU), any dtypes
void fill_(const Tensor& dst, double value);
void add_(const Tensor& y, const Tensor& x, double alpha);

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim);
kernels::MaxResult max(const Tensor& x, int dim, bool keepdim);

Tensor matmul(const Tensor& a, const Tensor& b, const Shape& batch_shape, const Tensor& bias);  // bias: undefined or contiguous

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
Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, DType dtype);
// The instruction set the fused attention kernels run on: "avx512", "avx2" or
// "baseline" (SSE2, or any CPU without the x86 dispatch); see attention.cpp.
const char* attention_isa();
std::int64_t attention_probs_bytes(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal,
                                   std::int64_t element_bytes, std::int64_t budget);
kernels::AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                                  const kernels::AttentionKernelOptions& options);
kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask, const Tensor& out, const Tensor& lse,
                                           const Tensor& probs, const kernels::AttentionKernelOptions& options,
                                           const kernels::AttentionGrads& into);
void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const kernels::AdamWStep& step);

}  // namespace attograd::cpu
