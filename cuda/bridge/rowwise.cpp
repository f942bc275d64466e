// Row ops on CUDA tensors: softmax, log_softmax and cross-entropy (layer_norm.cpp
// has LayerNorm's). Inputs arrive contiguous (tensor/dispatch_rows.cpp) and are read as (rows, n), as on the CPU.

#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::gpu {
namespace {

template <typename Launch>
Tensor row_op(const char* op, const Tensor& x, Launch launch) {
  Tensor y = empty(x.sizes(), x.options());
  const RowShape shape = row_shape(x);  // not a structured binding: clang 14 cannot capture one in a lambda
  AG_DISPATCH_FLOAT(x.dtype(), op,
                    [&] { launch(y.data<scalar_t>(), x.data<scalar_t>(), shape.rows, shape.n, stream_of(x)); });
  return y;
}

template <typename Launch>
Tensor row_op_backward(const char* op, const Tensor& y, const Tensor& dy, Launch launch) {
  Tensor dx = empty(y.sizes(), y.options());
  const RowShape shape = row_shape(y);
  AG_DISPATCH_FLOAT(y.dtype(), op, [&] {
    launch(dx.data<scalar_t>(), y.data<scalar_t>(), dy.data<scalar_t>(), shape.rows, shape.n, stream_of(y));
  });
  return dx;
}

}  // namespace

// ---- softmax ---------------------------------------------------------------------------

// The launchers take (out, inputs..., rows, n, stream), as row_op and row_op_backward pass them.
Tensor softmax_forward(const Tensor& x) {
  return row_op("softmax", x, [](auto... args) { cuda::softmax_forward(args...); });
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  return row_op_backward("softmax backward", y, dy, [](auto... args) { cuda::softmax_backward(args...); });
}

Tensor log_softmax_forward(const Tensor& x) {
  return row_op("log_softmax", x, [](auto... args) { cuda::log_softmax_forward(args...); });
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  return row_op_backward("log_softmax backward", y, dy, [](auto... args) { cuda::log_softmax_backward(args...); });
}

// ---- cross-entropy -----------------------------------------------------------------------

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

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              std::int64_t ignore_index, std::int64_t count, double dloss) {
  const std::int64_t rows = logits.size(0), n = logits.size(1);
  Tensor dx = empty(logits.sizes(), logits.options());
  const double scale = count > 0 ? dloss / static_cast<double>(count) : 0.0;
  AG_DISPATCH_FLOAT_OR_BF16(logits.dtype(), "cross_entropy backward", [&] {
    using T = compute_t<scalar_t>;
    cuda::cross_entropy_backward(dx.data<scalar_t>(), logits.data<scalar_t>(), targets.data<std::int64_t>(),
                                 lse.data<T>(), rows, n, ignore_index, count, static_cast<T>(scale),
                                 stream_of(logits));
  });
  return dx;
}

}  // namespace attograd::gpu
