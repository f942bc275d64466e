#include "train/model/gpt.h"

#include "autograd/attention.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd::train::model {

namespace {

// --attention-memory in bytes, or kAutoSavedProbsLimit.
std::int64_t saved_probs_limit(const TrainOptions& o) {
  return o.attention_memory < 0 ? kAutoSavedProbsLimit : o.attention_memory << 20;
}

}  // namespace

nn::GPTConfig gpt_config(const TrainOptions& o, std::int64_t tokens) {
  nn::GPTConfig c;
  c.vocab_size = std::max(o.vocab_size, tokens);  // --vocab-size past the tokenizer's pads it
  c.token_count = tokens;
  c.block_size = o.block;
  c.n_layer = o.layers;
  c.n_head = o.heads;
  c.n_embd = o.width;
  c.dropout = o.dropout;
  c.bias = true;
  c.tie_weights = true;
  c.seed = o.seed;
  c.saved_probs_limit = saved_probs_limit(o);
  return c;
}

std::unique_ptr<nn::GPT> build_model(const TrainOptions& options, std::int64_t vocab_size) {
  return std::make_unique<nn::GPT>(gpt_config(options, vocab_size));
}

std::int64_t parameter_count(const nn::GPTConfig& c) {
  const std::int64_t C = c.n_embd, bias = c.bias ? 1 : 0;
  const std::int64_t layer_norm = C + bias * C;
  const std::int64_t block = layer_norm + (C * 3 * C + bias * 3 * C)  // ln_1, attn.qkv
                             + (C * C + bias * C)                      // attn.out_proj
                             + layer_norm + (C * 4 * C + bias * 4 * C)  // ln_2, mlp.fc
                             + (4 * C * C + bias * C);                 // mlp.proj
  const std::int64_t lm_head = c.tie_weights ? 0 : C * c.vocab_size;
  return c.vocab_size * C + c.block_size * C + c.n_layer * block + layer_norm + lm_head;
}

double step_flops(const nn::GPTConfig& c, std::int64_t batch) {
  const double B = static_cast<double>(batch), T = static_cast<double>(c.block_size), C = static_cast<double>(c.n_embd);
  const double layer = 24 * B * T * C * C + 2 * B * C * T * (T + 1);  // qkv, out, fc, proj; q k^T and p v
  return 3 * (static_cast<double>(c.n_layer) * layer + 2 * B * T * C * static_cast<double>(c.vocab_size));
}

// The layers' activations were measured at about 11 x layers x width floats
// per token (the peak in use of bench_gpt.cpp's steps, less the weights,
// AdamW's moments and the probabilities kept); 10 are counted, so that the
// memory check refuses only what cannot fit. The head and loss
// (linear_cross_entropy) hold a chunk of logits (their gradient written over
// them) and the head's gradient, whatever the batch. Each layer's attention
// also keeps probability tiles, up to --attention-memory (by default 64 MiB
// on heads of 64 values or more and at most 8 times as long;
// autograd/attention.h).
BackwardMemory backward_memory(const TrainOptions& o, std::int64_t vocab_size, std::int64_t micro_batch) {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(o.block);
  const double vocab = static_cast<double>(std::max(o.vocab_size, vocab_size));
  const double chunk_rows = std::min(tokens, static_cast<double>(classifier_chunk_rows(static_cast<std::int64_t>(vocab))));
  const double classifier = (chunk_rows * vocab + vocab * static_cast<double>(o.width)) * sizeof(float);
  const double per_token = 10.0 * static_cast<double>(o.layers * o.width) * sizeof(float);
  const std::int64_t probs_per_layer =
      saved_probs_bytes({.causal = true, .saved_probs_limit = saved_probs_limit(o)}, micro_batch * o.heads, o.block,
                        o.block, o.width / o.heads, sizeof(float));
  return {.activation_bytes = tokens * per_token + classifier,
          .probs_bytes = static_cast<double>(o.layers) * static_cast<double>(probs_per_layer)};
}

std::vector<std::vector<std::vector<float>>> attention_weights(nn::GPT& model, const Tensor& tokens) {
  NoGradGuard no_grad;
  model.eval();
  // GPT::forward, block by block, asking each attention layer for its weights
  // (nn/gpt.cpp's Block::forward with return_weights; dropout is off in eval mode).
  const std::int64_t t = tokens.size(1);
  Tensor x = model.wte(tokens) + model.wpe(arange(t, {DType::i64}));  // (1, T, C)
  std::vector<std::vector<std::vector<float>>> maps;
  for (const auto& block : model.blocks) {
    const Tensor h = block->ln_1(x);
    nn::AttendOptions options;
    options.return_weights = true;
    const nn::AttendResult a = block->attn.forward(h, h, h, options);
    const Tensor w = to_cpu(a.weights);  // (1, H, T, T)
    const std::int64_t heads = w.size(1);
    std::vector<std::vector<float>> layer;
    for (std::int64_t head = 0; head < heads; ++head)
      layer.push_back(contiguous(select(select(w, 0, 0), 0, head)).to_vector<float>());
    maps.push_back(std::move(layer));
    x = x + a.out;
    x = x + block->mlp(block->ln_2(x));
  }
  return maps;
}

}  // namespace attograd::train::model
