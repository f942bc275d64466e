#include "train/optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/kernels.h"

namespace attograd::train::optim {

namespace {

// The gradients kernels::sum_of_squares and scale_ take together: float32 or
// float64 on one device (contiguous: any other layout is made so once).
struct GradGroup {
  Device device;
  DType dtype;
  std::vector<Tensor> grads;
};

std::vector<GradGroup> grad_groups(const std::vector<nn::NamedParameter>& params, std::vector<Tensor>& others) {
  std::vector<GradGroup> groups;
  for (const auto& p : params) {
    if (!p.tensor.grad().defined()) continue;
    if (p.tensor.grad().dtype() == DType::bf16) {
      others.push_back(p.tensor.grad());
      continue;
    }
    if (!p.tensor.grad().is_contiguous()) p.tensor.set_grad(kernels::contiguous(p.tensor.grad()));
    const Tensor& g = p.tensor.grad();
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const GradGroup& x) { return x.device == g.device() && x.dtype == g.dtype(); });
    if (group == groups.end()) group = groups.insert(groups.end(), GradGroup{g.device(), g.dtype(), {}});
    group->grads.push_back(g);
  }
  return groups;
}

}  // namespace

double clip_grad_norm(const std::vector<nn::NamedParameter>& params, double max_norm) {
  NoGradGuard no_grad;
  std::vector<Tensor> others;  // bfloat16 gradients, a kernel each
  const std::vector<GradGroup> groups = grad_groups(params, others);
  // One pass over a device's gradients, summed in float64 (on the GPU: one wait, not one a gradient).
  double sum_sq = 0;
  for (const GradGroup& group : groups) sum_sq += kernels::sum_of_squares(group.grads);
  for (const Tensor& g : others) sum_sq += kernels::sum(kernels::binary(kernels::Binary::mul, g, g), {}, false).item();
  const double norm = std::sqrt(sum_sq);
  // torch adds 1e-6 so a zero norm never divides; clipping only ever shrinks.
  const double scale = max_norm / (norm + 1e-6);
  if (max_norm > 0 && scale < 1) {
    for (const GradGroup& group : groups) kernels::scale_(group.grads, scale);
    for (const auto& p : params)
      if (p.tensor.grad().defined() && p.tensor.grad().dtype() == DType::bf16)
        p.tensor.set_grad(kernels::unary(kernels::Unary::mul_scalar, p.tensor.grad(), scale));
  }
  return norm;
}

}  // namespace attograd::train::optim
