// The fused AdamW update on CUDA (float32). The step's scalars are folded here
// in float64 exactly as cpu/adamw.cpp folds them, then one kernel
// updates param, m and v in a single pass, for up to 32 parameters a launch (cuda/adamw.cu).
#include <cmath>
#include <vector>

#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {

void adamw_step_(const std::vector<kernels::AdamWParameter>& params, const kernels::AdamWStep& s) {
  if (params.empty()) return;
  const double bias_correction1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bias_correction2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const cuda::AdamWScalars scalars{
      static_cast<float>(s.beta1),
      static_cast<float>(s.beta2),
      static_cast<float>(1.0 - s.beta1),
      static_cast<float>(1.0 - s.beta2),
      static_cast<float>(s.lr / bias_correction1),
      static_cast<float>(1.0 / std::sqrt(bias_correction2)),
      static_cast<float>(s.eps),
  };
  std::vector<cuda::AdamWTensor> tensors;
  tensors.reserve(params.size());
  for (const kernels::AdamWParameter& p : params) {
    const double weight_decay = p.decay ? s.weight_decay : 0.0;
    tensors.push_back({p.param.data<float>(), p.grad.data<float>(), p.m.data<float>(), p.v.data<float>(),
                       p.param.numel(), static_cast<float>(1.0 - s.lr * weight_decay)});
  }
  cuda::adamw_step(tensors.data(), static_cast<int>(tensors.size()), scalars, stream_of(params.front().param));
}

}  // namespace attograd::gpu
