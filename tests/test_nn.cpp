// Modules (names, state dicts, train/eval, zero_grad, to, parameter counts),
// the basic layers and the optimizers.
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "helpers.h"
#include "autograd/autocast.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "train/optim/optimizer.h"

using namespace attograd;
using namespace attograd::test;

namespace {

nn::GPTConfig tiny_config() {
  return {.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .seed = 5};
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) names.push_back(p.name);
  return names;
}

Tensor tokens_of(std::vector<std::int64_t> ids, Shape sizes) { return from_vector(ids, sizes); }

// A small module tree to test Module itself with.
class Pair : public nn::Module {
 public:
  explicit Pair(Generator& gen) : first(3, 4, gen), second(4, 2, gen, {.bias = false}) {
    register_module("first", first);
    register_module("second", second);
    scale = register_parameter("scale", ones({2}));
  }
  Tensor forward(const Tensor& x) const { return second(first(x)) * scale; }
  nn::Linear first, second;
  Tensor scale;
};

}  // namespace

// ---- Module ---------------------------------------------------------------------------------

TEST_CASE("nn: parameters carry hierarchical names in registration order", "[nn]") {
  Generator gen(1);
  Pair pair(gen);
  CHECK(names_of(pair) == std::vector<std::string>{"scale", "first.weight", "first.bias", "second.weight"});
  const nn::GPT gpt(tiny_config());
  const auto names = names_of(gpt);
  const std::vector<std::string> expected_start = {"wte.weight",
                                                   "wpe.weight",
                                                   "blocks.0.ln_1.weight",
                                                   "blocks.0.ln_1.bias",
                                                   "blocks.0.attn.qkv.weight",
                                                   "blocks.0.attn.qkv.bias",
                                                   "blocks.0.attn.out_proj.weight",
                                                   "blocks.0.attn.out_proj.bias",
                                                   "blocks.0.ln_2.weight",
                                                   "blocks.0.ln_2.bias",
                                                   "blocks.0.mlp.fc.weight",
                                                   "blocks.0.mlp.fc.bias",
                                                   "blocks.0.mlp.proj.weight",
                                                   "blocks.0.mlp.proj.bias",
                                                   "blocks.1.ln_1.weight"};
  REQUIRE(names.size() > expected_start.size());
  CHECK(std::vector<std::string>(names.begin(), names.begin() + expected_start.size()) == expected_start);
  CHECK(names.back() == "ln_f.bias");  // tied: no lm_head.weight
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
  for (const auto& p : gpt.named_parameters()) {
    CHECK(p.tensor.requires_grad());
    CHECK(p.tensor.is_leaf());
  }
  REQUIRE_THROWS_WITH(
      [] {
        class Bad : public nn::Module {
         public:
          Bad() { register_parameter("a.b", zeros({1})); }
        } bad;
      }(),
      Catch::Contains("invalid name 'a.b'"));
}

TEST_CASE("nn: weight decay is marked on Linear weights only", "[nn]") {
  const nn::GPT gpt(tiny_config());
  for (const auto& p : gpt.named_parameters()) {
    const bool linear_weight = p.name.find("qkv.weight") != std::string::npos ||
                               p.name.find("proj.weight") != std::string::npos ||
                               p.name.find("fc.weight") != std::string::npos;
    INFO(p.name);
    CHECK(p.decay == linear_weight);
  }
}

