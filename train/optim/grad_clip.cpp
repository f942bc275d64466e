#include "train/optim/grad_clip.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/kernels.h"

namespace attograd::train::optim {

double clip_grad_norm(const std::vector<nn::NamedParameter>& params, double max_norm) {
  NoGradGuard no_grad;
  double sum_sq = 0;  // accumulated in double across parameters
  for (const auto& p : params) {
    const Tensor& g = p.tensor.grad();
    if (!g.defined()) continue;
    sum_sq += kernels::sum(kernels::binary(kernels::Binary::mul, g, g), {}, false).item();
  }
  const double norm = std::sqrt(sum_sq);
  // torch adds 1e-6 so a zero norm never divides; clipping only ever shrinks.
  const double scale = max_norm / (norm + 1e-6);
  if (max_norm > 0 && scale < 1)
    for (const auto& p : params)
      if (p.tensor.grad().defined()) p.tensor.set_grad(kernels::unary(kernels::Unary::mul_scalar, p.tensor.grad(), scale));
  return norm;
}

}  // namespace attograd::train::optim
