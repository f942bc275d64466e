#include "train/distributed/host_floats.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "base/error.h"
#include "tensor/kernels.h"

namespace attograd::train::distributed {

bool host_contiguous(const Tensor& t) { return t.device().is_cpu() && t.is_contiguous() && t.dtype() == DType::f32; }

void read_floats(const Tensor& t, float* dst) {
  if (host_contiguous(t)) {
    std::memcpy(dst, t.data<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
    return;
  }
  const std::vector<float> values = to(to_cpu(t), DType::f32).to_vector<float>();
  std::copy(values.begin(), values.end(), dst);
}

void write_floats(const Tensor& t, const float* src) {
  if (host_contiguous(t)) {
    std::memcpy(t.data<float>(), src, static_cast<std::size_t>(t.numel()) * sizeof(float));
    t.bump_version();
    return;
  }
  kernels::copy_(t, to(from_vector(std::vector<float>(src, src + t.numel()), t.sizes(), t.device()), t.dtype()));
}

void check_float32(const std::vector<nn::NamedParameter>& params, const char* what) {
  for (const auto& p : params)
    AG_CHECK(p.tensor.dtype() == DType::f32, what, "parameter '{}' is {}; data-parallel training is float32", p.name,
             dtype_name(p.tensor.dtype()));
}

}  // namespace attograd::train::distributed
