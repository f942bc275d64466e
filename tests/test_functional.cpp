// Neural-network functions: softmax, log_softmax, layer_norm, embedding,
// cross_entropy, dropout, cat/split. Known values, float64 gradchecks on odd,
// transposed and 3-D shapes, and every fused op against its composed
// reference (autograd/ops/reference.h), forward and backward.
#include <cmath>
#include <limits>

#include "autograd/ops/reference.h"
#include "helpers.h"
#include "autograd/autocast.h"
#include "cpu/parallel.h"

using namespace attograd;
using namespace attograd::test;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// A float leaf of `dtype` drawn like leaf(): float32 inputs for fused-vs-reference checks.
Tensor leaf_as(const Shape& sizes, DType dtype, std::uint64_t seed) {
  Tensor t = kernels::cast(leaf(sizes, seed).detach(), dtype);
  t.set_requires_grad(true);
  return t;
}

// The output of fn and the gradients of its inputs under a fixed random
// projection of that output (the same projection for every fn of that shape).
struct Evaluated {
  Tensor y;
  std::vector<Tensor> grads;
};
Evaluated evaluate(const Fn& fn, const std::vector<Tensor>& inputs) {
  for (const Tensor& x : inputs)
    if (x.requires_grad()) x.set_grad({});
  Evaluated out;
  out.y = fn(inputs);
  Generator gen(99);
  backward(out.y, kernels::cast(randn(out.y.sizes(), {DType::f64}, gen), out.y.dtype()));
  for (const Tensor& x : inputs)
    if (x.requires_grad()) out.grads.push_back(x.grad());
  return out;
}

// fused and reference agree at the tolerances of the inputs' dtype, forward and backward.
void require_same(const char* name, const Fn& fused, const Fn& reference, const std::vector<Tensor>& inputs) {
  const Evaluated a = evaluate(fused, inputs), b = evaluate(reference, inputs);
  const DType dtype = a.y.dtype();
  INFO(name << " " << dtype_name(dtype) << ": forward max |diff| " << max_abs_diff(a.y, b.y));
  REQUIRE(all_close(a.y, b.y, atol_for(dtype), rtol_for(dtype)));
  REQUIRE(a.grads.size() == b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO("grad of input " << i << ": max |diff| " << max_abs_diff(a.grads[i], b.grads[i]));
    REQUIRE(all_close(a.grads[i], b.grads[i], atol_for(dtype), rtol_for(dtype)));
  }
}

std::vector<double> values(const Tensor& t) { return kernels::contiguous(t).to_vector<double>(); }

}  // namespace

// ---- softmax / log_softmax ------------------------------------------------------------

TEST_CASE("softmax and log_softmax known values", "[functional]") {
  Tensor x = from({1, 2, 3}, {3});
  const std::vector<double> expected = {0.0900306, 0.2447285, 0.6652410};
  const auto y = values(softmax(x, 0));
  const auto ly = values(log_softmax(x, -1));
  for (int i = 0; i < 3; ++i) {
    CHECK(y[i] == Approx(expected[i]).epsilon(1e-6));
    CHECK(ly[i] == Approx(std::log(expected[i])).epsilon(1e-6));
  }
  // Large logits: shifted by the row max, nothing overflows.
  const auto big = values(softmax(from({1000, 1001, 1002}, {3}), 0));
  for (int i = 0; i < 3; ++i) CHECK(big[i] == Approx(expected[i]).epsilon(1e-6));
}

TEST_CASE("softmax over dim 0 and -1 matches the reference, rows sum to 1", "[functional]") {
  Tensor x = leaf({5, 7}, 3);
  for (std::int64_t dim : {0, 1, -1, -2}) {
    const Tensor y = softmax(x, dim);
    CHECK(y.sizes() == x.sizes());
    CHECK(y.is_contiguous());
    CHECK(max_abs_diff(y, reference::softmax(x, dim)) < 1e-12);
    CHECK(max_abs_diff(sum(y, {dim}), ones({dim == 0 || dim == -2 ? 7 : 5}, {DType::f64})) < 1e-12);
    CHECK(max_abs_diff(log_softmax(x, dim), reference::log_softmax(x, dim)) < 1e-12);
  }
  REQUIRE_THROWS_WITH(softmax(x, 2), Catch::Contains("[softmax]") && Catch::Contains("dim 2 out of range"));
  REQUIRE_THROWS_WITH(softmax(scalar_tensor(1.0), 0), Catch::Contains("[softmax]"));
}

TEST_CASE("softmax with masked (-inf) entries, and a fully masked row", "[functional]") {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = from<double>({0, -inf, 0, 1, 2, 3, -inf, -inf, -inf}, {3, 3});
  const auto y = values(softmax(x, -1));
  CHECK(y[0] == Approx(0.5));
  CHECK(y[1] == 0.0);
  CHECK(y[2] == Approx(0.5));
  CHECK(y[5] == Approx(0.6652410).epsilon(1e-6));
  // Decided behaviour: a row with every entry -inf has no distribution; plain
  // softmax gives NaN there, as PyTorch does. Attention handles fully masked
  // rows itself (zeros), so this path only has to not crash or touch other rows.
  for (int i = 6; i < 9; ++i) CHECK(std::isnan(y[i]));
  // float32 (the vectorised exp) also maps masked entries to exactly 0 and keeps NaN rows NaN.
  const auto y32 = softmax(kernels::cast(x, DType::f32), -1).to_vector<float>();
  CHECK(y32[0] == 0.5f);
  CHECK(y32[1] == 0.0f);
  CHECK(std::isnan(y32[7]));
  CHECK(std::isinf(values(log_softmax(x, -1))[1]));
  // Gradients through the masked entries of the good rows are finite (0 there).
  Tensor xl = x.detach();
  xl = kernels::clone(narrow(xl, 0, 0, 2));
  xl.set_requires_grad(true);
  backward(sum(softmax(xl, -1) * from<double>({1, 2, 3, 4, 5, 6}, {2, 3})));
  for (double g : values(xl.grad())) CHECK(std::isfinite(g));
  CHECK(values(xl.grad())[1] == 0.0);
}