TEST_CASE("nn: parameter count of a known GPT config", "[nn]") {
  // vocab 65, block 128, 4 layers, 4 heads, 128 wide, biases:
  //   wte 65*128 = 8320, wpe 128*128 = 16384, ln_f 2*128 = 256;
  //   per block: ln_1 256 + qkv 3*128*128 + 384 = 49536 + out_proj 128*128 + 128 = 16512
  //              + ln_2 256 + fc 128*512 + 512 = 66048 + proj 512*128 + 128 = 65664  -> 198272
  //   total tied: 8320 + 16384 + 4*198272 + 256 = 818048; untied adds lm_head 65*128 = 8320.
  nn::GPTConfig config{.vocab_size = 65, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128};
  CHECK(nn::GPT(config).num_parameters() == 818048);
  config.tie_weights = false;
  CHECK(nn::GPT(config).num_parameters() == 818048 + 8320);
  // Without biases: per block ln_1 128 + qkv 384 + out_proj 128 + ln_2 128 + fc 512 + proj 128 = 1408 fewer; ln_f 128.
  config.bias = false;
  CHECK(nn::GPT(config).num_parameters() == 818048 + 8320 - 4 * 1408 - 128);
}

TEST_CASE("nn: state_dict round trip", "[nn]") {
  nn::GPTConfig a_config = tiny_config(), b_config = tiny_config();
  b_config.seed = 99;
  nn::GPT a(a_config), b(b_config);
  a.eval();
  b.eval();
  const Tensor tokens = tokens_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  REQUIRE(max_abs_diff(a(tokens), b(tokens)) > 1e-4);
  const nn::StateDict state = a.state_dict();
  CHECK(state.size() == a.named_parameters().size());
  b.load_state_dict(state);
  CHECK(max_abs_diff(a(tokens), b(tokens)) == 0);
  // Loading copies: b's parameters are still its own storage.
  CHECK(b.wte.weight.storage() != a.wte.weight.storage());
  // state_dict() entries alias the parameters (a clone snapshots).
  const Tensor snapshot = kernels::clone(a.state_dict().at("ln_f.weight"));
  {
    NoGradGuard no_grad;
    kernels::fill_(a.ln_f.weight, 3.0);
  }
  CHECK(a.state_dict().at("ln_f.weight").at({0}) == 3.0);
  CHECK(snapshot.at({0}) == 1.0);
}

TEST_CASE("nn: load_state_dict names every missing, unexpected and mis-shaped entry", "[nn]") {
  nn::GPT model(tiny_config());
  const Tensor before = kernels::clone(model.wte.weight);
  nn::StateDict state = model.state_dict();
  state.erase("blocks.1.mlp.fc.bias");
  state.erase("wpe.weight");
  state["blocks.7.attn.qkv.weight"] = zeros({3, 3});
  state["ln_f.weight"] = zeros({9});
  state["wte.weight"] = zeros({11, 8});  // valid, must not be applied when anything else is wrong
  try {
    model.load_state_dict(state);
    FAIL("load_state_dict accepted a bad state dict");
  } catch (const Error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK_THAT(message, Catch::Contains("[load_state_dict]"));
    CHECK_THAT(message, Catch::Contains("missing (2): wpe.weight, blocks.1.mlp.fc.bias"));
    CHECK_THAT(message, Catch::Contains("unexpected (1): blocks.7.attn.qkv.weight"));
    CHECK_THAT(message, Catch::Contains("mis-shaped (1): ln_f.weight is [9], expected [8]"));
  }
  CHECK(max_abs_diff(model.wte.weight, before) == 0);
}

TEST_CASE("nn: train and eval reach every submodule", "[nn]") {
  nn::GPT model(tiny_config());
  auto all_training = [&](bool expected) {
    for (auto& [name, m] : model.named_modules())
      if (m->is_training() != expected) return false;
    return true;
  };
  CHECK(model.named_modules().size() > 20);
  CHECK(all_training(true));
  model.eval();
  CHECK(all_training(false));
  CHECK_FALSE(model.blocks[1].attn.out_proj.is_training());
  model.train();
  CHECK(all_training(true));
}

