#include "nn/gpt.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd::nn {

// ---- Block ------------------------------------------------------------------------

Block::Block(const GPTConfig& c, Generator& init, Generator* dropout_gen)
    : ln_1(c.n_embd, {.bias = c.bias}),
      attn({.d_model = c.n_embd,
            .num_heads = c.n_head,
            .dropout = c.dropout,
            .bias = c.bias,
            .out_bias = c.bias,
            .causal = true,
            .dropout_generator = dropout_gen,
            .saved_probs_limit = c.saved_probs_limit},
           init),
      ln_2(c.n_embd, {.bias = c.bias}),
      mlp(c.n_embd, init, {.bias = c.bias}),
      resid_dropout(c.dropout, dropout_gen) {
  register_module("ln_1", ln_1);
  register_module("attn", attn);
  register_module("ln_2", ln_2);
  register_module("mlp", mlp);
  register_module("resid_dropout", resid_dropout);
}

Tensor Block::forward(const Tensor& x, KVCacheLayer* cache) const {
  const Tensor h = ln_1.feeding_products(x);  // only the attention's projections read it
  AttendOptions options;
  options.cache = cache;
  const Tensor a = attn.forward(h, h, h, options).out;
  const Tensor y = x + resid_dropout(a);
  return y + resid_dropout(mlp(ln_2.feeding_products(y)));
}

// ---- GPT --------------------------------------------------------------------------

const GPTConfig& GPT::checked(const GPTConfig& c) {
  AG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0, "GPT",
           "sizes must be positive: vocab_size {}, block_size {}, n_layer {}, n_head {}, n_embd {}", c.vocab_size,
           c.block_size, c.n_layer, c.n_head, c.n_embd);
  AG_CHECK(c.token_count >= 0 && c.token_count <= c.vocab_size, "GPT", "token_count {} is not in [0, vocab_size {}]",
           c.token_count, c.vocab_size);
  return c;
}

GPT::GPT(const GPTConfig& config)
    : config_(checked(config)),
      init_gen_(config.seed),
      dropout_gen_(config.seed + 1),
      wte(config.vocab_size, config.n_embd, init_gen_),
      wpe(config.block_size, config.n_embd, init_gen_),
      drop(config.dropout, &dropout_gen_),
      ln_f(config.n_embd, {.bias = config.bias}) {
  register_module("wte", wte);
  register_module("wpe", wpe);
  register_module("drop", drop);
  for (std::int64_t i = 0; i < config.n_layer; ++i)
    blocks.append(std::make_unique<Block>(config, init_gen_, &dropout_gen_));
  register_module("blocks", blocks);
  register_module("ln_f", ln_f);
  if (!config.tie_weights) {
    lm_head = std::make_unique<Linear>(config.n_embd, config.vocab_size, init_gen_, LinearOptions{.bias = false});
    register_module("lm_head", *lm_head);
  }
  init_gpt2();
}

void GPT::init_gpt2() {
  NoGradGuard no_grad;
  const double base_std = 0.02, residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  auto set_normal = [&](const Tensor& t, double s) {
    kernels::copy_(t, normal(t.sizes(), 0.0, s, t.options(), init_gen_));
  };
  auto init_linear = [&](const Linear& l, double s) {
    set_normal(l.weight, s);
    if (l.bias.defined()) kernels::fill_(l.bias, 0.0);
  };
  set_normal(wte.weight, base_std);
  set_normal(wpe.weight, base_std);
  for (const auto& block : blocks) {
    init_linear(block->attn.qkv, base_std);
    init_linear(block->attn.out_proj, residual_std);
    init_linear(block->mlp.fc, base_std);
    init_linear(block->mlp.proj, residual_std);
  }
  if (lm_head) init_linear(*lm_head, base_std);
}

Tensor GPT::run(const Tensor& tokens, KVCache* cache) const {
  const Tensor x = features(tokens, cache);
  return lm_head ? (*lm_head)(x) : linear(x, wte.weight);  // (B, T, vocab_size)
}

Tensor GPT::features(const Tensor& tokens, KVCache* cache) const {
  AG_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::i64, "GPT",
           "tokens must be int64 (B, T), got {}", tokens.defined() ? tokens.str() : "undefined");
  const std::int64_t past = cache ? cache->length() : 0, t = tokens.size(1);
  AG_CHECK(past + t <= config_.block_size, "GPT",
           "sequence of length {} is longer than the block size {} (the model has no position beyond it){}", past + t,
           config_.block_size, cache ? fmt::format("; the cache already holds {} tokens", past) : "");
  if (cache)
    AG_CHECK(static_cast<std::int64_t>(cache->layers.size()) == config_.n_layer, "GPT",
             "the cache has {} layers, the model {}", cache->layers.size(), config_.n_layer);
  const Tensor positions =
      arange(static_cast<double>(past), static_cast<double>(past + t), 1, {DType::i64, tokens.device()});
  Tensor x = drop(wte(tokens) + wpe(positions));  // (B, T, C) + (T, C)
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].forward(x, cache ? &cache->layers[i] : nullptr);
  return ln_f.feeding_products(x);
}

Tensor GPT::forward(const Tensor& tokens) const { return run(tokens, nullptr); }

Tensor GPT::forward(const Tensor& tokens, KVCache& cache) const {
  NoGradGuard no_grad;
  return run(tokens, &cache);
}

Tensor GPT::token_logits(const Tensor& logits) const {
  const std::int64_t tokens = config_.token_count;
  return tokens > 0 && tokens < config_.vocab_size ? narrow(logits, -1, 0, tokens) : logits;
}

Tensor GPT::loss(const Tensor& tokens, const Tensor& targets, std::int64_t ignore_index) const {
  // The head and the loss fused: the (B, T, vocab) logits are never whole in memory, nor their gradient.
  const Tensor& head = lm_head ? lm_head->weight : wte.weight;
  return linear_cross_entropy(features(tokens, nullptr), head, targets, ignore_index,
                              config_.token_count > 0 ? config_.token_count : config_.vocab_size);
}

}  // namespace attograd::nn