TEST_CASE("gradcheck softmax and log_softmax on odd, transposed and 3-D shapes", "[functional][gradcheck]") {
  for (const char* name : {"softmax", "log_softmax"}) {
    SECTION(name) {
      const bool log_version = std::string(name) == "log_softmax";
      auto op = [log_version](const Tensor& x, std::int64_t dim) {
        return log_version ? log_softmax(x, dim) : softmax(x, dim);
      };
      for (std::int64_t dim : {-1, 0}) {
        Fn fn = [op, dim](const std::vector<Tensor>& v) { return op(v[0], dim); };
        REQUIRE_GRADCHECK(name, fn, {leaf({5, 7}, 1)});
        REQUIRE_GRADCHECK(name, fn, {leaf({11, 13}, 2)});
        REQUIRE_GRADCHECK(name, fn, {transposed_leaf({5, 7}, 3)});
      }
      for (std::int64_t dim : {0, 1, 2}) {
        Fn fn = [op, dim](const std::vector<Tensor>& v) { return op(v[0], dim); };
        REQUIRE_GRADCHECK(name, fn, {leaf({3, 5, 7}, 4)});
        REQUIRE_GRADCHECK(name, fn, {transposed_leaf({3, 5, 7}, 5)});
      }
    }
  }
}

// ---- layer_norm ------------------------------------------------------------------------

TEST_CASE("layer_norm known values", "[functional]") {
  Tensor x = from<double>({1, 2, 3}, {1, 3});
  const auto y = values(layer_norm(x, ones({3}, {DType::f64}), zeros({3}, {DType::f64}), 1e-5));
  // (x - 2) / sqrt(2/3 + 1e-5)
  CHECK(y[0] == Approx(-1.2247357).epsilon(1e-6));
  CHECK(y[1] == Approx(0.0).margin(1e-12));
  CHECK(y[2] == Approx(1.2247357).epsilon(1e-6));
  // With a weight and bias: y * w + b.
  const auto yw = values(layer_norm(x, from<double>({2, 3, 4}, {3}), from<double>({1, 1, -1}, {3}), 1e-5));
  CHECK(yw[0] == Approx(-1.2247357 * 2 + 1).epsilon(1e-6));
  CHECK(yw[1] == Approx(1.0));
  CHECK(yw[2] == Approx(1.2247357 * 4 - 1).epsilon(1e-6));
  // Without weight and bias it is the plain normalisation; a large offset does not cancel digits.
  const auto plain = values(layer_norm(from<double>({1e8 + 1, 1e8 + 2, 1e8 + 3}, {3}), {}, {}, 1e-5));
  CHECK(plain[2] == Approx(1.2247357).epsilon(1e-6));
  const auto stats = kernels::layer_norm_forward(from({1, 2, 3, 4, 4, 4}, {2, 3}), {}, {}, 1e-5);
  CHECK(values(stats.mean) == std::vector<double>{2, 4});
  CHECK(values(stats.rstd)[1] == Approx(1 / std::sqrt(1e-5)).epsilon(1e-6));
}

TEST_CASE("gradcheck layer_norm with and without weight and bias", "[functional][gradcheck]") {
  const Tensor none;
  for (const bool with_weight : {true, false}) {
    for (const bool with_bias : {true, false}) {
      const std::string name =
          std::string("layer_norm") + (with_weight ? " +weight" : "") + (with_bias ? " +bias" : "");
      Fn fn = [&](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2], 1e-5); };
      const Tensor w7 = with_weight ? leaf({7}, 11) : none, b7 = with_bias ? leaf({7}, 12) : none;
      REQUIRE_GRADCHECK(name, fn, {leaf({5, 7}, 1), w7, b7});
      REQUIRE_GRADCHECK(name, fn, {transposed_leaf({5, 7}, 2), w7, b7});
      const Tensor w13 = with_weight ? leaf({13}, 13) : none, b13 = with_bias ? leaf({13}, 14) : none;
      REQUIRE_GRADCHECK(name, fn, {leaf({11, 13}, 3), w13, b13});
      REQUIRE_GRADCHECK(name, fn, {leaf({3, 5, 7}, 4), w7, b7});
    }
  }
}

