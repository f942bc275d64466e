// Dropout masks on CUDA, drawn from the same Philox stream as the CPU's
// (cpu/dropout.cpp): same seed and offset, same mask.
#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {

Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, TensorOptions options) {
  Tensor mask = empty(sizes, options);
  // Dropped when u < float(p), kept elements hold 1 / (1 - p) computed in float64 and rounded once, as on the CPU.
  const float threshold = static_cast<float>(p);
  AG_DISPATCH_FLOAT_OR_BF16(options.dtype, "dropout", [&] {
    cuda::dropout_mask(mask.data<scalar_t>(), mask.numel(), threshold, static_cast<scalar_t>(1.0 / (1.0 - p)), seed,
                       offset, stream_of(mask));
  });
  return mask;
}

}  // namespace attograd::gpu
