// The GPT model: shapes and errors, GPT-2 init, weight tying, the loss with
// ignore_index, KV-cached decoding equal to full forwards, a float64
// gradcheck of one block, and overfitting one batch with AdamW.
#include <cmath>

#include "helpers.h"
#include "nn/gpt.h"
#include "train/optim/optimizer.h"

using namespace attograd;
using namespace attograd::test;
using nn::GPT;
using nn::GPTConfig;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

GPTConfig small_config() {
  return {.vocab_size = 13, .block_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 16, .seed = 3};
}

Tensor random_tokens(const Shape& sizes, std::int64_t vocab, std::uint64_t seed) {
  Generator gen(seed);
  const auto u = rand(sizes, {DType::f64}, gen).to_vector<double>();
  std::vector<std::int64_t> ids;
  for (double x : u) ids.push_back(static_cast<std::int64_t>(x * static_cast<double>(vocab)));
  return from_vector(ids, sizes);
}

double std_of(const Tensor& t) {
  const auto v = t.to_vector<double>();
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size()));
}

}  // namespace

TEST_CASE("gpt: forward gives (B, T, vocab) logits, longer than the block size is an error", "[gpt]") {
  GPT model(small_config());
  CHECK(model(random_tokens({3, 12}, 13, 1)).sizes() == Shape{3, 12, 13});
  CHECK(model(random_tokens({1, 1}, 13, 1)).sizes() == Shape{1, 1, 13});
  REQUIRE_THROWS_WITH(model(random_tokens({1, 13}, 13, 1)),
                      Catch::Contains("[GPT]") && Catch::Contains("length 13 is longer than the block size 12"));
  REQUIRE_THROWS_WITH(model(zeros({1, 4})), Catch::Contains("int64"));
  REQUIRE_THROWS_WITH(model(from_vector<std::int64_t>({0, 13}, {1, 2})), Catch::Contains("13"));  // id out of vocab
}

TEST_CASE("gpt: GPT-2 initialisation, seeded", "[gpt]") {
  GPTConfig config{.vocab_size = 65, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128, .seed = 7};
  GPT model(config);
  CHECK(std_of(model.wte.weight) == Approx(0.02).epsilon(0.05));
  CHECK(std_of(model.blocks[0].attn.qkv.weight) == Approx(0.02).epsilon(0.05));
  CHECK(std_of(model.blocks[2].mlp.fc.weight) == Approx(0.02).epsilon(0.05));
  const double residual = 0.02 / std::sqrt(2.0 * 4);
  CHECK(std_of(model.blocks[1].attn.out_proj.weight) == Approx(residual).epsilon(0.05));
  CHECK(std_of(model.blocks[3].mlp.proj.weight) == Approx(residual).epsilon(0.05));
  for (double b : model.blocks[0].attn.qkv.bias.to_vector<double>()) CHECK(b == 0);
  for (double w : model.ln_f.weight.to_vector<double>()) CHECK(w == 1);
  GPT same(config);
  CHECK(max_abs_diff(same.blocks[2].mlp.fc.weight, model.blocks[2].mlp.fc.weight) == 0);
  config.seed = 8;
  GPT other(config);
  CHECK(max_abs_diff(other.blocks[2].mlp.fc.weight, model.blocks[2].mlp.fc.weight) > 1e-3);
}

TEST_CASE("gpt: the tied head reads the token embedding", "[gpt]") {
  GPTConfig config = small_config();
  GPT tied(config);
  config.tie_weights = false;
  GPT untied(config);
  CHECK(tied.lm_head == nullptr);
  REQUIRE(untied.lm_head != nullptr);
  nn::StateDict state = tied.state_dict();
  state["lm_head.weight"] = kernels::clone(state.at("wte.weight"));
  untied.load_state_dict(state);
  const Tensor tokens = random_tokens({2, 7}, 13, 2), targets = random_tokens({2, 7}, 13, 3);
  const Tensor tied_loss = tied.loss(tokens, targets), untied_loss = untied.loss(tokens, targets);
  CHECK(tied_loss.item() == Approx(untied_loss.item()).epsilon(1e-6));
  backward(tied_loss);
  backward(untied_loss);
  // One tensor used twice gets both gradients.
  const Tensor both = untied.wte.weight.grad() + untied.lm_head->weight.grad();
  CHECK(max_abs_diff(tied.wte.weight.grad(), both) < 1e-6);
}