// float32 rows run in their own SIMD-compiled loops (cpu/layer_norm.cpp):
// widths below, at and past the 16 float64 lanes of a row's sums, rows in
// several groups of 8, and (at n = 128) two blocks of the weight and bias sums.
// The inputs have mean about 0: far from 0 against the spread, a float32
// LayerNorm's xhat is off by about mean * 2^-24 * rstd, from the float32 mean
// it keeps for the backward (as PyTorch's does), which is not what this tests.
TEST_CASE("float32 layer_norm matches float64 on the same values forward and backward", "[functional]") {
  // A float64 leaf holding exactly the values of a float32 one.
  auto widened = [](const Tensor& t) {
    Tensor u = kernels::cast(t.detach(), DType::f64);
    u.set_requires_grad(true);
    return u;
  };
  Fn affine = [](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); };
  Fn plain = [](const std::vector<Tensor>& v) { return layer_norm(v[0], {}, {}); };
  for (const std::int64_t n : {1, 5, 16, 33, 128, 300}) {
    for (const bool with_affine : {true, false}) {
      INFO("n " << n << (with_affine ? ", weight and bias" : ", no affine"));
      std::vector<Tensor> in32{leaf_as({300, n}, DType::f32, 1)};
      if (with_affine) {
        in32.push_back(leaf_as({n}, DType::f32, 2));
        in32.push_back(leaf_as({n}, DType::f32, 3));
      }
      std::vector<Tensor> in64;
      for (const Tensor& t : in32) in64.push_back(widened(t));
      const Fn& fn = with_affine ? affine : plain;
      const Evaluated f32 = evaluate(fn, in32), f64 = evaluate(fn, in64);
      INFO("forward max |diff| " << max_abs_diff(f32.y, f64.y));
      CHECK(all_close(f32.y, f64.y, atol_for(DType::f32), rtol_for(DType::f32)));
      REQUIRE(f32.grads.size() == f64.grads.size());
      for (std::size_t i = 0; i < f32.grads.size(); ++i) {
        INFO("grad of input " << i << ": max |diff| " << max_abs_diff(f32.grads[i], f64.grads[i]));
        CHECK(all_close(f32.grads[i], f64.grads[i], atol_for(DType::f32), rtol_for(DType::f32)));
      }
    }
  }
}

TEST_CASE("layer_norm errors name the mismatch", "[functional][errors]") {
  const Tensor x = zeros({4, 5});
  REQUIRE_THROWS_WITH(layer_norm(x, ones({4}), {}),
                      Catch::Contains("[layer_norm] weight is [4], expected [5]") && Catch::Contains("[4,5]"));
  REQUIRE_THROWS_WITH(layer_norm(x, {}, ones({5, 1})), Catch::Contains("[layer_norm] bias is [5,1]"));
  REQUIRE_THROWS_WITH(layer_norm(x, ones({5}, {DType::f64}), {}), Catch::Contains("[layer_norm] dtypes differ"));
  REQUIRE_THROWS_WITH(layer_norm(x, {}, {}, -1.0), Catch::Contains("eps"));
}

// ---- embedding ----------------------------------------------------------------------------

TEST_CASE("embedding gathers rows, repeated ids sum their gradients", "[functional]") {
  Tensor weight = from<double>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  weight.set_requires_grad(true);
  const Tensor ids = ids_tensor({3, 1, 3, 3, 0, 1}, {2, 3});
  const Tensor out = embedding(weight, ids);
  REQUIRE(out.sizes() == Shape{2, 3, 2});
  CHECK(values(out) == std::vector<double>{30, 31, 10, 11, 30, 31, 30, 31, 0, 1, 10, 11});
  backward(sum(out * from<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2})));
  // row 3 gets positions 0, 2, 3; row 1 positions 1, 5; row 0 position 4; row 2 nothing.
  CHECK(values(weight.grad()) == std::vector<double>{9, 10, 3 + 11, 4 + 12, 0, 0, 1 + 5 + 7, 2 + 6 + 8});
}

TEST_CASE("gradcheck embedding with repeated ids and a transposed table", "[functional][gradcheck]") {
  const Tensor ids = ids_tensor({4, 0, 4, 2, 6, 6, 1, 4, 3, 0, 5}, {11});
  Fn fn = [ids](const std::vector<Tensor>& v) { return embedding(v[0], ids); };
  REQUIRE_GRADCHECK("embedding", fn, {leaf({7, 5}, 1)});
  REQUIRE_GRADCHECK("embedding", fn, {transposed_leaf({7, 13}, 2)});
  const Tensor ids2d = ids_tensor({1, 1, 2, 0, 4, 1}, {2, 3});
  Fn fn2 = [ids2d](const std::vector<Tensor>& v) { return embedding(v[0], ids2d); };
  REQUIRE_GRADCHECK("embedding 2-d ids", fn2, {leaf({5, 7}, 3)});
}

TEST_CASE("embedding errors: ids out of range, wrong dtype, 1-d table", "[functional][errors]") {
  const Tensor weight = zeros({65, 4});
  REQUIRE_THROWS_WITH(embedding(weight, ids_tensor({0, 1, 2, 70}, {4})),
                      Catch::Equals("[embedding] id 70 out of range for 65 rows at position 3"));
  REQUIRE_THROWS_WITH(embedding(weight, ids_tensor({-1}, {1})), Catch::Contains("id -1 out of range"));
  REQUIRE_THROWS_WITH(embedding(weight, zeros({3})), Catch::Contains("[embedding] ids must be int64"));
  REQUIRE_THROWS_WITH(embedding(zeros({65}), ids_tensor({0}, {1})), Catch::Contains("weight must be 2-d"));
}

// ---- cross_entropy ---------------------------------------------------------------------------

