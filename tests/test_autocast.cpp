// Mixed precision (autograd/autocast.h): under an AutocastGuard, products and
// attention run in bfloat16, softmax, layer_norm, the loss and reductions in
// float32; parameters are cast once and get float32 gradients; a GPT trains.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/attention.h"
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "helpers.h"
#include "nn/gpt.h"

using namespace attograd;
using namespace attograd::test;

namespace {

Tensor f32_leaf(const Shape& sizes, std::uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(sizes, {DType::f32}, gen);
  t.set_requires_grad(true);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace

TEST_CASE("autocast: products in bfloat16, softmax, layer_norm, the loss and sums in float32", "[bf16][autocast]") {
  const Tensor x = f32_leaf({4, 6}, 1), w = f32_leaf({5, 6}, 2), bias = f32_leaf({5}, 3);
  const Tensor x_bf16 = kernels::cast(x, DType::bf16);
  AutocastGuard autocast;
  REQUIRE(autocast_enabled());

  // A product under autocast is the bfloat16 product of the rounded operands, not a
  // float32 product rounded afterwards.
  const Tensor y = linear(x, w, bias);
  REQUIRE(y.dtype() == DType::bf16);
  CHECK(same_bits(y, kernels::matmul(x_bf16, transpose(kernels::cast(w, DType::bf16), 0, 1),
                                     kernels::cast(bias, DType::bf16))));
  CHECK(matmul(x, transpose(w, 0, 1)).dtype() == DType::bf16);

  // Each float32 op reads the bfloat16 input widened, exactly, and gives float32: its
  // result is the float32 kernel's to the bit (a bfloat16 one would have rounded it).
  const Tensor wide = kernels::cast(y, DType::f32);
  CHECK(same_bits(softmax(y, -1), kernels::softmax_forward(wide)));
  CHECK(same_bits(log_softmax(y, -1), kernels::log_softmax_forward(wide)));
  CHECK(same_bits(layer_norm(y, {}, {}), kernels::layer_norm_forward(wide, {}, {}, 1e-5).y));
  CHECK(same_bits(sum(y), kernels::sum(wide, {}, false)));
  CHECK(mean(y).dtype() == DType::f32);
  const Tensor targets = from_vector(std::vector<std::int64_t>{0, 4, 2, 1}, {4});
  CHECK(same_bits(cross_entropy(y, targets), kernels::cross_entropy_forward(wide, targets, -100).loss));

  // Element-wise ops keep bfloat16; mixed with float32 they promote to float32.
  CHECK(gelu(y).dtype() == DType::bf16);
  CHECK(add(y, y).dtype() == DType::bf16);
  CHECK(add(kernels::cast(y, DType::f32), y).dtype() == DType::f32);
}

TEST_CASE("autocast: a parameter is cast once per guard and its gradient is float32", "[bf16][autocast]") {
  const Tensor x = f32_leaf({3, 4}, 4), w = f32_leaf({2, 4}, 5);
  Tensor loss;
  {
    AutocastGuard autocast;
    const Tensor a = linear(x, w), b = linear(mul(x, 2.0), w);
    // Both products read the same bfloat16 copy of w: one cast node feeds both.
    REQUIRE(a.grad_fn() != nullptr);
    REQUIRE(b.grad_fn() != nullptr);
    const auto& a_w = a.grad_fn()->edges()[1].node;
    const auto& b_w = b.grad_fn()->edges()[1].node;
    REQUIRE(a_w != nullptr);
    CHECK(a_w == b_w);
    CHECK(a_w->name() == "to_dtype");
    loss = sum(add(a, b));
  }
  CHECK_FALSE(autocast_enabled());
  backward(loss);
  REQUIRE(w.grad().dtype() == DType::f32);
  REQUIRE(x.grad().dtype() == DType::f32);
  // d loss / d w[j] = sum over rows i of (x[i] + 2 x[i]) = 3 sum_i x[i], for every j:
  // each x rounded to bfloat16 (2^-8 of it) and the sum rounded once more, so
  // within 2 * 2^-8 * 3 sum_i |x[i]| of the float64 value.
  const auto xs = x.to_vector<double>(), got = w.grad().to_vector<double>();
  for (std::int64_t j = 0; j < 2; ++j)
    for (std::int64_t k = 0; k < 4; ++k) {
      double want = 0, scale = 0;
      for (std::int64_t i = 0; i < 3; ++i) want += 3 * xs[i * 4 + k], scale += 3 * std::abs(xs[i * 4 + k]);
      CHECK(std::abs(got[j * 4 + k] - want) <= 2 * kBf16UnitRoundoff * scale + 1e-6);
    }
}

TEST_CASE("autocast: a GPT's loss under the guard is the float32 one within bfloat16's error, gradients float32",
          "[bf16][autocast]") {
  const nn::GPTConfig config{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  nn::GPT model(config);
  Generator gen(7);
  std::vector<std::int64_t> ids(2 * 8), next(2 * 8);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 5 % 11), next[i] = (ids[i] + 1) % 11;
  const Tensor tokens = from_vector(ids, {2, 8}), targets = from_vector(next, {2, 8});
  const double f32_loss = model.loss(tokens, targets).item();
  Tensor loss;
  {
    AutocastGuard autocast;
    loss = model.loss(tokens, targets);
  }
  REQUIRE(loss.dtype() == DType::f32);
  // Two layers of bfloat16 products: a loss of about ln 11 moves by a few 2^-8 of itself.
  CHECK(std::abs(loss.item() - f32_loss) <= 8 * kBf16UnitRoundoff * f32_loss);
  backward(loss);
  for (const auto& p : model.named_parameters()) {
    INFO(p.name);
    REQUIRE(p.tensor.grad().defined());
    CHECK(p.tensor.grad().dtype() == DType::f32);
    for (double g : p.tensor.grad().to_vector<double>()) REQUIRE(std::isfinite(g));
  }
}
