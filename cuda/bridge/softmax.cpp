// Softmax and log_softmax on CUDA tensors: the launchers of cuda/softmax.cu.
// Inputs arrive contiguous (tensor/dispatch_rows.cpp) and are read as (rows,
// n), as on the CPU.
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

}  // namespace attograd::gpu
