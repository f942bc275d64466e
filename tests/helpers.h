#pragma once
// Shared test helpers: float64 inputs on odd shapes, gradcheck assertions,
// and closeness checks with tolerances written once per dtype.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"

namespace attograd::test {

// Whether no CUDA device is at hand (a build without CUDA, or none found),
// said as a skip in the runtime's words. SKIP_WITHOUT_CUDA() then returns from
// the test case, which passes and is named skipped in the output.
inline bool cuda_missing() {
  if (cuda::device_count() > 0) return false;
  WARN("skipped: no CUDA device (" << cuda::no_device_reason() << ")");
  return true;
}
#define SKIP_WITHOUT_CUDA()                       \
  do {                                            \
    if (::attograd::test::cuda_missing()) return; \
  } while (0)

// Tolerances per dtype, written once: float32 results are compared at these,
// float64 references tighter. bfloat16 keeps 8 significant bits, so rounding
// to nearest moves a value by at most 2^-8 of itself (half the 2^-7 relative
// spacing): a bfloat16 result computed in float32 and rounded once is within
// that of the exact value, plus float32's own error.
inline constexpr double kBf16UnitRoundoff = 1.0 / 256;
inline double atol_for(DType t) { return t == DType::f64 ? 1e-10 : 1e-5; }
inline double rtol_for(DType t) {
  return t == DType::f64 ? 1e-9 : t == DType::bf16 ? kBf16UnitRoundoff + 1e-4 : 1e-4;
}

// A float64 leaf with values drawn from N(0, 1) by a fixed seed, requiring grad.
inline Tensor leaf(const Shape& sizes, std::uint64_t seed = 1) {
  Generator gen(seed);
  Tensor t = randn(sizes, {DType::f64}, gen);
  t.set_requires_grad(true);
  return t;
}

// An int64 tensor of ids (or targets) from a braced list.
inline Tensor ids_tensor(const std::vector<std::int64_t>& values, const Shape& sizes) {
  return from_vector(values, sizes);
}

// A leaf with positive values in [0.5, 2), for log / sqrt / div / pow.
inline Tensor positive_leaf(const Shape& sizes, std::uint64_t seed = 1) {
  Generator gen(seed);
  Tensor t = uniform(sizes, 0.5, 2.0, {DType::f64}, gen);
  t.set_requires_grad(true);
  return t;
}

// A non-contiguous leaf of shape `sizes`: a view with its last two dims
// transposed, normal values (or in [0.5, 2) when `positive`).
inline Tensor transposed_leaf(const Shape& sizes, std::uint64_t seed = 1, bool positive = false) {
  Generator gen(seed);
  Shape swapped = sizes;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  Tensor base = positive ? uniform(swapped, 0.5, 2.0, {DType::f64}, gen) : randn(swapped, {DType::f64}, gen);
  Tensor t = make_view(base, sizes, [&] {
    Shape s = base.strides();
    std::swap(s[s.size() - 1], s[s.size() - 2]);
    return s;
  }(), 0);
  REQUIRE_FALSE(t.is_contiguous());
  t.set_requires_grad(true);
  return t;
}

// Largest |a - b| over all elements (shapes must match).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i])) return INFINITY;
    if (!std::isnan(va[i])) m = std::max(m, std::abs(va[i] - vb[i]));
  }
  return m;
}

// a and b agree within the tolerances of `dtype`, elementwise.
inline bool all_close(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.sizes() != b.sizes()) return false;
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (std::size_t i = 0; i < va.size(); ++i)
    if (!(std::abs(va[i] - vb[i]) <= atol + rtol * std::abs(vb[i]))) return false;
  return true;
}

// The bound on a bfloat16 product C = A B (+ bias) computed from bfloat16
// operands with float32 products (exact) and sums: K float32 additions (one
// more with the bias), each off by at most 2^-24 of its partial sum, so
// (k + 1) 2^-24 (sum_i |a_i b_i| + |bias|) (a loose gamma_k), then one
// rounding to bfloat16 of the result, 2^-8 of it. `got` is on the CPU; on
// failure `where` names the first element outside.
inline bool within_product_bound(const Tensor& got, const Tensor& a, const Tensor& b, std::string& where,
                                 const Tensor& bias = Tensor()) {
  const auto wide = [](const Tensor& x) { return kernels::cast(x, DType::f64); };
  const auto abs = [&](const Tensor& x) { return kernels::unary(kernels::Unary::abs, wide(x)); };
  Tensor want = kernels::matmul(wide(a), wide(b)), scale = kernels::matmul(abs(a), abs(b));
  if (bias.defined()) {
    want = kernels::binary(kernels::Binary::add, want, wide(bias));
    scale = kernels::binary(kernels::Binary::add, scale, abs(bias));
  }
  const auto g = got.to_vector<double>(), w = want.to_vector<double>(), s = scale.to_vector<double>();
  const double k = static_cast<double>(a.size(-1));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double bound = kBf16UnitRoundoff * std::abs(w[i]) + (k + 1) * 0x1p-24 * s[i] + 1e-30;
    if (!(std::abs(g[i] - w[i]) <= bound)) {
      where = fmt::format("element {}: got {}, want {} (bound {})", i, g[i], w[i], bound);
      return false;
    }
  }
  return true;
}

}  // namespace attograd::test

// REQUIRE_GRADCHECK("op", fn, inputs...): fails with the op, input, element, analytic and numeric values.
#define REQUIRE_GRADCHECK(name, fn, ...)                                                         \
  do {                                                                                           \
    const auto gradcheck_result_ = ::attograd::gradcheck(name, fn, __VA_ARGS__);                 \
    INFO(gradcheck_result_.message);                                                             \
    REQUIRE(gradcheck_result_.ok);                                                               \
    REQUIRE(gradcheck_result_.checked > 0);                                                      \
  } while (0)
