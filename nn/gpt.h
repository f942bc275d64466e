#pragma once
// A GPT-2 style decoder-only language model (Radford et al. 2019), laid out as
// nanoGPT: token + learned position embeddings, n_layer pre-LayerNorm blocks
//   x = x + dropout(attn(ln_1(x)));  x = x + dropout(mlp(ln_2(x)))
// a final LayerNorm and a linear head to vocabulary logits, optionally tied to
// the token embedding (then there is no lm_head parameter: the head reads
// wte.weight).
//
// Parameter names: wte.weight, wpe.weight, blocks.<i>.ln_1.{weight,bias},
// blocks.<i>.attn.qkv.{weight,bias}, blocks.<i>.attn.out_proj.{weight,bias},
// blocks.<i>.ln_2.*, blocks.<i>.mlp.fc.*, blocks.<i>.mlp.proj.*, ln_f.*, and
// lm_head.weight when untied.
//
// Initialisation (GPT-2): every Linear weight and both embeddings ~ N(0, 0.02),
// biases 0, LayerNorms weight 1 and bias 0; the two projections that write
// into the residual stream (attn.out_proj and mlp.proj) ~ N(0, 0.02 / sqrt(2 n_layer)).
// Everything is drawn from a Generator seeded with config.seed; dropout masks
// from a second one seeded with config.seed + 1.
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace attograd::nn {

struct GPTConfig {
  std::int64_t vocab_size = 65;
  // Rows of the vocabulary that are tokens; those past it pad the embedding and
  // head for speed (nanoGPT's 50304 for GPT-2's 50257) and their logits enter
  // no loss. 0: every row is a token.
  std::int64_t token_count = 0;
  std::int64_t block_size = 128;  // longest sequence (positions 0 .. block_size-1)
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
  double dropout = 0.0;  // on embeddings, attention weights and residual branches
  bool bias = true;      // in Linears and LayerNorms
  bool tie_weights = true;
  std::uint64_t seed = 1337;
  // Each layer's AttentionOptions::saved_probs_limit: memory, not the model (no checkpoint holds it).
  std::int64_t saved_probs_limit = kAutoSavedProbsLimit;
};

// Per-layer keys and values of the tokens seen so far, for generation.
struct KVCache {
  explicit KVCache(std::int64_t n_layer) : layers(static_cast<std::size_t>(n_layer)) {}
  std::int64_t length() const { return layers.empty() ? 0 : layers[0].length(); }
  void clear() {
    for (auto& l : layers) l.clear();
  }
  std::vector<KVCacheLayer> layers;
};

class Block : public Module {
 public:
  Block(const GPTConfig& config, Generator& init, Generator* dropout_gen);
  Tensor forward(const Tensor& x, KVCacheLayer* cache = nullptr) const;  // (B, T, C) -> (B, T, C)
  Tensor operator()(const Tensor& x) const { return forward(x); }

  LayerNorm ln_1;
  MultiHeadAttention attn;
  LayerNorm ln_2;
  MLP mlp;
  Dropout resid_dropout;
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config);

  // tokens int64 (B, T), T <= block_size -> logits (B, T, vocab_size).
  Tensor forward(const Tensor& tokens) const;
  Tensor operator()(const Tensor& tokens) const { return forward(tokens); }
  // Incremental decoding: `tokens` (B, T_new) continue the sequence held in
  // `cache` (positions cache.length() ..); their keys and values are appended.
  // Returns logits for the new tokens. Inference only: runs without recording
  // a graph. cache.length() + T_new must not exceed block_size.
  Tensor forward(const Tensor& tokens, KVCache& cache) const;
  // Mean cross-entropy of forward(tokens) against int64 targets (B, T),
  // skipping targets equal to ignore_index, over the tokens' logits only;
  // the head and the loss a chunk of positions at a time (linear_cross_entropy).
  Tensor loss(const Tensor& tokens, const Tensor& targets, std::int64_t ignore_index = -100) const;
  // The logits of the tokens: (B, T, token_count) of forward's (B, T, vocab_size), a view.
  Tensor token_logits(const Tensor& logits) const;

  KVCache make_cache() const { return KVCache(config_.n_layer); }
  const GPTConfig& config() const { return config_; }

 private:
  static const GPTConfig& checked(const GPTConfig& config);
  Tensor run(const Tensor& tokens, KVCache* cache) const;
  // The final LayerNorm's output (B, T, n_embd), which the head reads.
  Tensor features(const Tensor& tokens, KVCache* cache) const;
  void init_gpt2();

  GPTConfig config_;
  Generator init_gen_;
  Generator dropout_gen_;

 public:
  Embedding wte;  // (vocab_size, n_embd)
  Embedding wpe;  // (block_size, n_embd)
  Dropout drop;
  ModuleList<Block> blocks;
  LayerNorm ln_f;
  std::unique_ptr<Linear> lm_head;  // (vocab_size, n_embd), no bias; null when tied to wte
};

}  // namespace attograd::nn
