#pragma once
// Random tensors drawn from the counter-based Philox stream of base/philox.h:
// a Generator is a seed and a running offset into it, so the same seed gives
// the same tensors on every device.
#include <cstdint>

#include "base/philox.h"
#include "tensor/tensor.h"

namespace attograd {

// A seed plus a running offset; each draw of n numbers advances the offset.
class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0x5eed) : seed_(seed) {}
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }
  void set_state(std::uint64_t seed, std::uint64_t offset) { seed_ = seed, offset_ = offset; }
  // Reserves counters for n numbers and returns the offset to draw them from.
  std::uint64_t reserve(std::uint64_t n) {
    const std::uint64_t start = offset_;
    offset_ += (n + 3) / 4;
    return start;
  }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

// The process-wide generator used when none is passed; manual_seed resets it.
Generator& default_generator();
void manual_seed(std::uint64_t seed);

// Uniform [low, high) and standard normal (Box-Muller on pairs) samples.
Tensor rand(const Shape& sizes, TensorOptions options = {}, Generator& gen = default_generator());
Tensor uniform(const Shape& sizes, double low, double high, TensorOptions options = {},
               Generator& gen = default_generator());
Tensor randn(const Shape& sizes, TensorOptions options = {}, Generator& gen = default_generator());
Tensor normal(const Shape& sizes, double mean, double stddev, TensorOptions options = {},
              Generator& gen = default_generator());

}  // namespace attograd
