// softmax and log_softmax over any dim, with their backward. The kernels work
// on the last dim; another dim is moved last by a transpose (the kernel makes
// it contiguous) and the result moved back.
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {
namespace {

// Applies a last-dim op `last` along `dim` of x; the result is contiguous like x's shape.
template <typename LastDimOp>
Tensor along_dim(const char* op, const Tensor& x, std::int64_t dim, LastDimOp last) {
  AG_CHECK(x.defined(), op, "input is an undefined tensor");
  AG_CHECK(x.dim() >= 1, op, "input must have at least one dim, got a scalar");
  const int d = normalize_dim(op, dim, x.dim());
  const int end = static_cast<int>(x.dim()) - 1;
  if (d == end) return last(x);
  return contiguous(transpose(last(transpose(x, d, end)), d, end));
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) {
  return along_dim("softmax", autocast_float32(x), dim, [](const Tensor& rows) {
    Tensor y = kernels::softmax_forward(rows);
    return record("softmax", y, {rows}, {y}, [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
      // forward: y = softmax(x); so dx = y * (g - sum(g * y))
      return {kernels::softmax_backward(s[0], g)};
    });
  });
}

Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  return along_dim("log_softmax", autocast_float32(x), dim, [](const Tensor& rows) {
    Tensor y = kernels::log_softmax_forward(rows);
    return record("log_softmax", y, {rows}, {y},
                  [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                    // forward: y = x - log(sum(exp(x))); so dx = g - exp(y) * sum(g)
                    return {kernels::log_softmax_backward(s[0], g)};
                  });
  });
}

}  // namespace attograd
