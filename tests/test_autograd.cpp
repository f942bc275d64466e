// The engine: accumulation, reuse, retain_graph, freed graphs, version
// counters, gradient checks, grad mode, deep chains.
#include <map>
#include <set>
#include <string>

#include "autograd/node.h"
#include "helpers.h"

using namespace attograd;
using namespace attograd::test;

TEST_CASE("backward on a scalar fills leaf grads, they accumulate until zeroed", "[autograd]") {
  Tensor x = from<double>({1, 2, 3}, {3});
  x.set_requires_grad(true);
  Tensor y = sum(x * x);
  backward(y);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 4, 6});
  backward(sum(x * 3.0));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{5, 7, 9});
  x.set_grad({});
  backward(sum(x));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1, 1});
}

TEST_CASE("a tensor used twice receives both contributions", "[autograd]") {
  Tensor x = from<double>({2}, {1});
  x.set_requires_grad(true);
  Tensor a = x * 3.0;
  Tensor y = a * a + a;  // y = 9x^2 + 3x -> dy/dx = 18x + 3 = 39
  backward(sum(y));
  CHECK(x.grad().item() == Approx(39));
}

// The engine keeps a leaf's first gradient without a copy when nothing else
// can reach its memory (accumulate_into_leaf); here every way something else can.
TEST_CASE("a leaf's .grad never shares memory with another tensor", "[autograd]") {
  auto shares = [](const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); };
  Tensor a = from<double>({1, 2, 3}, {3}), b = from<double>({4, 5, 6}, {3});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor dy = from<double>({1, 10, 100}, {3});
  backward(a + b, dy);  // add's backward hands the caller's dy to both inputs
  CHECK_FALSE(shares(a.grad(), b.grad()));
  CHECK_FALSE(shares(a.grad(), dy));
  CHECK_FALSE(shares(b.grad(), dy));
  kernels::fill_(a.grad(), 0.0);
  CHECK(b.grad().to_vector<double>() == std::vector<double>{1, 10, 100});
  CHECK(dy.to_vector<double>() == std::vector<double>{1, 10, 100});

  // A leaf as the root: its gradient is the caller's tensor.
  Tensor x = from<double>({1, 2}, {2});
  x.set_requires_grad(true);
  const Tensor g = from<double>({3, 4}, {2});
  backward(x, g);
  CHECK_FALSE(shares(x.grad(), g));

  // A gradient computed for this leaf alone (mul's g * 3) may be kept as it is;
  // later gradients still add into it, not into whatever made it.
  Tensor w = from<double>({1, 2}, {2});
  w.set_requires_grad(true);
  const Tensor out = w * 3.0;
  backward(out, g);
  CHECK(w.grad().to_vector<double>() == std::vector<double>{9, 12});
  CHECK_FALSE(shares(w.grad(), g));
  CHECK_FALSE(shares(w.grad(), out));
  backward(w * 2.0, g);
  CHECK(w.grad().to_vector<double>() == std::vector<double>{15, 20});
  CHECK(g.to_vector<double>() == std::vector<double>{3, 4});
}

TEST_CASE("backward with an explicit gradient, non-scalar needs one", "[autograd][errors]") {
  Tensor x = leaf({2, 3});
  Tensor y = x * 2.0;
  REQUIRE_THROWS_WITH(backward(y), Catch::Contains("one-element"));
  backward(y, ones({2, 3}, {DType::f64}), {.retain_graph = true});
  CHECK(x.grad().to_vector<double>() == std::vector<double>(6, 2.0));
  REQUIRE_THROWS_WITH(backward(y, ones({3, 2}, {DType::f64})), Catch::Contains("gradient is [3,2]"));
  REQUIRE_THROWS_WITH(backward(zeros({1})), Catch::Contains("does not require grad"));
}

TEST_CASE("requires_grad propagates, detach and NoGradGuard stop it", "[autograd]") {
  Tensor x = leaf({3}), c = ones({3}, {DType::f64});
  CHECK((x + c).requires_grad());
  CHECK_FALSE((x + c).is_leaf());
  CHECK_FALSE((c * 2.0).requires_grad());
  CHECK_FALSE(x.detach().requires_grad());
  CHECK(x.detach().storage() == x.storage());
  {
    NoGradGuard guard;
    CHECK_FALSE((x * 2.0).requires_grad());
  }
  CHECK((x * 2.0).requires_grad());
  REQUIRE_THROWS_WITH(zeros({2}, {DType::i64}).set_requires_grad(true), Catch::Contains("floating"));
  Tensor y = x * 2.0;
  REQUIRE_THROWS_WITH(y.set_requires_grad(false), Catch::Contains("leaf"));
}

TEST_CASE("the graph is freed after backward, a second backward is a clear error", "[autograd][errors]") {
  Tensor x = leaf({3});
  Tensor y = sum(exp(x));
  backward(y);
  REQUIRE_THROWS_WITH(backward(y), Catch::Contains("second time") && Catch::Contains("retain_graph"));
  x.set_grad({});
  Tensor z = sum(exp(x));
  backward(z, {}, {.retain_graph = true});
  const auto first = x.grad().to_vector<double>();
  backward(z);  // retained: works, and accumulates
  const auto second = x.grad().to_vector<double>();
  for (std::size_t i = 0; i < first.size(); ++i) CHECK(second[i] == Approx(2 * first[i]).epsilon(1e-12));
}

