// Gradient clipping's passes over many float32 tensors on the GPU (cuda/grad_clip.cu):
// the sum of squares, read back once, and the scale.
#include <vector>

#include "cuda/bridge/launch.h"
#include "cuda/buffer.h"
#include "cuda/runtime.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {
namespace {
std::vector<cuda::FloatSpan> spans_of(const std::vector<Tensor>& tensors) {
  std::vector<cuda::FloatSpan> spans;
  spans.reserve(tensors.size());
  for (const Tensor& t : tensors) spans.push_back({t.data<float>(), t.numel()});
  return spans;
}
}  // namespace

double sum_of_squares(const std::vector<Tensor>& tensors) {
  const std::vector<cuda::FloatSpan> spans = spans_of(tensors);
  const int count = static_cast<int>(spans.size()), device = tensors.front().device().index;
  cuda::DeviceBuffer scratch(sizeof(double) * static_cast<std::size_t>(cuda::sum_of_squares_blocks(spans.data(), count) + 1));
  double* result = scratch.as<double>();
  cuda::sum_of_squares(spans.data(), count, result + 1, result, stream_of(tensors.front()));
  double sum = 0;
  cuda::copy_device_to_host(&sum, result, sizeof sum, device);
  return sum;
}

void scale_(const std::vector<Tensor>& tensors, double scale) {
  const std::vector<cuda::FloatSpan> spans = spans_of(tensors);
  cuda::scale(spans.data(), static_cast<int>(spans.size()), static_cast<float>(scale), stream_of(tensors.front()));
}

}  // namespace attograd::gpu
