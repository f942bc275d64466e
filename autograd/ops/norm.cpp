// layer_norm over the last dim, with its backward.
#include <optional>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {

Tensor layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps,
                  std::optional<DType> result, bool remade) {
  // In float32 under autocast.
  const Tensor x = autocast_float32(x_in), weight = autocast_float32(weight_in), bias = autocast_float32(bias_in);
  kernels::LayerNormResult r = kernels::layer_norm_forward(x, weight, bias, eps, result);
  if (remade && any_requires_grad({x, weight, bias}))
    remade_from(r.y, "layer_norm", {x, weight, bias}, [eps, result](const std::vector<Tensor>& f) {
      return kernels::layer_norm_forward(f[0], f[1], f[2], eps, result).y;
    });
  return record("layer_norm", r.y, {x, weight, bias}, {x, weight, r.mean, r.rstd},
                [has_weight = weight.defined(), has_bias = bias.defined()](
                    const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
                  // (dx, dweight, dbias derived in cpu/layer_norm.cpp)
                  kernels::LayerNormGrads d = kernels::layer_norm_backward(g, s[0], s[1], s[2], s[3]);
                  return {d.dx, has_weight ? d.dweight : Tensor(), has_bias ? d.dbias : Tensor()};
                });
}

}  // namespace attograd
