// Gradient clipping's two passes over every gradient: the sum of squares in
// float64 over fixed chunks (each chunk's sum in eight interleaved lanes, then
// the chunks in order: the same bits whatever the number of threads, and the
// lanes let the compiler keep eight sums in vector registers), and the scale.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "cpu/parallel.h"
#include "tensor/device_kernels.h"

namespace attograd::cpu {
namespace {

constexpr std::int64_t kChunk = 1 << 16;  // elements a partial sum covers
constexpr int kLanes = 8;

template <typename T>
double chunk_squares(const T* x, std::int64_t n) {
  std::array<double, kLanes> lane{};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  for (int l = 0; i < n; ++i, ++l) lane[l] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  double sum = 0;
  for (double s : lane) sum += s;
  return sum;
}

template <typename T>
double tensor_squares(const Tensor& t) {
  const T* x = t.data<T>();
  const std::int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks));
  parallel_for(0, chunks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c)
      partial[static_cast<std::size_t>(c)] = chunk_squares(x + c * kChunk, std::min(kChunk, n - c * kChunk));
  });
  double sum = 0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace

double sum_of_squares(const std::vector<Tensor>& tensors) {
  double sum = 0;
  for (const Tensor& t : tensors) sum += t.dtype() == DType::f64 ? tensor_squares<double>(t) : tensor_squares<float>(t);
  return sum;
}

void scale_(const std::vector<Tensor>& tensors, double scale) {
  for (const Tensor& t : tensors) {
    const auto scale_values = [&](auto* x, auto s) {
      parallel_for(0, t.numel(), kParallelGrain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) x[i] = x[i] * s;
      });
    };
    if (t.dtype() == DType::f64)
      scale_values(t.data<double>(), scale);
    else
      scale_values(t.data<float>(), static_cast<float>(scale));
  }
}

}  // namespace attograd::cpu
