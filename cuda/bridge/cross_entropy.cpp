// Cross-entropy on CUDA tensors: the launchers of cuda/cross_entropy.cu.
// Inputs arrive contiguous (tensor/dispatch_rows.cpp) and are read as (rows,
// n), as on the CPU.
#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::gpu {

// bfloat16 logits: lse and the loss float32, the gradient bfloat16 (the kernels widen and round).
kernels::CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                                  std::int64_t ignore_index) {
  const std::int64_t rows = logits.size(0), n = logits.size(1);
  const TensorOptions stats{compute_dtype(logits.dtype()), logits.device()};
  kernels::CrossEntropyResult out{empty({}, stats), empty({rows}, stats), 0};
  Tensor count = empty({}, {DType::i64, logits.device()});
  AG_DISPATCH_FLOAT_OR_BF16(logits.dtype(), "cross_entropy", [&] {
    using T = compute_t<scalar_t>;
    cuda::cross_entropy_forward(out.loss.data<T>(), out.lse.data<T>(), count.data<std::int64_t>(),
                                logits.data<scalar_t>(), targets.data<std::int64_t>(), rows, n, ignore_index,
                                stream_of(logits));
  });
  // The count is a host integer in the result (backward's scale needs it): one
  // small copy back, which waits for the kernels.
  out.count = static_cast<std::int64_t>(count.item());
  return out;
}

// cuda/cross_entropy.cu's kernel reads each element before it writes it: dx may be the logits.
void cross_entropy_backward(const Tensor& dx, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            std::int64_t ignore_index, std::int64_t count, double dloss) {
  const std::int64_t rows = logits.size(0), n = logits.size(1);
  const double scale = count > 0 ? dloss / static_cast<double>(count) : 0.0;
  AG_DISPATCH_FLOAT_OR_BF16(logits.dtype(), "cross_entropy backward", [&] {
    using T = compute_t<scalar_t>;
    cuda::cross_entropy_backward(dx.data<scalar_t>(), logits.data<scalar_t>(), targets.data<std::int64_t>(),
                                 lse.data<T>(), rows, n, ignore_index, count, static_cast<T>(scale),
                                 stream_of(logits));
  });
}

}  // namespace attograd::gpu
