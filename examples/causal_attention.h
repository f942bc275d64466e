#pragma once
// The tutorial's CausalAttention (seeds/002), one head written out with
// attograd's ops, shared by examples 02 (which builds it up) and 03 (which
// stacks several of them into multi-head attention).
#include <cmath>
#include <cstdint>
#include <limits>

#include "autograd/ops.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace examples {

// (T, T) bool, true strictly above the diagonal: key j > query i is in the
// future, so it is hidden (attograd's masks say true = hidden, like torch's
// triu(ones, diagonal=1).bool()).
inline attograd::Tensor future_mask(std::int64_t T) {
  const attograd::Tensor positions = attograd::arange(T);
  return attograd::gt(attograd::unsqueeze(positions, 0), attograd::unsqueeze(positions, 1));  // j > i
}

// Single-head causal self-attention with dropout on the weights:
//   weights = dropout(softmax(masked_fill(Q K^T / sqrt(d_out), future, -inf)));  out = weights V
class CausalAttention : public attograd::nn::Module {
 public:
  // `qkv` sets the bias of the three projections (the tutorial's qkv_bias, off by default).
  CausalAttention(std::int64_t d_in, std::int64_t d_out, std::int64_t context_length, double dropout_p,
                  attograd::Generator& gen, attograd::nn::LinearOptions qkv = {.bias = false})
      : W_Q(d_in, d_out, gen, qkv),
        W_K(d_in, d_out, gen, qkv),
        W_V(d_in, d_out, gen, qkv),
        dropout(dropout_p),
        mask(future_mask(context_length)) {
    register_module("W_Q", W_Q);
    register_module("W_K", W_K);
    register_module("W_V", W_V);
    register_module("dropout", dropout);
  }

  // x (B, T, d_in) -> (B, T, d_out), T <= context_length.
  attograd::Tensor forward(const attograd::Tensor& x) const {
    using namespace attograd;
    const std::int64_t T = x.size(1);
    const Tensor Q = W_Q(x), K = W_K(x), V = W_V(x);  // (B, T, d_out)
    Tensor scores = matmul(Q, transpose(K, -2, -1)) / std::sqrt(static_cast<double>(K.size(-1)));  // (B, T, T)
    scores = masked_fill(scores, slice(slice(mask, 0, 0, T), 1, 0, T), -std::numeric_limits<double>::infinity());
    const Tensor weights = dropout(softmax(scores, -1));  // (B, T, T)
    return matmul(weights, V);                            // (B, T, d_out)
  }
  attograd::Tensor operator()(const attograd::Tensor& x) const { return forward(x); }

  attograd::nn::Linear W_Q, W_K, W_V;  // d_in -> d_out each
  attograd::nn::Dropout dropout;
  // (context_length, context_length) bool, true = hidden. torch registers it as
  // a buffer; nn::Module has parameters only, so here it is a plain member.
  attograd::Tensor mask;
};

}  // namespace examples