TEST_CASE("gpt: loss is the mean cross-entropy over targets not ignored", "[gpt]") {
  GPT model(small_config());
  const Tensor tokens = random_tokens({2, 5}, 13, 4);
  std::vector<std::int64_t> targets = random_tokens({2, 5}, 13, 5).to_vector<std::int64_t>();
  targets[1] = targets[7] = -100;
  const Tensor loss = model.loss(tokens, from_vector(targets, {2, 5}));
  const auto logp = log_softmax(model(tokens), -1).to_vector<double>();  // (2, 5, 13)
  double expected = 0;
  int count = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == -100) continue;
    expected -= logp[i * 13 + targets[i]];
    ++count;
  }
  CHECK(loss.item() == Approx(expected / count).epsilon(1e-6));
}

TEST_CASE("gpt: KV-cached incremental logits equal the full-sequence logits", "[gpt]") {
  GPTConfig config = small_config();
  config.dropout = 0.1;  // eval mode must switch it off in both paths
  GPT model(config);
  model.eval();
  const Tensor tokens = random_tokens({2, 11}, 13, 6);
  const Tensor full = model(tokens);  // (2, 11, 13)
  nn::KVCache cache = model.make_cache();
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces = {{0, 4}, {4, 1}, {5, 1}, {6, 3}, {9, 2}};
  for (auto [start, n] : pieces) {
    const Tensor logits = model.forward(narrow(tokens, 1, start, n), cache);
    INFO("tokens " << start << " .. " << start + n);
    CHECK(cache.length() == start + n);
    CHECK(max_abs_diff(logits, narrow(full, 1, start, n)) < 1e-5);
    CHECK_FALSE(logits.requires_grad());
  }
  CHECK(cache.layers[1].keys().sizes() == Shape{2, 2, 11, 8});
  REQUIRE_THROWS_WITH(model.forward(narrow(tokens, 1, 0, 2), cache),
                      Catch::Contains("length 13 is longer than the block size 12") && Catch::Contains("cache"));
  cache.clear();
  CHECK(max_abs_diff(model.forward(narrow(tokens, 1, 0, 3), cache), narrow(full, 1, 0, 3)) < 1e-5);
}

TEST_CASE("gpt: gradcheck of one block over its input and every parameter", "[gpt][gradcheck]") {
  GPTConfig config{.vocab_size = 5, .block_size = 4, .n_layer = 2, .n_head = 2, .n_embd = 4, .dropout = 0.2};
  Generator init(1), dropout_gen(2);
  nn::Block block(config, init, &dropout_gen);
  block.to(DType::f64);
  {
    // Random LayerNorm parameters and biases, so their gradients are not special cases.
    NoGradGuard no_grad;
    Generator values(3);
    for (const Tensor& p : block.parameters()) kernels::copy_(p, normal(p.sizes(), 0.0, 0.5, p.options(), values));
  }
  std::vector<Tensor> inputs{leaf({2, 3, 4}, 4)};
  for (const Tensor& p : block.parameters()) inputs.push_back(p);
  SECTION("eval") {
    block.eval();
    REQUIRE_GRADCHECK("gpt block", Fn([&](const std::vector<Tensor>& x) { return block(x[0]); }), inputs);
  }
  SECTION("training, with dropout") {
    Fn fn = [&](const std::vector<Tensor>& x) {
      dropout_gen.set_state(2, 0);
      return block(x[0]);
    };
    REQUIRE_GRADCHECK("gpt block dropout", fn, inputs);
  }
}

TEST_CASE("gpt: overfits one small batch with AdamW", "[gpt]") {
  GPTConfig config{.vocab_size = 13, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .seed = 1};
  GPT model(config);
  train::optim::AdamW opt(model.named_parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  const Tensor tokens = random_tokens({4, 16}, 13, 7), targets = random_tokens({4, 16}, 13, 8);
  const double initial = model.loss(tokens, targets).item();
  CHECK(initial == Approx(std::log(13.0)).epsilon(0.1));  // near uniform at init
  double loss = initial;
  int steps = 0;
  for (; steps < 300 && loss > 0.02; ++steps) {
    opt.zero_grad();
    const Tensor l = model.loss(tokens, targets);
    loss = l.item();
    backward(l);
    opt.step();
  }
  INFO("loss " << loss << " after " << steps << " steps");
  CHECK(loss < 0.02);
}
