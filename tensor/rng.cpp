#include "tensor/rng.h"

#include <cmath>
#include <vector>

#include "tensor/kernels.h"

namespace attograd {

Generator& default_generator() {
  static Generator gen;
  return gen;
}

void manual_seed(std::uint64_t seed) { default_generator().set_state(seed, 0); }

namespace {
// Samples are drawn on the host in float64 and cast: rand/randn serve
// initialisation, not hot loops.
Tensor host_samples(const Shape& sizes, TensorOptions options, const std::vector<double>& values) {
  Tensor t = from_vector(values, sizes);
  return kernels::to_device(kernels::cast(t, options.dtype), options.device);
}
}  // namespace

Tensor uniform(const Shape& sizes, double low, double high, TensorOptions options, Generator& gen) {
  AG_CHECK(is_floating(options.dtype), "rand", "dtype must be floating, got {}", dtype_name(options.dtype));
  const std::int64_t n = numel_of(sizes);
  const std::uint64_t offset = gen.reserve(n);
  std::vector<double> values(n);
  for (std::int64_t i = 0; i < n; ++i) values[i] = low + (high - low) * philox_uniform(gen.seed(), offset, i);
  return host_samples(sizes, options, values);
}

Tensor rand(const Shape& sizes, TensorOptions options, Generator& gen) { return uniform(sizes, 0, 1, options, gen); }

Tensor normal(const Shape& sizes, double mean, double stddev, TensorOptions options, Generator& gen) {
  AG_CHECK(is_floating(options.dtype), "randn", "dtype must be floating, got {}", dtype_name(options.dtype));
  const std::int64_t n = numel_of(sizes);
  const std::uint64_t offset = gen.reserve(2 * ((n + 1) / 2));
  std::vector<double> values(n);
  for (std::int64_t i = 0; i < n; i += 2) {
    // Box-Muller: u1 in (0, 1] so the log is finite.
    const double u1 = 1.0 - philox_uniform(gen.seed(), offset, i);
    const double u2 = philox_uniform(gen.seed(), offset, i + 1);
    const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
    values[i] = mean + stddev * r * std::cos(theta);
    if (i + 1 < n) values[i + 1] = mean + stddev * r * std::sin(theta);
  }
  return host_samples(sizes, options, values);
}

Tensor randn(const Shape& sizes, TensorOptions options, Generator& gen) { return normal(sizes, 0, 1, options, gen); }

}  // namespace attograd
