// 04 - A padding mask, and the row that has nothing to attend to.
//
// Follows seeds/003 (hand-written MHA with attention_mask). Sequences of
// different lengths are padded to one length T; an attention mask (B, T) says
// which positions hold real tokens (1) and which are padding (0). Every query
// must ignore padded keys, so the mask is broadcast over heads and queries:
//   (B, T) -> unsqueeze(1).unsqueeze(2) -> (B, 1, 1, T) -> expand (B, H, T, T)
// and scores.masked_fill(mask == 0, -inf) before the softmax.
//
// A sequence that is all padding (the tutorial's mask has one: row [0, 0])
// leaves its queries with every key at -inf: softmax computes 0/0 = NaN, and
// the NaN flows into the output (and, in training, into every gradient).
// attograd's attention op defines that case instead: such a row gets zero
// weights and a zero output, so nn::MultiHeadAttention returns just the output
// projection's bias there.
//
// What to look at: the nan rows of sequence 2 in the composed path, the zeros
// in the same place from attention(), and the 0 weights on padded keys.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

#include "autograd/attention.h"
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
    const std::int64_t B = 3, T = 4, C = 8, H = 2, D = C / H;
    const std::vector<std::int64_t> lengths = {4, 2, 0};  // sequence 2 is all padding

    // 1 = real token, 0 = padding, as a tokenizer's attention_mask.
    const Tensor attention_mask = from_vector<std::int64_t>({1, 1, 1, 1,  //
                                                             1, 1, 0, 0,  //
                                                             0, 0, 0, 0},
                                                            {B, T});
    std::cout << "attention_mask (1 = token, 0 = padding):\n" << attention_mask << "\n\n";
    // attograd's masks say true = hidden, so hidden = (attention_mask == 0).
    // (Comparisons take floating tensors, hence the cast.)
    const Tensor hidden = eq(to(attention_mask, DType::f32), scalar_tensor(0));         // (B, T) bool
    const Tensor key_mask = unsqueeze(unsqueeze(hidden, 1), 2);                         // (B, 1, 1, T)
    std::cout << "unsqueeze(1).unsqueeze(2): " << shape_str(key_mask.sizes()) << '\n';
    const Tensor expanded = expand(key_mask, {B, H, T, T});                             // (B, H, T, T), no copy
    std::cout << "expand(B, H, T, T):       " << shape_str(expanded.sizes()) << "\n\n";

    // Queries, keys and values of a batch of 3 padded sequences, split into heads.
    manual_seed(7);
    const Tensor x = rand({B, T, C});
    nn::MultiHeadAttention mha({.d_model = C, .num_heads = H}, default_generator());
    auto split_heads = [&](const Tensor& projected) { return transpose(view(projected, {B, T, H, D}), 1, 2); };
    const Tensor Q = split_heads(linear(x, mha.w_q(), mha.b_q()));  // (B, H, T, D)
    const Tensor K = split_heads(linear(x, mha.w_k(), mha.b_k()));
    const Tensor V = split_heads(linear(x, mha.w_v(), mha.b_v()));

    // The composed path of the tutorial.
    const Tensor scores = matmul(Q, transpose(K, -2, -1)) / std::sqrt(static_cast<double>(D));  // (B, H, T, T)
    const Tensor masked = masked_fill(scores, expanded, -std::numeric_limits<double>::infinity());
    const Tensor weights = softmax(masked, -1);  // (B, H, T, T)
    const Tensor composed = matmul(weights, V);  // (B, H, T, D)
    std::cout << "weights of sequence 1 (length 2), head 0:\n" << select(select(weights, 0, 1), 0, 0) << "\n\n";
    std::cout << "weights of sequence 2 (all padding), head 0: softmax of a row of -inf\n"
              << select(select(weights, 0, 2), 0, 0) << "\n\n";

    // attograd's attention op with the (B, 1, 1, T) mask: it broadcasts by itself.
    const AttentionOutput op = attention(Q, K, V, {.mask = key_mask, .return_weights = true});
    std::cout << "attention() output of sequence 2, head 0:\n" << select(select(op.out, 0, 2), 0, 0) << "\n\n";

    // The module, with nn::key_padding_mask building the same (B, 1, 1, T) mask from lengths.
    const Tensor padding_mask = nn::key_padding_mask(lengths, T);
    const Tensor module_out = mha.forward(x, x, x, {.mask = padding_mask}).out;  // (B, T, C)
    std::cout << "nn::MultiHeadAttention output of sequence 2:\n" << select(module_out, 0, 2) << '\n'
              << "out_proj.bias:\n" << mha.out_proj.bias << "\n\n";

    std::cout << "claims:\n";
    bool all_nan = true;
    for (double w : select(weights, 0, 2).to_vector<double>()) all_nan = all_nan && std::isnan(w);
    for (double o : select(composed, 0, 2).to_vector<double>()) all_nan = all_nan && std::isnan(o);
    check(all_nan, "composed masked_fill(-inf) + softmax gives NaN weights and outputs for the all-padding sequence");

    // Padded keys (j >= length) get exactly 0 weight, in both paths, for every head and query.
    const std::vector<double> composed_w = weights.to_vector<double>(), op_w = op.weights.to_vector<double>();
    bool padded_keys_zero = true;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t row = 0; row < H * T; ++row)
        for (std::int64_t j = lengths[b]; j < T; ++j) {
          const std::size_t at = static_cast<std::size_t>((b * H * T + row) * T + j);
          padded_keys_zero = padded_keys_zero && op_w[at] == 0.0 && (lengths[b] == 0 || composed_w[at] == 0.0);
        }
    check(padded_keys_zero, "padded keys get exactly 0 weight");

    check(max_abs_diff(select(op.out, 0, 2), zeros({H, T, D})) == 0 &&
              max_abs_diff(select(op.weights, 0, 2), zeros({H, T, T})) == 0,
          "attention() gives the all-padding sequence zero weights and a zero output, not NaN");
    check(max_abs_diff(slice(op.out, 0, 0, 2), slice(composed, 0, 0, 2)) < 1e-5,
          "where some key is visible, attention() equals the composed path (1e-5)");
    check(max_abs_diff(padding_mask, key_mask) == 0, "nn::key_padding_mask({4, 2, 0}, 4) is the mask built by hand");
    check(max_abs_diff(select(module_out, 0, 2), expand(unsqueeze(mha.out_proj.bias, 0), {T, C})) == 0,
          "nn::MultiHeadAttention returns out_proj.bias for the all-padding sequence");
  } catch (const Error& e) {
    std::cerr << "attograd error: " << e.what() << '\n';
    return 1;
  }
  return examples::exit_code();
}
