// Elementwise ops: known values and float64 gradchecks on odd, transposed and broadcast shapes.
#include <bit>
#include <limits>

#include "helpers.h"
#include "cpu/vec_math.h"

using namespace attograd;
using namespace attograd::test;

namespace {
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
}

TEST_CASE("add/sub/mul/div known values with broadcasting", "[elementwise]") {
  Tensor a = from({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from({10, 20, 30}, {3});
  CHECK((a + b).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK((a - b).to_vector<float>() == std::vector<float>{-9, -18, -27, -6, -15, -24});
  CHECK((a * b).to_vector<float>() == std::vector<float>{10, 40, 90, 40, 100, 180});
  CHECK((b / a).at({1, 2}) == Approx(5.0));
  Tensor col = from({1, 2}, {2, 1});
  CHECK((col * b).sizes() == Shape{2, 3});
  CHECK((col * b).at({1, 2}) == Approx(60));
  CHECK((2.0 - a).at({0, 0}) == Approx(1));
  CHECK((1.0 / a).at({1, 1}) == Approx(0.2));
}

TEST_CASE("unary known values", "[elementwise]") {
  Tensor x = from<double>({-1.0, 0.0, 2.0}, {3});
  CHECK(relu(x).to_vector<double>() == std::vector<double>{0, 0, 2});
  CHECK(exp(x).at({2}) == Approx(std::exp(2.0)));
  CHECK(tanh(x).at({0}) == Approx(std::tanh(-1.0)));
  // GPT-2's tanh GELU at 1.0: 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.8411919906
  CHECK(gelu(from<double>({1.0}, {1})).item() == Approx(0.8411919906).epsilon(1e-9));
  CHECK(pow(from<double>({3.0}, {1}), 2.0).item() == Approx(9.0));
  CHECK(sqrt(from<double>({16.0}, {1})).item() == Approx(4.0));
  CHECK(log(from<double>({M_E}, {1})).item() == Approx(1.0));
}

TEST_CASE("broadcasting errors name the op and shapes", "[elementwise][errors]") {
  Tensor a = zeros({2, 3}), b = zeros({4});
  REQUIRE_THROWS_WITH(a + b, Catch::Contains("[add]") && Catch::Contains("[2,3]") && Catch::Contains("[4]"));
  REQUIRE_THROWS_WITH(a * zeros({3}, {DType::f64}), Catch::Contains("[mul]") && Catch::Contains("float64"));
  REQUIRE_THROWS_WITH(relu(Tensor()), Catch::Contains("undefined"));
}

TEST_CASE("gradcheck binary ops on odd and broadcast shapes", "[elementwise][gradcheck]") {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }},
  };
  for (const auto& [name, op] : ops) {
    SECTION(name) {
      Fn fn = [op = op](const std::vector<Tensor>& x) { return op(x[0], x[1]); };
      REQUIRE_GRADCHECK(name, fn, {positive_leaf({5, 7}, 1), positive_leaf({5, 7}, 2)});
      REQUIRE_GRADCHECK(name, fn, {positive_leaf({5, 1}, 3), positive_leaf({7}, 4)});          // broadcast both
      REQUIRE_GRADCHECK(name, fn, {positive_leaf({11, 1, 5}, 5), positive_leaf({3, 1}, 6)});
      REQUIRE_GRADCHECK(name, fn, {positive_leaf({5, 7}, 8), transposed_leaf({5, 7}, 7, true)});  // non-contiguous
    }
  }
}

TEST_CASE("gradcheck unary and scalar ops", "[elementwise][gradcheck]") {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& x) { return -x; }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"relu", [](const Tensor& x) { return relu(x - 1.2); }},
      {"gelu", [](const Tensor& x) { return gelu(x - 1.0); }},
      {"add_scalar", [](const Tensor& x) { return x + 3.0; }},
      {"mul_scalar", [](const Tensor& x) { return x * -2.5; }},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 2.5); }},
      {"rsub_scalar", [](const Tensor& x) { return 1.0 - x; }},
      {"rdiv_scalar", [](const Tensor& x) { return 2.0 / x; }},
  };
  for (const auto& [name, op] : ops) {
    SECTION(name) {
      Fn fn = [op = op](const std::vector<Tensor>& x) { return op(x[0]); };
      REQUIRE_GRADCHECK(name, fn, {positive_leaf({5, 7}, 11)});
      REQUIRE_GRADCHECK(name, fn, {positive_leaf({13}, 12)});
      REQUIRE_GRADCHECK(name, fn, {transposed_leaf({5, 7}, 13, true)});
    }
  }
}

TEST_CASE("float32 gelu and gelu_grad stay close to float64 over [-12, 12]", "[elementwise]") {
  // Their float32 path is vectorised with its own exponential
  // (cpu/vec_math.h); float64 uses libm. Absolute error near zero,
  // relative error elsewhere, including the far negative tail where gelu
  // is tiny and a 1 + tanh form would cancel.
  const std::int64_t n = 24001;
  std::vector<double> xs(n);
  for (std::int64_t i = 0; i < n; ++i) xs[i] = -12.0 + 24.0 * static_cast<double>(i) / (n - 1);
  const Tensor x32 = kernels::cast(from_vector(xs, {n}), DType::f32);
  const Tensor x64 = kernels::cast(x32, DType::f64);  // the same values
  for (kernels::Unary op : {kernels::Unary::gelu, kernels::Unary::gelu_grad}) {
    const auto got = kernels::cast(kernels::unary(op, x32), DType::f64).to_vector<double>();
    const auto want = kernels::unary(op, x64).to_vector<double>();
    double worst_abs = 0, worst_rel = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double err = std::abs(got[i] - want[i]);
      worst_abs = std::max(worst_abs, err);
      if (std::abs(want[i]) > 1e-3) worst_rel = std::max(worst_rel, err / std::abs(want[i]));
    }
    INFO(kernels::unary_name(op) << ": max abs error " << worst_abs << ", max rel error " << worst_rel);
    CHECK(worst_abs < 5e-6);
    CHECK(worst_rel < 1e-4);
  }
}