TEST_CASE("cross_entropy hand-computed 2x3 case", "[functional]") {
  Tensor logits = from<double>({1, 2, 3, 1, 0, -1}, {2, 3});
  logits.set_requires_grad(true);
  const Tensor targets = ids_tensor({2, 1}, {2});
  // row 0: -log softmax([1,2,3])[2] = log(1 + e^-1 + e^-2)       = 0.4076059644
  // row 1: log(e^1 + e^0 + e^-1) - 0 = 1 + log(1 + e^-1 + e^-2)  = 1.4076059644
  const Tensor loss = cross_entropy(logits, targets);
  CHECK(loss.dim() == 0);
  CHECK(loss.item() == Approx((0.4076059644 + 1.4076059644) / 2).epsilon(1e-9));
  backward(loss);
  // d loss / d logits = (softmax - onehot) / 2
  const std::vector<double> p = {0.0900306, 0.2447285, 0.6652410};  // softmax of both rows, reversed in row 1
  const std::vector<double> expected = {p[0] / 2, p[1] / 2, (p[2] - 1) / 2, p[2] / 2, (p[1] - 1) / 2, p[0] / 2};
  const auto g = values(logits.grad());
  for (int i = 0; i < 6; ++i) CHECK(g[i] == Approx(expected[i]).epsilon(1e-6));
}

TEST_CASE("cross_entropy skips ignore_index rows, all rows ignored gives loss 0, grad 0", "[functional]") {
  Tensor logits = leaf({5, 7}, 1);
  const Tensor targets = ids_tensor({3, -100, 6, -100, 0}, {5});
  const Tensor kept_rows = ids_tensor({0, 2, 4}, {3});
  // The mean runs over the 3 counted rows only.
  const Tensor expected = cross_entropy(embedding(logits.detach(), kept_rows), ids_tensor({3, 6, 0}, {3}));
  CHECK(cross_entropy(logits, targets).item() == Approx(expected.item()).epsilon(1e-12));
  backward(cross_entropy(logits, targets));
  const auto g = values(logits.grad());
  for (int c = 0; c < 7; ++c) {
    CHECK(g[1 * 7 + c] == 0.0);
    CHECK(g[3 * 7 + c] == 0.0);
  }
  // A custom ignore_index.
  CHECK(cross_entropy(logits, ids_tensor({3, 2, 6, 2, 0}, {5}), 2).item() == Approx(expected.item()).epsilon(1e-12));

  logits.set_grad({});
  const Tensor all_ignored = ids_tensor({-100, -100, -100, -100, -100}, {5});
  const Tensor loss = cross_entropy(logits, all_ignored);
  CHECK(loss.item() == 0.0);  // not NaN
  backward(loss);
  for (double v : values(logits.grad())) CHECK(v == 0.0);
  CHECK(reference::cross_entropy(logits, all_ignored).item() == 0.0);
}

TEST_CASE("gradcheck cross_entropy on odd, transposed and 3-D logits", "[functional][gradcheck]") {
  const Tensor t5 = ids_tensor({3, -100, 6, 0, 2}, {5});
  Fn fn5 = [t5](const std::vector<Tensor>& v) { return cross_entropy(v[0], t5); };
  REQUIRE_GRADCHECK("cross_entropy", fn5, {leaf({5, 7}, 1)});
  REQUIRE_GRADCHECK("cross_entropy", fn5, {transposed_leaf({5, 7}, 2)});
  const Tensor t11 = ids_tensor({0, 12, 5, 5, 7, 1, 2, 3, 11, 10, 4}, {11});
  Fn fn11 = [t11](const std::vector<Tensor>& v) { return cross_entropy(v[0], t11); };
  REQUIRE_GRADCHECK("cross_entropy", fn11, {leaf({11, 13}, 3)});
  // (B, T, V) logits with (B, T) targets, as a language model's.
  const Tensor t35 = ids_tensor({0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, -100, 5, 6, 0}, {3, 5});
  Fn fn3d = [t35](const std::vector<Tensor>& v) { return cross_entropy(v[0], t35); };
  REQUIRE_GRADCHECK("cross_entropy 3-d", fn3d, {leaf({3, 5, 7}, 4)});
  REQUIRE_GRADCHECK("cross_entropy 3-d", fn3d, {transposed_leaf({3, 5, 7}, 5)});
}

TEST_CASE("cross_entropy errors: bad targets and shapes", "[functional][errors]") {
  const Tensor logits = zeros({4, 65});
  REQUIRE_THROWS_WITH(cross_entropy(logits, ids_tensor({0, 1, 64, 70}, {4})),
                      Catch::Equals("[cross_entropy] target 70 out of range for 65 classes at position 3"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, ids_tensor({0, -1, 0, 0}, {4})),
                      Catch::Contains("target -1 out of range for 65 classes at position 1"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, ids_tensor({0, 1, 2}, {3})),
                      Catch::Contains("[cross_entropy] targets are [3], expected [4]"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, zeros({4})), Catch::Contains("targets must be int64"));
}

// ---- linear_cross_entropy: the classifier and its loss a chunk of rows at a time -------------------

