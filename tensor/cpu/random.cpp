// Random masks on the CPU, drawn from the counter-based Philox stream of
// tensor/rng.h so that any device reproduces them from (seed, offset).
#include "tensor/cpu/cpu_kernels.h"
#include "tensor/parallel.h"
#include "tensor/rng.h"

namespace attograd::cpu {

Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, DType dtype) {
  // Element i is dropped when philox_uniform(seed, offset, i) < float(p): the
  // comparison is made in float32, as the fused attention (tensor/cpu/attention.cpp)
  // and a CUDA kernel taking p as a float make it; comparing with the float64 p
  // would flip the rare draw equal to float(p) when p rounds down. Kept
  // elements hold 1 / (1 - p), computed in float64 and rounded once.
  Tensor mask = empty(sizes, {dtype, Device::cpu()});
  const std::int64_t n = mask.numel();
  const float threshold = static_cast<float>(p);
  AG_DISPATCH_FLOAT(dtype, "dropout", [&] {
    scalar_t* m = mask.data<scalar_t>();
    const auto keep = static_cast<scalar_t>(1.0 / (1.0 - p));
    // One Philox call yields the 4 lanes of elements 4k .. 4k+3 (see philox_uniform).
    // Whole groups run in a branch-free loop the compiler can vectorise; the
    // last, partial group is done on its own.
    const std::int64_t full_groups = n / 4;
    parallel_for(0, full_groups, kParallelGrain / 4, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k) {
        const Philox4 bits = philox4x32(offset + static_cast<std::uint64_t>(k), seed);
        for (int lane = 0; lane < 4; ++lane)
          m[4 * k + lane] = uniform_from_bits(bits.v[lane]) < threshold ? scalar_t(0) : keep;
      }
    });
    for (std::int64_t i = 4 * full_groups; i < n; ++i)
      m[i] = philox_uniform(seed, offset, static_cast<std::uint64_t>(i)) < threshold ? scalar_t(0) : keep;
  });
  return mask;
}

}  // namespace attograd::cpu
