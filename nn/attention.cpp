#include "nn/attention.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd::nn {

// ---- KV cache -------------------------------------------------------------------

Tensor KVCacheLayer::keys() const { return length_ == 0 ? Tensor() : narrow(k_, 2, 0, length_); }
Tensor KVCacheLayer::values() const { return length_ == 0 ? Tensor() : narrow(v_, 2, 0, length_); }

void KVCacheLayer::append(const Tensor& k_new, const Tensor& v_new) {
  AG_CHECK(k_new.dim() == 4 && k_new.sizes() == v_new.sizes(), "KVCache", "k {} and v {} must be equal (B, H, n, D)",
           shape_str(k_new.sizes()), shape_str(v_new.sizes()));
  const std::int64_t n = k_new.size(2), needed = length_ + n;
  if (length_ > 0) {
    AG_CHECK(k_new.size(0) == k_.size(0) && k_new.size(1) == k_.size(1) && k_new.size(3) == k_.size(3) &&
                 k_new.dtype() == k_.dtype() && k_new.device() == k_.device(),
             "KVCache", "appending {} to a cache holding {}", k_new.str(), k_.str());
  }
  const bool fits = k_.defined() && needed <= k_.size(2) && k_new.size(0) == k_.size(0) &&
                    k_new.size(1) == k_.size(1) && k_new.size(3) == k_.size(3) && k_new.dtype() == k_.dtype() &&
                    k_new.device() == k_.device();
  if (!fits) {
    // Grow (doubling) and move what is held.
    const std::int64_t capacity = std::max(needed, length_ > 0 ? 2 * k_.size(2) : needed);
    Shape sizes = k_new.sizes();
    sizes[2] = capacity;
    Tensor k = empty(sizes, k_new.options()), v = empty(sizes, k_new.options());
    if (length_ > 0) {
      kernels::copy_(narrow(k, 2, 0, length_), keys());
      kernels::copy_(narrow(v, 2, 0, length_), values());
    }
    k_ = k;
    v_ = v;
  }
  kernels::copy_(narrow(k_, 2, length_, n), k_new);
  kernels::copy_(narrow(v_, 2, length_, n), v_new);
  length_ = needed;
}

// ---- multi-head attention -------------------------------------------------------------

const MultiHeadAttentionConfig& MultiHeadAttention::checked(const MultiHeadAttentionConfig& c) {
  AG_CHECK(c.d_model > 0 && c.num_heads > 0, "MultiHeadAttention", "d_model {} and num_heads {} must be positive",
           c.d_model, c.num_heads);
  AG_CHECK(c.d_model % c.num_heads == 0, "MultiHeadAttention",
           "d_model {} is not divisible by num_heads {}: each head needs d_model / num_heads dims", c.d_model,
           c.num_heads);
  AG_CHECK(c.dropout >= 0 && c.dropout < 1, "MultiHeadAttention", "dropout must be in [0, 1), got {}", c.dropout);
  return c;
}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config, Generator& gen)
    : config_(checked(config)),
      qkv(config.d_model, 3 * config.d_model, gen, {.bias = config.bias}),
      out_proj(config.d_model, config.d_model, gen, {.bias = config.out_bias}) {
  register_module("qkv", qkv);
  register_module("out_proj", out_proj);
}

Tensor MultiHeadAttention::w_q() const { return narrow(qkv.weight, 0, 0, config_.d_model); }
Tensor MultiHeadAttention::w_k() const { return narrow(qkv.weight, 0, config_.d_model, config_.d_model); }
Tensor MultiHeadAttention::w_v() const { return narrow(qkv.weight, 0, 2 * config_.d_model, config_.d_model); }
Tensor MultiHeadAttention::b_q() const {
  return qkv.bias.defined() ? narrow(qkv.bias, 0, 0, config_.d_model) : Tensor();
}
Tensor MultiHeadAttention::b_k() const {
  return qkv.bias.defined() ? narrow(qkv.bias, 0, config_.d_model, config_.d_model) : Tensor();
}
Tensor MultiHeadAttention::b_v() const {
  return qkv.bias.defined() ? narrow(qkv.bias, 0, 2 * config_.d_model, config_.d_model) : Tensor();
}

Tensor MultiHeadAttention::split_heads(const Tensor& x) const {
  // (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
  return transpose(view(x, {x.size(0), x.size(1), config_.num_heads, head_dim()}), 1, 2);
}