TEST_CASE("linear_cross_entropy equals cross_entropy of linear, for every chunk size, ignored rows and padded classes",
          "[functional]") {
  const Tensor targets = ids_tensor({3, -100, 6, 0, 2, 5, -100, 1, 4, 6, 0}, {11});
  for (const std::int64_t classes : {7, 9 - 2}) {
    for (const std::int64_t chunk : {1, 2, 3, 4, 10, 11, 64, 0}) {
      INFO("classes " << classes << ", chunk " << chunk);
      // The weight has 9 rows, of which the first `classes` are classes (the rest a padded vocabulary's).
      const Fn fused = [&](const std::vector<Tensor>& v) {
        return linear_cross_entropy(v[0], v[1], targets, -100, classes, chunk);
      };
      const Fn composed = [&](const std::vector<Tensor>& v) {
        return cross_entropy(linear(v[0], narrow(v[1], 0, 0, classes)), targets);
      };
      require_same("linear_cross_entropy", fused, composed, {leaf({11, 5}, 1), leaf({9, 5}, 2)});
      require_same("linear_cross_entropy float32", fused, composed,
                   {leaf_as({11, 5}, DType::f32, 1), leaf_as({9, 5}, DType::f32, 2)});
    }
  }
  // The padded rows get a zero gradient, not none.
  Tensor weight = leaf({9, 5}, 2);
  backward(linear_cross_entropy(leaf({11, 5}, 1), weight, targets, -100, 7, 3));
  const auto g = values(weight.grad());
  for (std::size_t i = 7 * 5; i < g.size(); ++i) CHECK(g[i] == 0.0);
  // Every row ignored: loss 0, not NaN, and zero gradients.
  Tensor x = leaf({4, 5}, 3);
  const Tensor loss = linear_cross_entropy(x, leaf({9, 5}, 4), ids_tensor({-100, -100, -100, -100}, {4}), -100, 0, 3);
  CHECK(loss.item() == 0.0);
  backward(loss);
  for (double v : values(x.grad())) CHECK(v == 0.0);
}

TEST_CASE("cross_entropy's backward written over the logits gives the bits of the one that allocates", "[functional]") {
  const Tensor targets = ids_tensor({3, -100, 6, 0, 2}, {5});
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    INFO(dtype_name(dtype));
    Generator gen(8);
    const Tensor logits = kernels::cast(randn({5, 7}, {DType::f32}, gen), dtype);
    const kernels::CrossEntropyResult r = kernels::cross_entropy_forward(logits, targets, -100);
    const Tensor want = kernels::cross_entropy_backward(logits, targets, r.lse, -100, r.count, 0.5);
    const Tensor over = kernels::clone(logits);
    kernels::cross_entropy_backward_(over, targets, r.lse, -100, r.count, 0.5);
    CHECK(max_abs_diff(over, want) == 0);
  }
  const Tensor strided = transpose(zeros({7, 5}), 0, 1);
  CHECK_THROWS_WITH(kernels::cross_entropy_backward_(strided, targets, zeros({5}), -100, 4, 1.0),
                    Catch::Contains("[cross_entropy backward] the logits it overwrites must be contiguous"));
}

TEST_CASE("linear_cross_entropy in one chunk gives cross_entropy of linear bit for bit", "[functional]") {
  const Tensor targets = ids_tensor({3, 0, 6, 1, 2, 5}, {2, 3});
  Tensor xa = leaf_as({2, 3, 8}, DType::f32, 1), wa = leaf_as({7, 8}, DType::f32, 2);
  Tensor xb = leaf_as({2, 3, 8}, DType::f32, 1), wb = leaf_as({7, 8}, DType::f32, 2);
  const Tensor fused = linear_cross_entropy(xa, wa, targets);
  const Tensor composed = cross_entropy(linear(xb, wb), targets);
  CHECK(fused.item() == composed.item());
  backward(fused);
  backward(composed);
  CHECK(values(xa.grad()) == values(xb.grad()));
  CHECK(values(wa.grad()) == values(wb.grad()));
}

TEST_CASE("gradcheck linear_cross_entropy over chunks, on transposed and 3-D inputs", "[functional][gradcheck]") {
  const Tensor t11 = ids_tensor({3, -100, 6, 0, 2, 5, -100, 1, 4, 6, 0}, {11});
  Fn fn = [t11](const std::vector<Tensor>& v) { return linear_cross_entropy(v[0], v[1], t11, -100, 7, 4); };
  REQUIRE_GRADCHECK("linear_cross_entropy", fn, {leaf({11, 5}, 1), leaf({9, 5}, 2)});
  REQUIRE_GRADCHECK("linear_cross_entropy", fn, {transposed_leaf({11, 5}, 3), transposed_leaf({9, 5}, 4)});
  const Tensor t3 = ids_tensor({0, 1, 2, 3, 4, 5, -100, 0}, {2, 4});
  Fn fn3 = [t3](const std::vector<Tensor>& v) { return linear_cross_entropy(v[0], v[1], t3, -100, 0, 3); };
  REQUIRE_GRADCHECK("linear_cross_entropy 3-d", fn3, {leaf({2, 4, 6}, 5), leaf({6, 6}, 6)});
}

TEST_CASE("linear_cross_entropy errors name the op and the shapes", "[functional][errors]") {
  const Tensor x = zeros({4, 5}), w = zeros({7, 5});
  REQUIRE_THROWS_WITH(linear_cross_entropy(x, zeros({7, 6}), ids_tensor({0, 1, 2, 3}, {4})),
                      Catch::Contains("[linear_cross_entropy] input [4,5] does not match weight [7,6]"));
  REQUIRE_THROWS_WITH(linear_cross_entropy(x, w, ids_tensor({0, 1, 2}, {3})),
                      Catch::Contains("[linear_cross_entropy] targets are [3], expected [4]"));
  REQUIRE_THROWS_WITH(linear_cross_entropy(x, w, ids_tensor({0, 1, 2, 3}, {4}), -100, 8),
                      Catch::Contains("classes 8 is not in [1, the weight's 7 rows]"));
  REQUIRE_THROWS_WITH(linear_cross_entropy(x, w, ids_tensor({0, 1, 2, 6}, {4}), -100, 6, 2),
                      Catch::Contains("[cross_entropy] target 6 out of range for 6 classes"));
}

