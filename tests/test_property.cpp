// Property test: for random valid shapes and random chains of ops, gradcheck
// passes. Seeded, with a fixed number of cases, so a failure reproduces.
#include <random>

#include "helpers.h"

using namespace attograd;
using namespace attograd::test;

namespace {

struct RandomOp {
  const char* name;
  std::function<Tensor(const Tensor&, std::mt19937&)> apply;
};

Shape random_shape(std::mt19937& rng) {
  std::uniform_int_distribution<int> rank(1, 3), size(1, 6);
  Shape s(rank(rng));
  for (auto& d : s) d = size(rng);
  return s;
}

std::int64_t random_dim(const Tensor& x, std::mt19937& rng) {
  return std::uniform_int_distribution<std::int64_t>(0, x.dim() - 1)(rng);
}

const std::vector<RandomOp>& random_ops() {
  static const std::vector<RandomOp> ops = {
      {"tanh", [](const Tensor& x, std::mt19937&) { return tanh(x); }},
      {"exp", [](const Tensor& x, std::mt19937&) { return exp(x * 0.5); }},
      {"gelu", [](const Tensor& x, std::mt19937&) { return gelu(x); }},
      {"square", [](const Tensor& x, std::mt19937&) { return x * x; }},
      {"softplus-ish", [](const Tensor& x, std::mt19937&) { return log(exp(x) + 1.0); }},
      {"transpose",
       [](const Tensor& x, std::mt19937& rng) { return transpose(x, random_dim(x, rng), random_dim(x, rng)); }},
      {"sum_dim", [](const Tensor& x, std::mt19937& rng) { return sum(x, {random_dim(x, rng)}, true); }},
      {"mean_dim", [](const Tensor& x, std::mt19937& rng) { return mean(x, {random_dim(x, rng)}, true); }},
      {"max_dim", [](const Tensor& x, std::mt19937& rng) { return max(x, random_dim(x, rng), true); }},
      {"add_broadcast",
       [](const Tensor& x, std::mt19937& rng) {
         Shape s = x.sizes();
         s[random_dim(x, rng)] = 1;
         Generator gen(rng());
         return x + randn(s, {DType::f64}, gen);
       }},
      {"mul_self_transposed",
       [](const Tensor& x, std::mt19937&) { return x.dim() >= 2 && x.size(-1) == x.size(-2) ? x * transpose(x, -1, -2) : x * 2.0; }},
      {"matmul_square",
       [](const Tensor& x, std::mt19937& rng) {
         Generator gen(rng());
         return matmul(x, randn({x.size(-1), 3}, {DType::f64}, gen));
       }},
      {"flatten_reshape", [](const Tensor& x, std::mt19937&) { return reshape(flatten(x), x.sizes()); }},
      {"narrow_first",
       [](const Tensor& x, std::mt19937& rng) {
         const std::int64_t d = random_dim(x, rng);
         return x.size(d) > 1 ? narrow(x, d, 1, x.size(d) - 1) : x;
       }},
  };
  return ops;
}

}  // namespace

TEST_CASE("random op chains pass gradcheck", "[property][gradcheck]") {
  std::mt19937 rng(20261122);
  for (int c = 0; c < 60; ++c) {
    const Shape shape = random_shape(rng);
    std::vector<int> chain(std::uniform_int_distribution<int>(1, 3)(rng));
    for (auto& op : chain) op = std::uniform_int_distribution<int>(0, static_cast<int>(random_ops().size()) - 1)(rng);
    const unsigned op_seed = rng();
    std::string name = "case " + std::to_string(c) + " " + shape_str(shape) + ":";
    for (int op : chain) name += std::string(" ") + random_ops()[op].name;
    INFO(name);
    // Each call of fn replays the same random choices (shapes, dims, constants).
    auto fn = [chain, op_seed](const std::vector<Tensor>& x) {
      std::mt19937 op_rng(op_seed);
      Tensor y = x[0];
      for (int op : chain) y = random_ops()[op].apply(y, op_rng);
      return y;
    };
    REQUIRE_GRADCHECK(name, fn, {leaf(shape, c + 1)});
  }
}
