#pragma once
// Multi-head attention (Vaswani et al. 2017) on (B, T, C) inputs, with the
// core computation done by the attention op of autograd/attention.h.
//
// Parameters (names as in state dicts):
//   qkv.weight (3C, C), qkv.bias (3C)   the q, k and v projections packed as
//                                       one matrix, rows [0, C) = W_q,
//                                       [C, 2C) = W_k, [2C, 3C) = W_v
//                                       (torch's in_proj_weight layout);
//                                       the bias is optional (config.bias)
//   out_proj.weight (C, C), out_proj.bias (C)   W_o, bias optional (config.out_bias)
// Self-attention (query, key and value the same tensor) runs the three
// projections as one (B*T, C) x (C, 3C) matmul; the result is split into
// heads by view and permute, with no copy. Cross-attention projects the query
// with W_q and key/value with W_k, W_v (one (C, 2C) matmul when key and value
// are the same tensor). Head h uses rows [h*D, (h+1)*D) of each projection,
// D = C / num_heads; heads are concatenated in that order before W_o.
//
// Masking follows the attention op: causal is a flag (top-left aligned when
// Tq != Tk), the optional bool mask broadcasts to (B, H, Tq, Tk) with
// true = hidden, and a query whose keys are all hidden gets zero attention
// output (not NaN), so its result is just the output projection's bias.
// Dropout applies to the attention weights in training mode only.
#include <cstdint>
#include <vector>

#include "autograd/attention.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace attograd::nn {

struct MultiHeadAttentionConfig {
  std::int64_t d_model = 0;
  std::int64_t num_heads = 1;  // must divide d_model
  double dropout = 0.0;        // on the attention weights, training mode only
  bool bias = true;            // on the q, k, v projections
  bool out_bias = true;        // on the output projection
  bool causal = false;
  Generator* dropout_generator = nullptr;  // default_generator() when null; must outlive the module
  AttentionImpl impl = AttentionImpl::automatic;
  std::int64_t saved_probs_limit = kAutoSavedProbsLimit;  // bytes per call; see AttentionOptions
};

// The keys and values of the tokens seen so far by one attention layer, for
// incremental decoding. Buffers grow by doubling; keys() and values() are
// (B, H, length, D) views of them.
class KVCacheLayer {
 public:
  std::int64_t length() const { return length_; }
  Tensor keys() const;
  Tensor values() const;
  // Appends k_new, v_new (B, H, n, D); B, H, D and dtype must match what is held.
  void append(const Tensor& k_new, const Tensor& v_new);
  void clear() { length_ = 0; }

 private:
  Tensor k_, v_;  // (B, H, capacity, D)
  std::int64_t length_ = 0;
};

struct AttendOptions {
  Tensor mask{};                  // bool, broadcastable to (B, H, Tq, Tk); true = hidden
  bool return_weights = false;    // also return the (B, H, Tq, Tk) weights (before dropout, no gradient)
  KVCacheLayer* cache = nullptr;  // self-attention only: attend over cached keys/values plus the new ones
};

struct AttendResult {
  Tensor out;      // (B, Tq, C)
  Tensor weights;  // (B, H, Tq, Tk) when asked for
};

class MultiHeadAttention : public Module {
 public:
  // Init: q, k, v and out projections each as a torch Linear(C, C), U(-1/sqrt(C), 1/sqrt(C)).
  MultiHeadAttention(const MultiHeadAttentionConfig& config, Generator& gen);

  // query (B, Tq, C), key and value (B, Tk, C). Self-attention when all three
  // are the same tensor (the same handle); with a cache, the new tokens attend
  // to every cached position and (when causal) to new ones up to their own.
  AttendResult forward(const Tensor& query, const Tensor& key, const Tensor& value,
                       const AttendOptions& options = {}) const;
  // Self-attention: x (B, T, C) -> (B, T, C).
  Tensor forward(const Tensor& x, const Tensor& mask = {}) const { return forward(x, x, x, {.mask = mask}).out; }
  Tensor operator()(const Tensor& x, const Tensor& mask = {}) const { return forward(x, mask); }

  // Views of the packed projection: W_q, W_k, W_v (C, C) and their biases (C).
  Tensor w_q() const;
  Tensor w_k() const;
  Tensor w_v() const;
  Tensor b_q() const;
  Tensor b_k() const;
  Tensor b_v() const;

  const MultiHeadAttentionConfig& config() const { return config_; }
  std::int64_t head_dim() const { return config_.d_model / config_.num_heads; }

 private:
  static const MultiHeadAttentionConfig& checked(const MultiHeadAttentionConfig& config);
  Tensor split_heads(const Tensor& x) const;  // (B, T, C) -> (B, H, T, D), a view
  MultiHeadAttentionConfig config_;

 public:
  Linear qkv;       // C -> 3C
  Linear out_proj;  // C -> C
};

// A key-padding mask for sequences of the given lengths padded to `t`:
// bool (B, 1, 1, t), true at key positions >= lengths[b] (hidden).
Tensor key_padding_mask(const std::vector<std::int64_t>& lengths, std::int64_t t);

}  // namespace attograd::nn