// ---- dropout ------------------------------------------------------------------------------------

TEST_CASE("gelu's output is made again for a product's backward: the same gradients, one activation fewer held",
          "[functional]") {
  // An MLP composed of ops: under autocast the first product's bfloat16 output is gelu's input.
  for (const DType autocast : {DType::f32, DType::bf16}) {
    INFO("autocast " << dtype_name(autocast));
    const auto run = [&](bool remade, std::size_t& held) {
      Generator gen(13);
      Tensor x = randn({64, 96}, {}, gen).set_requires_grad(true);
      Tensor w1 = randn({128, 96}, {}, gen).set_requires_grad(true), w2 = randn({32, 128}, {}, gen).set_requires_grad(true);
      const std::size_t before = cpu_alloc_stats().bytes_in_use;
      Tensor loss;
      {
        const AutocastGuard guard(autocast);
        const Tensor h = linear(x, w1);
        const Tensor a = remade ? gelu(h) : gelu(h) * 1.0;  // a new storage, with no recipe
        loss = sum(linear(a, w2));
      }
      held = cpu_alloc_stats().bytes_in_use - before;
      backward(loss);
      return std::vector<std::vector<float>>{x.grad().to_vector<float>(), w1.grad().to_vector<float>(),
                                             w2.grad().to_vector<float>()};
    };
    std::size_t kept = 0, remade = 0;
    const auto want = run(false, kept);
    CHECK(run(true, remade) == want);
    CHECK(kept - remade == 64 * 128 * (autocast == DType::bf16 ? 2 : 4));
  }
}

TEST_CASE("dropout makes its mask again for the backward: the same gradient, only its output held", "[functional]") {
  Generator gen(12), drop(99);
  Tensor x = randn({64, 256}, {}, gen).set_requires_grad(true);
  const std::uint64_t offset = drop.offset();
  const std::size_t before = cpu_alloc_stats().bytes_in_use;
  const Tensor y = dropout(x, 0.25, true, drop);
  CHECK(cpu_alloc_stats().bytes_in_use - before == 64 * 256 * sizeof(float));  // y alone, while its graph lives
  backward(sum(y));
  CHECK(max_abs_diff(x.grad(), kernels::dropout_mask({64, 256}, 0.25, drop.seed(), offset, {})) == 0);
}

TEST_CASE("dropout: eval mode and p = 0 are the identity, bad p is an error", "[functional]") {
  Tensor x = leaf({5, 7}, 1);
  CHECK(dropout(x, 0.5, /*training=*/false).same(x));
  CHECK(dropout(x, 0.0, /*training=*/true).same(x));
  for (double p : {1.0, -0.1, 1.5, std::nan("")})
    REQUIRE_THROWS_WITH(dropout(x, p, true), Catch::Contains("[dropout] p must be in [0, 1)"));
  REQUIRE_THROWS_WITH(dropout(x, 1.0, false), Catch::Contains("[dropout]"));  // checked in eval mode too
}

TEST_CASE("dropout mask follows the shared Philox convention, with the right statistics", "[functional]") {
  for (const double p : {0.1, 0.5, 0.9}) {
    const std::uint64_t seed = 42, offset = 7;
    const Tensor mask = kernels::dropout_mask({100000}, p, seed, offset, {DType::f32});
    const auto m = mask.to_vector<float>();
    const auto keep = static_cast<float>(1.0 / (1.0 - p));
    std::int64_t dropped = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      // The convention the fused attention and the CUDA kernels share.
      const bool drop = philox_uniform(seed, offset, i) < static_cast<float>(p);
      REQUIRE(m[i] == (drop ? 0.0f : keep));
      dropped += m[i] == 0.0f;
    }
    const double fraction = static_cast<double>(dropped) / m.size();
    INFO("p " << p << " dropped " << fraction);
    CHECK(std::abs(fraction - p) < 0.01);  // 100k draws: standard error <= 0.0016
    // The mean of x * mask stays the mean of x: inverted dropout keeps the scale.
    CHECK(std::abs(kernels::sum(mask, {}, false).item() / m.size() - 1.0) < 0.05);
  }
  // The comparison is made in float32: a p just above a draw u rounds to u
  // itself, and u < float(p) is false, so that element is kept (the fused
  // attention and CUDA kernels compare the same way).
  const float u0 = philox_uniform(9, 0, 0);
  const double p_above = std::nextafter(static_cast<double>(u0), 1.0);
  REQUIRE(static_cast<float>(p_above) == u0);
  CHECK(kernels::dropout_mask({1}, p_above, 9, 0, {DType::f32}).item() != 0.0);
  CHECK(kernels::dropout_mask({1}, std::nextafter(u0, 1.0f), 9, 0, {DType::f32}).item() == 0.0);
  // float64 masks are the same draws.
  const auto m64 = kernels::dropout_mask({13}, 0.3, 5, 0, {DType::f64}).to_vector<double>();
  const auto m32 = kernels::dropout_mask({13}, 0.3, 5, 0, {DType::f32}).to_vector<float>();
  for (int i = 0; i < 13; ++i) CHECK((m64[i] == 0) == (m32[i] == 0));
  // bfloat16 masks, drawn directly: the float32 mask's bits rounded, 1 / (1 - p) too.
  for (double p : {0.1, 0.3}) {
    const Tensor m16 = kernels::dropout_mask({1000}, p, 5, 7, {DType::bf16});
    REQUIRE(m16.dtype() == DType::bf16);
    CHECK(m16.to_vector<double>() ==
          kernels::cast(kernels::dropout_mask({1000}, p, 5, 7, {DType::f32}), DType::bf16).to_vector<double>());
  }
}