TEST_CASE("modifying a saved tensor in place is reported at backward, naming the op", "[autograd][errors]") {
  Tensor x = leaf({4});
  Tensor e = exp(x);           // saves its output
  Tensor y = sum(e * 2.0);
  kernels::fill_(e, 0.0);      // in-place write after it was saved
  REQUIRE_THROWS_WITH(backward(y), Catch::Contains("[exp backward]") && Catch::Contains("modified in place"));
  // Through a view of the same storage, too.
  Tensor a = leaf({2, 3}), b = leaf({3, 2});
  Tensor m = matmul(a, b);
  kernels::fill_(narrow(a.detach(), 0, 0, 1), 1.0);
  REQUIRE_THROWS_WITH(backward(sum(m)), Catch::Contains("[matmul backward]"));
}

TEST_CASE("a node returning a mis-shaped gradient is caught, naming the node", "[autograd][errors]") {
  Tensor x = leaf({4, 3});
  Tensor bad = record("bad_op", kernels::clone(x), {x}, {},
                      [](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                        return {zeros({3, 4}, g.options())};  // transposed by mistake
                      });
  REQUIRE_THROWS_WITH(backward(sum(bad)),
                      Catch::Contains("[bad_op backward] grad #0 is [3,4], expected [4,3]"));
}

TEST_CASE("gradcheck catches a wrong backward", "[autograd][gradcheck]") {
  auto wrong = [](const std::vector<Tensor>& v) {
    const Tensor& x = v[0];
    return record("wrong_square", kernels::binary(kernels::Binary::mul, x, x), {x}, {x},
                  [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                    return {g * s[0]};  // should be 2 * g * x
                  });
  };
  const GradcheckResult r = gradcheck("wrong_square", wrong, {leaf({5})});
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.message, Catch::Contains("wrong_square") && Catch::Contains("input #0") && Catch::Contains("analytic"));
}

TEST_CASE("a chain of 100,000 ops backpropagates and is destroyed without recursion", "[autograd]") {
  Tensor x = from<double>({1.0}, {1});
  x.set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0 + 0.0;
  backward(sum(y), {}, {.retain_graph = true});
  CHECK(x.grad().item() == 1.0);
  y = Tensor();  // drops the whole retained chain: must not overflow the stack
  Tensor z = x;
  for (int i = 0; i < 100000; ++i) z = z + 1.0;
  z = Tensor();  // never backpropagated, destroyed iteratively
  SUCCEED();
}

TEST_CASE("a leaf that is a non-contiguous view gets a gradient of its own shape", "[autograd]") {
  Tensor t = transposed_leaf({3, 5});
  backward(sum(t * t));
  CHECK(t.grad().sizes() == Shape{3, 5});
  CHECK(max_abs_diff(t.grad(), kernels::binary(kernels::Binary::mul, t.detach(), full({}, 2.0, {DType::f64}))) == 0);
}

TEST_CASE("on_leaf_grad_ready: once per reached leaf, when its gradient is final, before backward ends", "[autograd]") {
  // w1 feeds the first layer only; w2 is used twice (near the output and, through a
  // long detour, near the input), so its gradient is final only after the detour ran.
  Tensor x = leaf({3, 4}, 1), w1 = leaf({4, 4}, 2), w2 = leaf({4, 4}, 3), unused = leaf({2}, 4);
  Tensor h = tanh(matmul(x, w1));
  Tensor detour = matmul(h, w2);
  for (int i = 0; i < 5; ++i) detour = tanh(detour);
  Tensor y = sum(matmul(detour + h, w2));

  // The reference: the final gradients of a plain backward.
  backward(y, {}, {.retain_graph = true});
  const Tensor want_x = clone(x.grad()), want_w1 = clone(w1.grad()), want_w2 = clone(w2.grad());
  for (Tensor* t : {&x, &w1, &w2}) t->set_grad({});

  std::vector<std::string> order;
  std::map<std::string, double> diff_when_ready;
  const std::map<const TensorImpl*, std::pair<std::string, Tensor>> names{
      {x.impl(), {"x", want_x}}, {w1.impl(), {"w1", want_w1}}, {w2.impl(), {"w2", want_w2}},
      {unused.impl(), {"unused", Tensor()}}};
  backward(y, {}, {.on_leaf_grad_ready = [&](const Tensor& leaf) {
                     const auto& [name, want] = names.at(leaf.impl());
                     order.push_back(name);
                     diff_when_ready[name] = max_abs_diff(leaf.grad(), want);
                   }});
  CHECK(order.size() == 3);  // each reached leaf once; `unused` never
  CHECK(std::set<std::string>(order.begin(), order.end()) == std::set<std::string>{"x", "w1", "w2"});
  for (const auto& [name, diff] : diff_when_ready) CHECK(diff == 0);  // already the final gradient
  CHECK(order.back() != "w2");  // not merely called at the end: x and w1 finish after w2

  // A leaf that is the root itself.
  Tensor s = leaf({1}, 5);
  int calls = 0;
  backward(s, {}, {.on_leaf_grad_ready = [&](const Tensor& leaf) { calls += leaf.same(s); }});
  CHECK(calls == 1);
}
