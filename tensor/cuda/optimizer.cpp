// The fused AdamW update on CUDA (float32). The step's scalars are folded here
// in float64 exactly as tensor/cpu/optimizer.cpp folds them, then one kernel
// updates param, m and v in a single pass (cuda/adamw.cu).
#include <cmath>

#include "tensor/cuda/gpu_kernels.h"
#include "tensor/cuda/launch.h"

namespace attograd::gpu {

void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const kernels::AdamWStep& s) {
  require_float32("adamw", param);
  const double bias_correction1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bias_correction2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const cuda::AdamWScalars scalars{
      static_cast<float>(1.0 - s.lr * s.weight_decay),
      static_cast<float>(s.beta1),
      static_cast<float>(s.beta2),
      static_cast<float>(1.0 - s.beta1),
      static_cast<float>(1.0 - s.beta2),
      static_cast<float>(s.lr / bias_correction1),
      static_cast<float>(1.0 / std::sqrt(bias_correction2)),
      static_cast<float>(s.eps),
  };
  cuda::adamw_step(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(), scalars,
                   stream_of(param));
}

}  // namespace attograd::gpu