TEST_CASE("dropout draws a fresh mask per call and scales what it keeps", "[functional]") {
  Generator gen(3);
  const Tensor x = ones({1000});
  const Tensor a = dropout(x, 0.25, true, gen), b = dropout(x, 0.25, true, gen);
  CHECK(max_abs_diff(a, b) > 0);  // the generator's offset moved on
  for (double v : values(a)) CHECK((v == 0.0 || v == Approx(1 / 0.75)));
  Generator same(3);
  CHECK(max_abs_diff(dropout(x, 0.25, true, same), a) == 0);  // same seed and offset, same mask
}

TEST_CASE("gradcheck dropout with a fixed seed", "[functional][gradcheck]") {
  // gradcheck calls fn many times; re-seeding inside makes every call draw the same mask.
  Fn fn = [](const std::vector<Tensor>& v) {
    Generator gen(17);
    return dropout(v[0], 0.3, true, gen);
  };
  REQUIRE_GRADCHECK("dropout", fn, {leaf({5, 7}, 1)});
  REQUIRE_GRADCHECK("dropout", fn, {transposed_leaf({11, 13}, 2)});
  // The gradient is the mask: zero exactly where the output was dropped.
  Tensor x = leaf({5, 7}, 3);
  const Tensor y = fn({x});
  backward(sum(y));
  const auto yv = values(y), g = values(x.grad());
  for (std::size_t i = 0; i < g.size(); ++i) CHECK((yv[i] == 0.0) == (g[i] == 0.0));
}

// ---- cat / split -----------------------------------------------------------------------------------

TEST_CASE("cat and split round trip", "[functional]") {
  const Tensor x = arange(0, 35, 1, {DType::f64});
  const Tensor m = reshape(x, {5, 7});
  for (std::int64_t dim : {0, 1, -1}) {
    const std::vector<Tensor> pieces = split(m, 3, dim);
    const std::int64_t n = m.size(dim);
    REQUIRE(pieces.size() == static_cast<std::size_t>((n + 2) / 3));
    CHECK(pieces.back().size(dim) == n - 3 * (static_cast<std::int64_t>(pieces.size()) - 1));
    CHECK(pieces[0].storage() == m.storage());  // views, not copies
    CHECK(max_abs_diff(cat(pieces, dim), m) == 0);
  }
  CHECK(values(cat({from({1, 2}, {1, 2}), from({3, 4, 5}, {1, 3})}, 1)) == std::vector<double>{1, 2, 3, 4, 5});
  // A transposed (non-contiguous) piece is read by its strides.
  const Tensor t = transpose(from({1, 2, 3, 4, 5, 6}, {3, 2}), 0, 1);  // [[1,3,5],[2,4,6]]
  CHECK(values(cat({t, from({7, 8, 9}, {1, 3})}, 0)) == std::vector<double>{1, 3, 5, 2, 4, 6, 7, 8, 9});
  // int64 tensors concatenate too (no gradient).
  CHECK(cat({ids_tensor({1}, {1}), ids_tensor({2, 3}, {2})}, 0).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{1, 2, 3});
}

TEST_CASE("gradcheck cat and split", "[functional][gradcheck]") {
  Fn cat0 = [](const std::vector<Tensor>& v) { return cat(v, 0); };
  REQUIRE_GRADCHECK("cat dim 0", cat0, {leaf({5, 7}, 1), leaf({1, 7}, 2), transposed_leaf({3, 7}, 3)});
  Fn cat_last = [](const std::vector<Tensor>& v) { return cat({v[0], v[1]}, -1); };
  REQUIRE_GRADCHECK("cat dim -1", cat_last, {leaf({3, 5, 7}, 4), leaf({3, 5, 2}, 5)});
  // Every piece of a split used differently, then joined back.
  Fn split_fn = [](const std::vector<Tensor>& v) {
    std::vector<Tensor> pieces = split(v[0], 4, 1);
    for (std::size_t i = 0; i < pieces.size(); ++i) pieces[i] = pieces[i] * static_cast<double>(i + 1);
    return cat(pieces, 1);
  };
  REQUIRE_GRADCHECK("split", split_fn, {leaf({5, 13}, 6)});
  REQUIRE_GRADCHECK("split", split_fn, {transposed_leaf({5, 11}, 7)});
}

TEST_CASE("cat errors: empty list, mismatched dims and dtypes", "[functional][errors]") {
  REQUIRE_THROWS_WITH(cat({}, 0), Catch::Contains("[cat] needs at least one tensor"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 4})}, 0),
                      Catch::Contains("[cat] tensor 1 is [2,4], but tensor 0 is [2,3]"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3, 1})}, 0), Catch::Contains("[cat] tensor 1 is [2,3,1]"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3}, {DType::f64})}, 0),
                      Catch::Contains("[cat] tensor 1 is float64, but tensor 0 is float32"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3})}, 2), Catch::Contains("[cat] dim 2 out of range"));
  REQUIRE_THROWS_WITH(split(zeros({2, 3}), 0, 0), Catch::Contains("[split] split_size must be >= 1"));
}

