#pragma once
// The GPT a run trains, built from its options and vocabulary, and what train/
// needs of it beyond nn/: attention weights per head for the picture.
#include <memory>

#include "nn/gpt.h"
#include "train/data/tokenizer.h"
#include "train/options.h"

namespace attograd::train::model {

// `tokens` is the vocabulary's size; the model's rows are options.vocab_size
// where that is larger (padding, GPTConfig::token_count).
nn::GPTConfig gpt_config(const TrainOptions& options, std::int64_t tokens);
std::unique_ptr<nn::GPT> build_model(const TrainOptions& options, std::int64_t tokens);
// The number of parameters build_model would allocate, computed without
// allocating: a checkpoint's config is checked against its tensors with it
// before a model of attacker-chosen size is built.
std::int64_t parameter_count(const nn::GPTConfig& config);
// The FLOPs of one training step on `batch` rows of the full block: its
// products' forward counted three times (forward and backward), the causal
// attention as computed (T (T + 1) / 2 scores a row); norms, GELU, softmax and
// the optimizer not counted. Model FLOPs utilisation is these over the time.
double step_flops(const nn::GPTConfig& config, std::int64_t batch);

// What one micro-batch of `micro_batch` sequences keeps for its backward on the
// CPU, estimated before allocating it (the memory check of `attograd train`).
struct BackwardMemory {
  double activation_bytes = 0;  // layers' outputs and the logits, from measurements (model.cpp)
  double probs_bytes = 0;       // the probability tiles each layer's attention keeps, counted exactly
};
BackwardMemory backward_memory(const TrainOptions& options, std::int64_t vocab_size, std::int64_t micro_batch);

// Runs `tokens` (1, T) through the model in eval mode and returns every
// layer's and head's attention weights: weights[layer][head] is T x T.
std::vector<std::vector<std::vector<float>>> attention_weights(nn::GPT& model, const Tensor& tokens);

}  // namespace attograd::train::model