TEST_CASE("the float32 reciprocal without a division is within 1 ulp of 1 / d over [1, 2^100]", "[elementwise]") {
  // Every 4099th float of the range (its estimate's error repeats with every
  // power of two, so this walks every binade at many mantissas) and both ends.
  std::uint32_t worst_ulps = 0;
  float worst_at = 1;
  auto check_at = [&](float d) {
    const float want = 1.0f / d, got = cpu::reciprocal_in_range(d);
    const std::uint32_t a = std::bit_cast<std::uint32_t>(want), b = std::bit_cast<std::uint32_t>(got);
    const std::uint32_t ulps = a > b ? a - b : b - a;
    if (ulps > worst_ulps) worst_ulps = ulps, worst_at = d;
  };
  for (std::uint32_t bits = std::bit_cast<std::uint32_t>(1.0f); bits <= std::bit_cast<std::uint32_t>(cpu::kReciprocalMax);
       bits += 4099)
    check_at(std::bit_cast<float>(bits));
  check_at(cpu::kReciprocalMax);
  CHECK(cpu::reciprocal_in_range(1.0f) == 1.0f);  // GELU's s = 1 exactly for large x (its gradient's 1 - s)
  INFO("worst: " << worst_ulps << " ulps at d = " << worst_at);
  CHECK(worst_ulps <= 1);
}

TEST_CASE("float32 gelu at the edges: NaN stays NaN, +inf gives +inf, a huge negative x gives 0", "[elementwise]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = from_vector(std::vector<float>{nan, inf, -1e30f, -3e4f, -20.0f, 0.0f, 20.0f, 1e30f}, {8});
  const auto y = kernels::unary(kernels::Unary::gelu, x).to_vector<float>();
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == inf);
  CHECK(y[2] == 0.0f);  // x s with s exactly 0, not x times a tiny s
  CHECK(y[3] == 0.0f);
  CHECK(std::abs(y[4]) < 1e-30f);
  CHECK(y[5] == 0.0f);
  CHECK(y[6] == 20.0f);
  CHECK(y[7] == 1e30f);
  const auto g = kernels::unary(kernels::Unary::gelu_grad, x).to_vector<float>();
  CHECK(std::isnan(g[0]));
  CHECK(g[3] == 0.0f);
  CHECK(g[5] == 0.5f);
  CHECK(g[6] == 1.0f);
}

TEST_CASE("gelu_backward equals dy * gelu_grad(x) on every layout", "[elementwise]") {
  // The fused backward of gelu against its composition; float32 covers the
  // vectorised contiguous loop (odd length, so its tail too) and the strided one.
  for (DType dtype : {DType::f32, DType::f64}) {
    SECTION(std::string(dtype_name(dtype))) {
      Generator gen(7);
      const Tensor x = randn({37, 41}, {dtype}, gen) * 3.0, dy = randn({37, 41}, {dtype}, gen);
      const Tensor row = randn({41}, {dtype}, gen);
      auto fused = [](const Tensor& g, const Tensor& v) { return kernels::binary(kernels::Binary::gelu_backward, g, v); };
      auto composed = [](const Tensor& g, const Tensor& v) { return g * kernels::unary(kernels::Unary::gelu_grad, v); };
      const double atol = atol_for(dtype), rtol = rtol_for(dtype);
      CHECK(all_close(fused(dy, x), composed(dy, x), atol, rtol));
      const Tensor xt = transpose(x, 0, 1), dyt = transpose(dy, 0, 1);  // strided
      CHECK(all_close(fused(dyt, xt), composed(dyt, xt), atol, rtol));
      CHECK(all_close(fused(dy, row), composed(dy, row), atol, rtol));  // x broadcast over rows
      CHECK(max_abs_diff(fused(dy, x), dy) > 0.1);  // it is not the identity
    }
  }
}

TEST_CASE("where and masked_fill: values and gradcheck with a broadcast mask", "[elementwise][gradcheck]") {
  Tensor mask = from_vector(std::vector<bool>{true, false, true, false, false, true, false}, {1, 7});
  Tensor x = from({1, 2, 3, 4, 5, 6, 7}, {1, 7});
  Tensor y = masked_fill(x, mask, -1.0);
  CHECK(y.to_vector<float>() == std::vector<float>{-1, 2, -1, 4, 5, -1, 7});
  Fn fill = [mask](const std::vector<Tensor>& v) { return masked_fill(v[0], mask, 3.0); };
  REQUIRE_GRADCHECK("masked_fill", fill, {leaf({5, 7})});
  REQUIRE_GRADCHECK("masked_fill", fill, {transposed_leaf({5, 7})});
  Fn sel = [mask](const std::vector<Tensor>& v) { return where(mask, v[0], v[1]); };
  REQUIRE_GRADCHECK("where", sel, {leaf({5, 7}, 1), leaf({5, 1}, 2)});
  REQUIRE_THROWS_WITH(masked_fill(zeros({2, 3}), from_vector(std::vector<bool>{true, false}, {2}), 0.0),
                      Catch::Contains("[masked_fill]"));
  REQUIRE_THROWS_WITH(masked_fill(zeros({2, 3}), zeros({3}), 0.0), Catch::Contains("bool"));
}
