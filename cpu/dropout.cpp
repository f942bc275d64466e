// Random masks on the CPU, drawn from the counter-based Philox stream of
// base/philox.h so that any device reproduces them from (seed, offset).
#include "cpu/philox_block.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "cpu/parallel.h"
#include "tensor/rng.h"

namespace attograd::cpu {

namespace {

// Mask elements [begin, end), through the block Philox of philox_block.h,
// compiled per instruction set.
template <typename T>
AG_SIMD_CLONES void dropout_range(std::uint64_t seed, std::uint64_t offset, std::int64_t begin, std::int64_t end,
                                  float threshold, T keep, T* mask) {
  philox_dropout_factors(seed, offset, static_cast<std::uint64_t>(begin), end - begin, threshold, keep, mask + begin);
}

}  // namespace

Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, TensorOptions options) {
  // Element i is dropped when philox_uniform(seed, offset, i) < float(p): the
  // comparison is made in float32, as the fused attention (cpu/attention/)
  // and a CUDA kernel taking p as a float make it; comparing with the float64 p
  // would flip the rare draw equal to float(p) when p rounds down. Kept
  // elements hold 1 / (1 - p), computed in float64 and rounded once (a
  // bfloat16 one through float32, as every cast from float64 to bfloat16).
  Tensor mask = empty(sizes, options);
  const float threshold = static_cast<float>(p);
  AG_DISPATCH_FLOAT_OR_BF16(options.dtype, "dropout", [&] {
    scalar_t* m = mask.data<scalar_t>();
    const auto keep = static_cast<scalar_t>(1.0 / (1.0 - p));
    parallel_for(0, mask.numel(), kParallelGrain, [&](std::int64_t begin, std::int64_t end) {
      dropout_range(seed, offset, begin, end, threshold, keep, m);
    });
  });
  return mask;
}

}  // namespace attograd::cpu