// ---- fused against composed ------------------------------------------------------------------------

TEST_CASE("fused ops match their composed references, forward and backward", "[functional][reference]") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    SECTION(std::string(dtype_name(dtype))) {
      const Tensor x = leaf_as({11, 13}, dtype, 1), x3 = leaf_as({3, 5, 7}, dtype, 2);
      for (std::int64_t dim : {-1, 0}) {
        require_same(
            "softmax", [dim](const std::vector<Tensor>& v) { return softmax(v[0], dim); },
            [dim](const std::vector<Tensor>& v) { return reference::softmax(v[0], dim); }, {x});
        require_same(
            "log_softmax", [dim](const std::vector<Tensor>& v) { return log_softmax(v[0], dim); },
            [dim](const std::vector<Tensor>& v) { return reference::log_softmax(v[0], dim); }, {x3});
      }
      const Tensor w = leaf_as({7}, dtype, 3), b = leaf_as({7}, dtype, 4);
      require_same(
          "layer_norm", [](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); },
          [](const std::vector<Tensor>& v) { return reference::layer_norm(v[0], v[1], v[2]); }, {x3, w, b});
      require_same(
          "layer_norm (no affine)", [](const std::vector<Tensor>& v) { return layer_norm(v[0], {}, {}); },
          [](const std::vector<Tensor>& v) { return reference::layer_norm(v[0], {}, {}); }, {x3});
      const Tensor targets = ids_tensor({0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, -100, 5, 6, 0}, {3, 5});
      require_same(
          "cross_entropy", [&](const std::vector<Tensor>& v) { return cross_entropy(v[0], targets); },
          [&](const std::vector<Tensor>& v) { return reference::cross_entropy(v[0], targets); }, {x3});
      require_same(
          "gelu", [](const std::vector<Tensor>& v) { return gelu(v[0]); },
          [](const std::vector<Tensor>& v) { return reference::gelu(v[0]); }, {x});
    }
  }
}

TEST_CASE("reference ops pass gradcheck themselves", "[functional][reference][gradcheck]") {
  Fn sm = [](const std::vector<Tensor>& v) { return reference::softmax(v[0], 1); };
  REQUIRE_GRADCHECK("reference::softmax", sm, {leaf({5, 7}, 1)});
  Fn ln = [](const std::vector<Tensor>& v) { return reference::layer_norm(v[0], v[1], v[2]); };
  REQUIRE_GRADCHECK("reference::layer_norm", ln, {leaf({5, 7}, 2), leaf({7}, 3), leaf({7}, 4)});
  const Tensor t = ids_tensor({3, -100, 6, 0, 2}, {5});
  Fn ce = [t](const std::vector<Tensor>& v) { return reference::cross_entropy(v[0], t); };
  REQUIRE_GRADCHECK("reference::cross_entropy", ce, {leaf({5, 7}, 5)});
  Fn ge = [](const std::vector<Tensor>& v) { return reference::gelu(v[0]); };
  REQUIRE_GRADCHECK("reference::gelu", ge, {leaf({5, 7}, 6)});
}

// ---- the threaded paths ------------------------------------------------------------------------------

TEST_CASE("row ops on shapes large enough to run threaded match the references", "[functional]") {
  // 96 x 1000 elements: above kParallelGrain, so rows are split across threads.
  const Tensor x = leaf({96, 1000}, 7);
  CHECK(max_abs_diff(softmax(x, -1), reference::softmax(x, -1)) < 1e-14);
  CHECK(max_abs_diff(log_softmax(x, -1), reference::log_softmax(x, -1)) < 1e-12);
  const Tensor w = leaf({1000}, 8), b = leaf({1000}, 9);
  CHECK(max_abs_diff(layer_norm(x, w, b), reference::layer_norm(x, w, b)) < 1e-12);
  std::vector<std::int64_t> t(96);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int64_t>(i * 37 % 1000);
  const Tensor targets = ids_tensor(t, {96});
  CHECK(cross_entropy(x, targets).item() == Approx(reference::cross_entropy(x, targets).item()).epsilon(1e-12));
}

TEST_CASE("layer_norm and embedding backward give the same bits on 1 and 2 threads", "[functional]") {
  const Tensor x = leaf_as({256, 384}, DType::f32, 1);
  const Tensor w = leaf_as({384}, DType::f32, 2), b = leaf_as({384}, DType::f32, 3);
  const Tensor table = leaf_as({50, 384}, DType::f32, 4);
  std::vector<std::int64_t> id(512);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::int64_t>(i * i % 50);
  const Tensor ids = ids_tensor(id, {512});
  Fn ln = [](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); };
  Fn emb = [ids](const std::vector<Tensor>& v) { return embedding(v[0], ids); };

  const int threads = get_num_threads();
  set_num_threads(1);
  const Evaluated ln1 = evaluate(ln, {x, w, b}), emb1 = evaluate(emb, {table});
  set_num_threads(2);
  const Evaluated ln2 = evaluate(ln, {x, w, b}), emb2 = evaluate(emb, {table});
  set_num_threads(threads);
  CHECK(max_abs_diff(ln1.y, ln2.y) == 0);
  for (int i = 0; i < 3; ++i) CHECK(max_abs_diff(ln1.grads[i], ln2.grads[i]) == 0);
  CHECK(max_abs_diff(emb1.grads[0], emb2.grads[0]) == 0);
}
