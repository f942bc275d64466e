// 05 - Separate query, key and value: cross-attention.
//
// Follows seeds/000's MultiHeadAttention.forward(query, key, value, mask):
// self-attention is the case query = key = value = x; in cross-attention
// (a decoder reading an encoder's output, say) the queries come from one
// sequence of Tq tokens and the keys and values from another of Tk tokens:
//   Q = query W_q^T (B, Tq, C),  K = key W_k^T, V = value W_v^T (B, Tk, C)
//   split into heads (B, H, T, D), weights = softmax(Q K^T / sqrt(D)) (B, H, Tq, Tk)
//   out = concat_heads(weights V) W_o^T (B, Tq, C)
// nn::MultiHeadAttention::forward(query, key, value, {.return_weights = true})
// also returns the weights per head, (B, H, Tq, Tk); torch's
// nn.MultiheadAttention (batch_first=True) returns their mean over heads by
// default (average_attn_weights=True), shown here too.
//
// What to look at: the weights are Tq x Tk, not square; each head spreads its
// attention differently; the hand-composed path below gives the same output.
#include <cmath>
#include <cstdint>
#include <iostream>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "check.h"
#include "nn/attention.h"
#include "tensor/rng.h"

using namespace attograd;
using examples::check;
using examples::max_abs_diff;

int main() {
  try {
    NoGradGuard no_grad;
    const std::int64_t B = 2, Tq = 3, Tk = 5, C = 8, H = 2, D = C / H;
    manual_seed(2024);
    const Tensor query = randn({B, Tq, C});  // e.g. the decoder's tokens
    const Tensor key = randn({B, Tk, C});    // e.g. the encoder's tokens ...
    const Tensor value = randn({B, Tk, C});  // ... (usually the same tensor as key)

    nn::MultiHeadAttention mha({.d_model = C, .num_heads = H}, default_generator());
    const nn::AttendResult result = mha.forward(query, key, value, {.return_weights = true});
    std::cout << "output: " << shape_str(result.out.sizes()) << " (B, Tq, C)\n"
              << "weights: " << shape_str(result.weights.sizes()) << " (B, H, Tq, Tk)\n\n";
    std::cout << "weights of batch 0, head 0:\n" << select(select(result.weights, 0, 0), 0, 0) << '\n'
              << "weights of batch 0, head 1:\n" << select(select(result.weights, 0, 0), 0, 1) << "\n\n";
    const Tensor averaged = mean(result.weights, {1});  // (B, Tq, Tk), torch's default
    std::cout << "averaged over heads (torch's average_attn_weights=True), batch 0:\n"
              << select(averaged, 0, 0) << "\n\n";

    // The same computation composed by hand from the module's parameter views.
    auto split_heads = [&](const Tensor& projected) {  // (B, T, C) -> (B, H, T, D)
      return transpose(view(projected, {B, projected.size(1), H, D}), 1, 2);
    };
    const Tensor Q = split_heads(linear(query, mha.w_q(), mha.b_q()));  // (B, H, Tq, D)
    const Tensor K = split_heads(linear(key, mha.w_k(), mha.b_k()));    // (B, H, Tk, D)
    const Tensor V = split_heads(linear(value, mha.w_v(), mha.b_v()));  // (B, H, Tk, D)
    const Tensor weights = softmax(matmul(Q, transpose(K, -2, -1)) / std::sqrt(static_cast<double>(D)), -1);
    const Tensor heads = matmul(weights, V);                                   // (B, H, Tq, D)
    const Tensor merged = reshape(transpose(heads, 1, 2), {B, Tq, C});         // (B, Tq, C)
    const Tensor by_hand = linear(merged, mha.out_proj.weight, mha.out_proj.bias);
    std::cout << "output, batch 0 (module):\n" << select(result.out, 0, 0) << '\n'
              << "output, batch 0 (by hand):\n" << select(by_hand, 0, 0) << "\n\n";

    std::cout << "claims:\n";
    check(result.out.sizes() == Shape{B, Tq, C}, "the output has the query's shape (2, 3, 8)");
    check(result.weights.sizes() == Shape{B, H, Tq, Tk}, "the weights are (B, H, Tq, Tk) = (2, 2, 3, 5)");
    check(max_abs_diff(sum(result.weights, {-1}), ones({B, H, Tq})) < 1e-6 &&
              max_abs_diff(sum(averaged, {-1}), ones({B, Tq})) < 1e-6,
          "every row of weights sums to 1, per head and averaged (1e-6)");
    check(max_abs_diff(result.weights, weights) < 1e-6, "the returned weights equal softmax(Q K^T / sqrt(D)) by hand (1e-6)");
    check(max_abs_diff(result.out, by_hand) < 1e-5, "the output equals the path composed from w_q(), w_k(), w_v() (1e-5)");
  } catch (const Error& e) {
    std::cerr << "attograd error: " << e.what() << '\n';
    return 1;
  }
  return examples::exit_code();
}
