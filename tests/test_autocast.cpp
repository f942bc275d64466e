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

// The fused path against its composed reference: the float32 LayerNorm cast to
// bfloat16, whose gradient widens back (the pair a product under autocast made).
TEST_CASE("layer_norm with a bfloat16 result is the cast of the float32 one, to the bit, forward and backward",
          "[bf16][autocast]") {
  struct Case {
    Shape sizes;
    bool weight, bias, transposed;
  };
  for (const Case& c : {Case{{3, 5, 48}, true, true, false}, Case{{7, 33}, true, false, false},
                        Case{{4, 65}, false, true, true}, Case{{2, 3, 17}, false, false, true}}) {
    CAPTURE(shape_str(c.sizes), c.weight, c.bias, c.transposed);
    const std::int64_t n = c.sizes.back();
    auto input = [&] {  // the same values each time; a transposed view when asked
      Shape stored = c.sizes;
      if (c.transposed) std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
      Tensor x = mul(f32_leaf(stored, 11), 3.0).detach();
      if (c.transposed) x = transpose(x, -1, -2);
      x.set_requires_grad(true);
      return x;
    };
    auto param = [&](bool given, std::uint64_t seed) { return given ? f32_leaf({n}, seed) : Tensor(); };
    const Tensor x1 = input(), w1 = param(c.weight, 12), b1 = param(c.bias, 13);
    const Tensor x2 = input(), w2 = param(c.weight, 12), b2 = param(c.bias, 13);
    Generator gen(14);
    const Tensor dy = kernels::cast(randn(c.sizes, {DType::f32}, gen), DType::bf16);

    const Tensor fused = layer_norm(x1, w1, b1, 1e-5, DType::bf16);
    const Tensor composed = to(layer_norm(x2, w2, b2, 1e-5), DType::bf16);
    REQUIRE(fused.dtype() == DType::bf16);
    CHECK(same_bits(fused, composed));
    backward(fused, dy);
    backward(composed, dy);
    REQUIRE(x1.grad().dtype() == DType::f32);
    CHECK(same_bits(x1.grad(), x2.grad()));
    if (c.weight) CHECK(same_bits(w1.grad(), w2.grad()));
    if (c.bias) CHECK(same_bits(b1.grad(), b2.grad()));
  }
}

// The loss reads bfloat16 logits as they are: the float32 loss of the widened
// logits, and the gradient the cast pair would give (the float32 one rounded),
// bit for bit; on rows of 3 to 1500 classes, with ignored rows, and with all
// rows ignored (a loss of 0, a zero gradient).
TEST_CASE("cross_entropy of bfloat16 logits is float32's of the widened logits, forward and backward, to the bit",
          "[bf16][autocast]") {
  for (std::int64_t classes : {3, 65, 1500}) {
    for (std::int64_t ignored : {std::int64_t{-100}, std::int64_t{1}}) {
      CAPTURE(classes, ignored);
      const Tensor targets =
          from_vector(std::vector<std::int64_t>{0, 1, classes - 1, 1, 2 % classes, 0, 1}, {7});
      const Tensor all_ignored = full({7}, static_cast<double>(ignored), {DType::i64});
      for (const Tensor& t : {targets, all_ignored}) {
        const Tensor leaf1 = f32_leaf({7, classes}, 21), leaf2 = f32_leaf({7, classes}, 21);
        Tensor fused, composed;
        {
          AutocastGuard autocast;
          fused = cross_entropy(to(leaf1, DType::bf16), t, ignored);
        }
        composed = cross_entropy(to(to(leaf2, DType::bf16), DType::f32), t, ignored);
        REQUIRE(fused.dtype() == DType::f32);
        CHECK(same_bits(fused, composed));
        backward(fused);
        backward(composed);
        CHECK(same_bits(leaf1.grad(), leaf2.grad()));
      }
    }
  }
  // Outside autocast, bfloat16 logits give a bfloat16 loss: the float32 one rounded.
  const Tensor logits = kernels::cast(f32_leaf({4, 9}, 22).detach(), DType::bf16);
  const Tensor targets = from_vector(std::vector<std::int64_t>{0, 8, 3, 3}, {4});
  const Tensor loss = cross_entropy(logits, targets);
  REQUIRE(loss.dtype() == DType::bf16);
  CHECK(same_bits(loss, kernels::cast(cross_entropy(kernels::cast(logits, DType::f32), targets), DType::bf16)));
}

TEST_CASE("layer_norm's result dtype: x's, or bfloat16 from float32, anything else refused by name", "[bf16]") {
  const Tensor x = f32_leaf({2, 8}, 15);
  CHECK(layer_norm(x, {}, {}, 1e-5, DType::f32).dtype() == DType::f32);
  CHECK_THROWS_WITH(layer_norm(kernels::cast(x, DType::f64), {}, {}, 1e-5, DType::bf16),
                    Catch::Contains("layer_norm") && Catch::Contains("bfloat16 result of a float64 input"));
  CHECK_THROWS_WITH(layer_norm(x, {}, {}, 1e-5, DType::f64),
                    Catch::Contains("layer_norm") && Catch::Contains("float64 result of a float32 input"));
}

TEST_CASE("LayerNorm::feeding_products: bfloat16 under autocast, forward's result without", "[bf16][autocast]") {
  const nn::LayerNorm ln(6);
  const Tensor x = f32_leaf({3, 6}, 16);
  CHECK(same_bits(ln.feeding_products(x), ln(x)));
  AutocastGuard autocast;
  const Tensor y = ln.feeding_products(x);
  REQUIRE(y.dtype() == DType::bf16);
  CHECK(same_bits(y, to(ln(x), DType::bf16)));
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
