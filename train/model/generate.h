#pragma once
// Autoregressive generation. With the key/value cache each new token costs
// one position of compute; without it, the whole context is run again for
// every token. Both follow the same context rule, so they give the same tokens:
// the context is the tokens since `start`; a prompt longer than the block
// keeps its last block tokens, and when the context outgrows the block it
// restarts from its last half-block tokens (the cache is then refilled).
#include <cstdint>
#include <vector>

#include "nn/gpt.h"

namespace attograd::train::model {

struct GenerateOptions {
  std::int64_t tokens = 100;  // new tokens to generate (at most)
  double temperature = 1.0;   // 0: greedy (argmax)
  std::int64_t top_k = 0;     // 0: the whole vocabulary
  // Nucleus sampling: only the likeliest tokens whose probabilities (after the
  // temperature and top-k) add up to top_p are drawn from; 1: all of them.
  double top_p = 1.0;
  std::uint64_t seed = 0;     // the draw for new token i is philox(seed, i) of the stream: reproducible
  std::uint64_t stream = 0;   // another sample from the same seed (below 2^24)
  bool use_cache = true;
  DType dtype = DType::f32;   // bfloat16: the forward under autocast (autograd/autocast.h)
  std::int64_t stop_token = -1;  // generation ends after this token (GPT-2's <|endoftext|>); -1: none
  // Ids at or above this are never drawn (a vocabulary padded past its
  // tokenizer, as nanoGPT's 50304 rows for GPT-2's 50257 tokens); 0: none are excluded.
  std::int64_t vocab_limit = 0;
};

// Returns prompt + generated tokens. The prompt must not be empty.
std::vector<std::int64_t> generate(nn::GPT& model, const std::vector<std::int64_t>& prompt,
                                   const GenerateOptions& options, Device device = Device::cpu());

// The token drawn from one row of logits (V floats) with these options and
// this uniform number in [0, 1).
std::int64_t pick_token(const std::vector<float>& logits, const GenerateOptions& options, double uniform);

}  // namespace attograd::train::model