AttendResult MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                         const AttendOptions& options) const {
  const char* op = "MultiHeadAttention";
  const std::int64_t C = config_.d_model, H = config_.num_heads;
  AG_CHECK(query.defined() && key.defined() && value.defined(), op, "query, key or value is undefined");
  AG_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3, op,
           "query, key, value must be (B, T, C), got {}, {}, {}", shape_str(query.sizes()), shape_str(key.sizes()),
           shape_str(value.sizes()));
  AG_CHECK(query.size(2) == C && key.size(2) == C && value.size(2) == C, op,
           "inputs must have d_model = {} features, got {}, {}, {}", C, shape_str(query.sizes()),
           shape_str(key.sizes()), shape_str(value.sizes()));
  AG_CHECK(key.sizes() == value.sizes() && key.size(0) == query.size(0), op,
           "key {} and value {} must match, with the batch of query {}", shape_str(key.sizes()),
           shape_str(value.sizes()), shape_str(query.sizes()));

  const bool self = query.same(key) && key.same(value);
  AttentionOptions attend{.causal = config_.causal,
                          .mask = options.mask,
                          .dropout_p = config_.dropout,
                          .training = is_training(),
                          .generator = config_.dropout_generator,
                          .return_weights = options.return_weights,
                          .impl = config_.impl,
                          .saved_probs_limit = config_.saved_probs_limit};
  // (B, H, Tq, D) -> (B, Tq, H, D) -> (B, Tq, C): free when the fused kernel
  // already laid the output out as (B, Tq, H, D).
  auto project_out = [&](const AttentionOutput& a) -> AttendResult {
    const Tensor merged = reshape(transpose(a.out, 1, 2), {query.size(0), query.size(1), C});
    return {out_proj(merged), a.weights};
  };
  // One (B*T, C) x (C, 3C) matmul, attended as it lies: linear_heads writes it
  // head by head where the device's kernel can, so that the fused kernel reads
  // each head's rows back to back rather than out of rows 3C apart.
  if (self && !options.cache) {
    if (config_.impl != AttentionImpl::composed && query.dim() == 3)
      return project_out(attention_packed(linear_heads(query, qkv.weight, qkv.bias, 3, H), H, attend));
    return project_out(attention_packed(qkv(query), H, attend));
  }

  Tensor q, k, v;  // (B, H, T, D)
  if (self) {
    const auto heads = split_packed_heads(qkv(query), 3, H);
    q = heads[0], k = heads[1], v = heads[2];
  } else {
    q = split_heads(linear(query, w_q(), b_q()));
    if (key.same(value)) {
      const Tensor w_kv = narrow(qkv.weight, 0, C, 2 * C);
      const Tensor b_kv = qkv.bias.defined() ? narrow(qkv.bias, 0, C, 2 * C) : Tensor();
      const auto heads = split_packed_heads(linear(key, w_kv, b_kv), 2, H);
      k = heads[0], v = heads[1];
    } else {
      k = split_heads(linear(key, w_k(), b_k()));
      v = split_heads(linear(value, w_v(), b_v()));
    }
  }

  if (options.cache) {
    AG_CHECK(self, op, "a KV cache needs self-attention (query, key and value the same tensor)");
    AG_CHECK(!options.mask.defined(), op, "a mask together with a KV cache is not supported");
    const std::int64_t past = options.cache->length(), n = query.size(1);
    options.cache->append(k.detach(), v.detach());
    k = options.cache->keys();
    v = options.cache->values();
    // New token i sits at position past + i: it sees keys j <= past + i, which
    // is not the top-left causal alignment, so it is spelled out as a mask.
    if (config_.causal && n > 1) {
      Tensor hidden = empty({n, past + n}, {DType::b8});  // (n, past + n)
      bool* p = hidden.data<bool>();
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < past + n; ++j) p[i * (past + n) + j] = j > past + i;
      attend.mask = kernels::to_device(hidden, query.device());
    }
    attend.causal = false;
  }
  return project_out(attention(q, k, v, attend));
}

Tensor key_padding_mask(const std::vector<std::int64_t>& lengths, std::int64_t t) {
  const auto b = static_cast<std::int64_t>(lengths.size());
  Tensor mask = empty({b, 1, 1, t}, {DType::b8});
  bool* p = mask.data<bool>();
  for (std::int64_t i = 0; i < b; ++i) {
    AG_CHECK(lengths[i] >= 0 && lengths[i] <= t, "key_padding_mask", "length {} of sequence {} is outside [0, {}]",
             lengths[i], i, t);
    for (std::int64_t j = 0; j < t; ++j) p[i * t + j] = j >= lengths[i];
  }
  return mask;
}

}  // namespace attograd::nn
