// The GPU kernels of a build without CUDA: no CUDA tensor can exist here
// (cuda/no_cuda.cpp refuses to allocate one), so none of these is reachable
// through tensor/dispatch.cpp; each still throws a clear error rather than
// pretending. Linked instead of tensor/cuda/*.cpp when ATTOGRAD_CUDA is off.
#include "tensor/cuda/gpu_kernels.h"

namespace attograd::gpu {
namespace {
[[noreturn]] void no_gpu(const char* op) { fail(op, "has no CUDA implementation in this build (ATTOGRAD_CUDA=OFF)"); }
}  // namespace

Tensor unary(kernels::Unary op, const Tensor&, double) { no_gpu(kernels::unary_name(op)); }
Tensor binary(kernels::Binary op, const Tensor&, const Tensor&, const Shape&, DType) { no_gpu(kernels::binary_name(op)); }
Tensor where(const Tensor&, const Tensor&, const Tensor&, const Shape&) { no_gpu("where"); }
void copy_(const Tensor&, const Tensor&) { no_gpu("copy_"); }
void fill_(const Tensor&, double) { no_gpu("fill_"); }
void add_(const Tensor&, const Tensor&, double) { no_gpu("add_"); }
Tensor sum(const Tensor&, const std::vector<int>&, bool) { no_gpu("sum"); }
kernels::MaxResult max(const Tensor&, int, bool) { no_gpu("max"); }
Tensor matmul(const Tensor&, const Tensor&, const Shape&) { no_gpu("matmul"); }
Tensor softmax_forward(const Tensor&) { no_gpu("softmax"); }
Tensor softmax_backward(const Tensor&, const Tensor&) { no_gpu("softmax backward"); }
Tensor log_softmax_forward(const Tensor&) { no_gpu("log_softmax"); }
Tensor log_softmax_backward(const Tensor&, const Tensor&) { no_gpu("log_softmax backward"); }
kernels::LayerNormResult layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, double) { no_gpu("layer_norm"); }
kernels::LayerNormGrads layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_gpu("layer_norm backward");
}
Tensor embedding_forward(const Tensor&, const Tensor&) { no_gpu("embedding"); }
Tensor embedding_backward(const Tensor&, const Tensor&, std::int64_t) { no_gpu("embedding backward"); }
kernels::CrossEntropyResult cross_entropy_forward(const Tensor&, const Tensor&, std::int64_t) {
  no_gpu("cross_entropy");
}
Tensor cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, std::int64_t, std::int64_t, double) {
  no_gpu("cross_entropy backward");
}
Tensor dropout_mask(const Shape&, double, std::uint64_t, std::uint64_t, TensorOptions) { no_gpu("dropout"); }
Tensor cat(const std::vector<Tensor>&, int, const Shape&) { no_gpu("cat"); }
kernels::AttentionForwardResult attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  const kernels::AttentionKernelOptions&) {
  no_gpu("attention");
}
kernels::AttentionGrads attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&, const kernels::AttentionKernelOptions&) {
  no_gpu("attention backward");
}
void adamw_step_(const std::vector<kernels::AdamWParameter>&, const kernels::AdamWStep&) { no_gpu("adamw"); }

}  // namespace attograd::gpu