TEST_CASE("nn: zero_grad forgets every gradient", "[nn]") {
  nn::GPT model(tiny_config());
  const Tensor tokens = tokens_of({1, 2, 3, 4, 5, 6}, {2, 3});
  backward(model.loss(tokens, tokens));
  std::size_t with_grad = 0;
  for (const Tensor& p : model.parameters()) with_grad += p.grad().defined();
  CHECK(with_grad == model.parameters().size());
  model.zero_grad();
  for (const Tensor& p : model.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("nn: to(dtype) converts parameters in place, keeping handles valid", "[nn]") {
  Generator gen(1);
  Pair pair(gen);
  const Tensor weight_handle = pair.named_parameters()[1].tensor;  // first.weight
  const std::vector<float> values = pair.first.weight.to_vector<float>();
  pair.to(DType::f64);
  CHECK(pair.first.weight.dtype() == DType::f64);
  CHECK(weight_handle.dtype() == DType::f64);  // the same TensorImpl
  CHECK(weight_handle.same(pair.first.weight));
  const auto converted = pair.first.weight.to_vector<double>();
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(converted[i] == double(values[i]));
  // Still leaves that learn: backward reaches the converted parameters.
  backward(sum(pair.forward(leaf({2, 3}, 4))));
  CHECK(weight_handle.grad().defined());
  CHECK(weight_handle.grad().dtype() == DType::f64);
  REQUIRE_THROWS_WITH(pair.to(DType::i64), Catch::Contains("floating"));
}

// ---- layers ---------------------------------------------------------------------------------

TEST_CASE("nn: Linear computes x W^T + b with torch's init bounds", "[nn]") {
  Generator gen(3);
  nn::Linear lin(16, 4, gen);
  const double bound = 1.0 / std::sqrt(16.0);
  for (double w : lin.weight.to_vector<double>()) CHECK(std::abs(w) <= bound);
  for (double b : lin.bias.to_vector<double>()) CHECK(std::abs(b) <= bound);
  nn::Linear small(2, 1, gen);
  {
    NoGradGuard no_grad;
    kernels::copy_(small.weight, from({2, -1}, {1, 2}));
    kernels::copy_(small.bias, from({0.5}, {1}));
  }
  CHECK(small(from({3, 4}, {1, 2})).item() == Approx(2 * 3 - 4 + 0.5));
  nn::Linear no_bias(3, 2, gen, {.bias = false});
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.named_parameters().size() == 1);
}

TEST_CASE("nn: Embedding, LayerNorm, GELU, Dropout and MLP", "[nn]") {
  Generator gen(3);
  nn::Embedding emb(5, 3, gen);
  const Tensor rows = emb(tokens_of({4, 0, 4}, {3}));
  CHECK(rows.sizes() == Shape{3, 3});
  CHECK(rows.at({0, 1}) == emb.weight.at({4, 1}));
  CHECK(rows.at({2, 2}) == emb.weight.at({4, 2}));

  nn::LayerNorm ln(4);
  const Tensor y = ln(from({1, 2, 3, 4}, {1, 4}));  // mean 2.5, var 1.25
  CHECK(y.at({0, 0}) == Approx(-1.5 / std::sqrt(1.25 + 1e-5)));
  CHECK(ln.weight.at({0}) == 1.0);
  CHECK(ln.bias.at({0}) == 0.0);

  nn::GELU act;
  CHECK(act(from<double>({1.0}, {1})).item() == Approx(0.8411919906));

  Generator drop_gen(4);
  nn::Dropout drop(0.5, &drop_gen);
  const Tensor x = ones({1000});
  const auto dropped = drop(x).to_vector<float>();
  const auto zeros_count = std::count(dropped.begin(), dropped.end(), 0.0f);
  CHECK(zeros_count > 400);
  CHECK(zeros_count < 600);
  for (float v : dropped) CHECK((v == 0.0f || v == 2.0f));
  drop.eval();
  CHECK(max_abs_diff(drop(x), x) == 0);

  nn::MLP mlp(6, gen);
  CHECK(names_of(mlp) == std::vector<std::string>{"fc.weight", "fc.bias", "proj.weight", "proj.bias"});
  CHECK(mlp.fc.weight.sizes() == Shape{24, 6});
  CHECK(mlp(zeros({2, 3, 6})).sizes() == Shape{2, 3, 6});
}

// A layer norm feeding products: its output is made again for the products'
// backward instead of kept (autograd/node.h's Remake), with the bits of the kept one.
TEST_CASE("nn: a layer norm feeding products keeps its input only, and the gradients keep their bits", "[nn]") {
  for (const DType autocast : {DType::f32, DType::bf16}) {
    INFO("autocast " << dtype_name(autocast));
    const auto run = [&](bool remade, std::size_t& held) {
      Generator gen(6);
      nn::LayerNorm ln(64);
      nn::Linear proj(64, 96, gen);
      Tensor x = randn({4, 32, 64}, {}, gen).set_requires_grad(true);
      const std::size_t before = cpu_alloc_stats().bytes_in_use;
      Tensor loss;
      {
        const AutocastGuard guard(autocast);
        const std::optional<DType> result = autocast == DType::bf16 ? std::optional(DType::bf16) : std::nullopt;
        const Tensor h = remade ? ln.feeding_products(x) : layer_norm(x, ln.weight, ln.bias, ln.eps, result);
        loss = sum(gelu(proj(h)));
      }
      held = cpu_alloc_stats().bytes_in_use - before;
      backward(loss);
      return std::vector<std::vector<float>>{contiguous(x.grad()).to_vector<float>(),
                                             contiguous(ln.weight.grad()).to_vector<float>(),
                                             contiguous(proj.weight.grad()).to_vector<float>()};
    };
    std::size_t kept = 0, remade = 0;
    const auto want = run(false, kept);
    CHECK(run(true, remade) == want);
    const std::size_t h_bytes = 4 * 32 * 64 * (autocast == DType::bf16 ? 2 : 4);
    CHECK(kept - remade == h_bytes);
  }
}

TEST_CASE("nn: a remade layer norm output, or its input, changed in place after the forward stops the backward", "[nn]") {
  Generator gen(7);
  nn::LayerNorm ln(8);
  nn::Linear proj(8, 8, gen);
  {
    Tensor x = randn({3, 8}, {}, gen).set_requires_grad(true);
    const Tensor h = ln.feeding_products(x);
    const Tensor loss = sum(proj(h));
    kernels::fill_(h, 0.0);  // kept here, so the change is seen
    CHECK_THROWS_WITH(backward(loss), Catch::Contains("layer_norm's output) was modified in place after the forward"));
  }
  {
    const Tensor x0 = randn({3, 8}, {}, gen);
    Tensor x = x0 * 1.0;  // not a leaf: an in-place write is allowed
    const Tensor loss = sum(proj(ln.feeding_products(x)));
    kernels::fill_(x, 0.0);
    CHECK_THROWS_WITH(backward(loss), Catch::Contains("was modified in place after the forward"));
  }
}

// ---- optimizers -------------------------------------------------------------------------------

TEST_CASE("nn: AdamW matches hand-computed steps and decays only marked parameters", "[nn][optimizer]") {
  // One parameter p = 1 with gradient g = 0.5 at every step, lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.1.
  // Step 1: p *= 1 - 0.01 -> 0.99; m = 0.05, v = 0.00025; m^ = 0.5, v^ = 0.25;
  //         p -= 0.1 * 0.5 / (0.5 + 1e-8) = 0.099999998 -> 0.890000002.
  // Step 2: p *= 0.99 -> 0.88110000198; m = 0.095, v = 0.00049975; m^ = 0.095 / 0.19 = 0.5,
  //         v^ = 0.00049975 / 0.001999 = 0.25; p -= 0.099999998 -> 0.78110000398.
  Tensor decayed = ones({1}, {DType::f64}), plain = ones({1}, {DType::f64});
  decayed.set_requires_grad(true);
  plain.set_requires_grad(true);
  train::optim::AdamW opt({{"decayed", decayed, true}, {"plain", plain, false}},
                   {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
  for (int step = 0; step < 2; ++step) {
    decayed.set_grad(full({1}, 0.5, {DType::f64}));
    plain.set_grad(full({1}, 0.5, {DType::f64}));
    opt.step();
  }
  CHECK(decayed.item() == Approx(0.78110000398).epsilon(1e-11));
  // Without decay: 1 - 2 * 0.099999998 = 0.800000004.
  CHECK(plain.item() == Approx(0.800000004).epsilon(1e-11));
  CHECK(opt.step_count() == 2);
  CHECK(opt.state().at("exp_avg.plain").item() == Approx(0.095));
  CHECK(opt.state().at("exp_avg_sq.decayed").item() == Approx(0.00049975));
}

TEST_CASE("nn: AdamW float32 fused step equals the float64 one", "[nn][optimizer]") {
  Generator gen(1);
  Tensor p64 = randn({1000}, {DType::f64}, gen), g64 = randn({1000}, {DType::f64}, gen);
  Tensor p32 = kernels::cast(p64, DType::f32), g32 = kernels::cast(g64, DType::f32);
  const Tensor start = kernels::clone(p64);
  p64.set_requires_grad(true);
  p32.set_requires_grad(true);
  train::optim::AdamW a({{"p", p64, true}}, {.lr = 0.01, .weight_decay = 0.1}),
      b({{"p", p32, true}}, {.lr = 0.01, .weight_decay = 0.1});
  for (int i = 0; i < 3; ++i) {
    p64.set_grad(g64);
    p32.set_grad(g32);
    a.step();
    b.step();
  }
  CHECK(all_close(p32, p64, 1e-6, 1e-5));
  CHECK(max_abs_diff(p64, start) > 0.01);  // it moved
}

// The float32 update runs on the widest vectors the CPU has (AG_SIMD_CLONES), in
// parallel chunks, each a vector body and a tail: every element must be the
// formula's, evaluated in float64 from the same float32 inputs, within float32's
// roundings (GCC may contract a product and a sum into one FMA on the wider
// levels: a rounding fewer). A slip of index or lane in a body or tail is off by
// far more.
TEST_CASE("nn: AdamW's float32 kernel gives the formula's values in every vector body and tail", "[nn][optimizer]") {
  Generator gen(7);
  const std::int64_t n = 70001;  // several parallel chunks, and tails of every length mod 16
  const Tensor p = randn({n}, {}, gen), g = randn({n}, {}, gen), m = randn({n}, {}, gen);
  const Tensor r = randn({n}, {}, gen), v = mul(r, r);
  for (std::int64_t i = 0; i < n; i += 97) v.data<float>()[i] = -1000;  // never from AdamW, but sqrt's NaN must pass through
  const std::vector<float> p0(p.data<float>(), p.data<float>() + n), m0(m.data<float>(), m.data<float>() + n),
      v0(v.data<float>(), v.data<float>() + n);
  const kernels::AdamWStep step{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
  kernels::adamw_step_({{p, g, m, v, true}}, step);
  const double decay = 1.0 - 3e-3 * 0.1, step_size = 3e-3 / (1.0 - std::pow(0.9, 3.0));
  const double inv_sqrt_bc2 = 1.0 / std::sqrt(1.0 - std::pow(0.99, 3.0));
  // Up to 8 float32 roundings (the update's chain: products, sum, square root,
  // division), each of half an ulp of the largest term.
  const double ulp = std::ldexp(1.0, -23), roundings = 8;
  std::int64_t wrong = 0, nans = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double gi = g.data<float>()[i];
    const double mi = 0.9 * m0[i] + 0.1 * gi, vi = 0.99 * v0[i] + 0.01 * gi * gi;
    const double update = step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + 1e-8), pi = p0[i] * decay - update;
    const float got_m = m.data<float>()[i], got_v = v.data<float>()[i], got_p = p.data<float>()[i];
    bool ok = std::abs(got_m - mi) <= roundings * ulp * (std::abs(0.9 * m0[i]) + std::abs(0.1 * gi)) &&
              std::abs(got_v - vi) <= roundings * ulp * (std::abs(0.99 * v0[i]) + 0.01 * gi * gi);
    if (vi < 0) {
      ok = ok && std::isnan(got_p), ++nans;
    } else {
      ok = ok && std::abs(got_p - pi) <= roundings * ulp * (std::abs(p0[i] * decay) + std::abs(update));
    }
    wrong += !ok;
  }
  CHECK(wrong == 0);
  CHECK(nans == (n + 96) / 97);
}

TEST_CASE("nn: SGD with momentum matches hand-computed steps", "[nn][optimizer]") {
  // p = 1, g = 1 each step, lr 0.1, momentum 0.9: buf 1 then 1.9; p = 1 - 0.1 - 0.19 = 0.71.
  Tensor p = ones({1}, {DType::f64});
  p.set_requires_grad(true);
  train::optim::SGD opt({{"p", p, false}}, {.lr = 0.1, .momentum = 0.9});
  for (int i = 0; i < 2; ++i) {
    p.set_grad(ones({1}, {DType::f64}));
    opt.step();
  }
  CHECK(p.item() == Approx(0.71));
  CHECK(opt.state().at("momentum_buffer.p").item() == Approx(1.9));
  // Nesterov: step 1 uses g + 0.9 * buf = 1.9: p = 1 - 0.19 = 0.81.
  Tensor q = ones({1}, {DType::f64});
  q.set_requires_grad(true);
  train::optim::SGD nesterov({{"q", q, false}}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  q.set_grad(ones({1}, {DType::f64}));
  nesterov.step();
  CHECK(q.item() == Approx(0.81));
}

TEST_CASE("nn: optimizer state round trip and learning rate per step", "[nn][optimizer]") {
  nn::GPT model(tiny_config());
  train::optim::AdamW opt(model.named_parameters(), {.lr = 1e-2});
  const Tensor tokens = tokens_of({1, 2, 3, 4, 5, 6}, {2, 3});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    backward(model.loss(tokens, tokens));
    opt.step();
  }
  nn::GPT copy(tiny_config());
  copy.load_state_dict(model.state_dict());
  train::optim::AdamW resumed(copy.named_parameters(), {.lr = 1e-2});
  resumed.load_state(opt.state(), opt.step_count());
  CHECK(resumed.step_count() == 2);
  for (auto* o : {static_cast<train::optim::Optimizer*>(&opt), static_cast<train::optim::Optimizer*>(&resumed)}) o->set_lr(5e-3);
  opt.zero_grad();
  backward(model.loss(tokens, tokens));
  opt.step();
  resumed.zero_grad();
  backward(copy.loss(tokens, tokens));
  resumed.step();
  CHECK(max_abs_diff(model.wte.weight, copy.wte.weight) == 0);
  CHECK(max_abs_diff(model.blocks[0].attn.qkv.weight, copy.blocks[0].attn.qkv.weight) == 0);
  auto partial = opt.state();
  partial.erase("exp_avg.wpe.weight");
  REQUIRE_THROWS_WITH(resumed.load_state(partial, 3), Catch::Contains("exp_avg.wpe.weight"));
  REQUIRE_THROWS_WITH(opt.set_lr(-1), Catch::Contains("learning rate"));
}

TEST_CASE("nn: an optimizer step bumps versions, so stale graphs refuse to backward", "[nn][optimizer]") {
  nn::GPT model(tiny_config());
  train::optim::SGD opt(model.named_parameters(), {.lr = 0.1});
  const Tensor tokens = tokens_of({1, 2, 3, 4, 5, 6}, {2, 3});
  backward(model.loss(tokens, tokens));
  const Tensor stale = model.loss(tokens, tokens);
  opt.step();
  REQUIRE_THROWS_WITH(backward(stale), Catch::Contains("modified in place"));
}
