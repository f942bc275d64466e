#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"

namespace attograd {
namespace {

// Pointer to logical element `flat` (row-major order over sizes) of a view.
double* element(const Tensor& t, std::int64_t flat) {
  std::int64_t offset = 0;
  for (std::int64_t d = t.dim() - 1; d >= 0; --d) {
    const std::int64_t size = t.sizes()[d];
    offset += (flat % size) * t.strides()[d];
    flat /= size;
  }
  return t.data<double>() + offset;
}

double projected(const Tensor& out, const Tensor& r) {
  return kernels::sum(kernels::binary(kernels::Binary::mul, out, r), {}, false).item();
}

}  // namespace

GradcheckResult gradcheck(const std::string& name, const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options) {
  GradcheckResult result;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    AG_CHECK(x.dtype() == DType::f64 && x.device().is_cpu() && x.is_leaf(), "gradcheck",
             "{}: input #{} must be a float64 CPU leaf, got {}", name, i, x.str());
    for (std::int64_t d = 0; d < x.dim(); ++d)
      AG_CHECK(x.strides()[d] != 0 || x.sizes()[d] <= 1, "gradcheck",
               "{}: input #{} {} has overlapping elements (stride 0); pass the unexpanded tensor", name, i,
               x.str());
    x.set_grad({});
  }

  Tensor out = fn(inputs);
  AG_CHECK(out.dtype() == DType::f64, "gradcheck", "{}: output must be float64, got {}", name, out.str());
  Generator gen(options.seed);
  const Tensor r = randn(out.sizes(), {DType::f64}, gen);
  backward(out, r);

  NoGradGuard no_grad;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    const Tensor analytic = x.grad().defined() ? kernels::contiguous(x.grad()) : zeros(x.sizes(), x.options());
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      double* p = element(x, j);
      const double original = *p;
      *p = original + options.eps;
      const double plus = projected(fn(inputs), r);
      *p = original - options.eps;
      const double minus = projected(fn(inputs), r);
      *p = original;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double a = analytic.data<double>()[j];
      ++result.checked;
      if (!(std::abs(a - numeric) <= options.atol + options.rtol * std::abs(numeric))) {
        result.ok = false;
        result.message = fmt::format(
            "[{}] gradcheck failed: input #{} {} element {}: analytic {:.10g} vs numeric {:.10g} (|diff| {:.3g})", name,
            i, shape_str(x.sizes()), j, a, numeric, std::abs(a - numeric));
        return result;
      }
    }
  }
  return result;
}

}  // namespace attograd
