// 02 - Causal attention: hide the future, then drop out some weights.
//
// Follows seeds/002 from "Casual Attention: Mask future words" to the
// CausalAttention class. A language model predicts token i+1 from tokens
// 0..i, so query i must not see keys j > i. The tutorial hides them two ways:
//   1. add a matrix that is 0 on and below the diagonal and -inf above it,
//      built from tril(ones) with masked_fill;
//   2. masked_fill(scores, upper triangle, -inf) with a bool mask (true = hide).
// Either way softmax turns -inf into a weight of exactly 0.
// Then dropout (p = 0.2): in training each value is zeroed with probability p
// and the rest are scaled by 1/(1-p) = 1.25 so the mean stays 1; in
// evaluation mode it is the identity.
//
// What to look at: the -inf triangle in the masked scores, the zero triangle
// in the weights, the 1.25s after dropout, and the CausalAttention output.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "causal_attention.h"
#include "check.h"
#include "nn/layers.h"
#include "tensor/rng.h"

using namespace attograd;
using examples::check;
using examples::max_abs_diff;

int main() {
  try {
    NoGradGuard no_grad;  // nothing here is trained
    const double inf = std::numeric_limits<double>::infinity();

    // The attention scores of example 01 ("Once upon a time there", C = 4).
    const std::int64_t T = 5, C = 4;
    manual_seed(123);
    nn::Embedding embedding_layer(T, C, default_generator());
    const Tensor X = embedding_layer(arange(T, {DType::i64}));  // (T, C)
    const Tensor W_Q = rand({C, C}), W_K = rand({C, C});
    const Tensor attention_scores =
        matmul(matmul(X, W_Q), transpose(matmul(X, W_K), 0, 1)) / std::sqrt(static_cast<double>(C));  // (T, T)

    // Way 1: an additive mask. tril(ones): 1 where key j <= query i.
    const Tensor future = examples::future_mask(T);                   // (T, T) bool, true above the diagonal
    const Tensor tril = where(future, zeros({T, T}), ones({T, T}));  // torch.tril(torch.ones(T, T))
    std::cout << "tril(ones):\n" << tril << "\n\n";
    const Tensor additive =
        masked_fill(masked_fill(tril, eq(tril, scalar_tensor(0)), -inf), eq(tril, scalar_tensor(1)), 0.0);
    std::cout << "additive mask:\n" << additive << "\n\n";
    std::cout << "original scores:\n" << attention_scores << "\n\n";
    const Tensor masked_scores = attention_scores + additive;
    std::cout << "masked scores:\n" << masked_scores << "\n\n";
    const Tensor weights = softmax(masked_scores, -1);
    std::cout << "weights after mask:\n" << weights << "\n\n";

    // Way 2: masked_fill with the bool mask, as CausalAttention does.
    const Tensor filled_scores = masked_fill(attention_scores, future, -inf);
    const Tensor filled_weights = softmax(filled_scores, -1);

    // Dropout on a 5x5 matrix of ones: kept values become 1 / (1 - 0.2) = 1.25.
    manual_seed(123);
    nn::Dropout dropout(0.2);
    dropout.train();  // modules start in training mode; said explicitly, as the tutorial does
    const Tensor example = ones({5, 5});
    const Tensor dropped = dropout(example);
    const Tensor dropped_zeros = eq(dropped, scalar_tensor(0));
    std::cout << "tensor after Dropout:\n" << dropped << '\n';
    std::cout << "Number of zeros in output: " << sum(to(dropped_zeros, DType::f32)).item() << '\n';
    std::cout << "Output mean value (should be ~1.0 due to scaling): " << mean(dropped).item() << "\n\n";
    // Small matrices are noisy; 500 x 500 shows the expected rates.
    const Tensor big = dropout(ones({500, 500}));
    const double big_zero_fraction = mean(to(eq(big, scalar_tensor(0)), DType::f32)).item();
    const double big_mean = mean(big).item();
    std::cout << "500x500: fraction of zeros " << big_zero_fraction << ", mean " << big_mean << "\n\n";
    std::cout << "weights after Dropout:\n" << dropout(weights) << "\n\n";
    dropout.eval();
    const Tensor evaluated = dropout(example);

    // CausalAttention on a batch of 2 sequences of 5 tokens, 4 features each.
    manual_seed(123);
    const Tensor batch = randn({2, 5, 4});  // (B, T, d_in)
    const std::int64_t d_in = 4, d_out = 4, context_length = batch.size(1);
    examples::CausalAttention ca(d_in, d_out, context_length, /*dropout_p=*/0.0, default_generator());
    const Tensor context_vecs = ca(batch);
    std::cout << "context_vecs.shape: " << shape_str(context_vecs.sizes()) << "\ncontext_vecs:\n"
              << context_vecs << "\n\n";
    // Change the last two tokens of both sequences: outputs 0..2 must not move.
    const Tensor changed_batch = cat({slice(batch, 1, 0, 3), randn({2, 2, 4})}, 1);
    const Tensor changed_vecs = ca(changed_batch);

    std::cout << "claims:\n";
    check(max_abs_diff(masked_scores, filled_scores) == 0 && max_abs_diff(weights, filled_weights) == 0,
          "the additive 0/-inf mask and masked_fill give identical scores and weights");
    const std::vector<double> w = weights.to_vector<double>();
    bool zero_above = true;
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t j = i + 1; j < T; ++j) zero_above = zero_above && w[i * T + j] == 0.0;
    check(zero_above, "every weight above the diagonal is exactly 0");
    check(max_abs_diff(sum(weights, {-1}), ones({T})) < 1e-6, "each row of the masked weights still sums to 1");

    bool kept_exact = true;
    for (double value : dropped.to_vector<double>()) kept_exact = kept_exact && (value == 0.0 || value == 1.25);
    for (double value : big.to_vector<double>()) kept_exact = kept_exact && (value == 0.0 || value == 1.25);
    check(kept_exact, "dropout keeps a value as exactly 1/(1-p) = 1.25 or zeroes it");
    check(std::fabs(big_zero_fraction - 0.2) < 0.01 && std::fabs(big_mean - 1.0) < 0.01,
          "on 500x500 ones about 20% are zeroed and the mean stays about 1");
    check(max_abs_diff(evaluated, example) == 0, "in evaluation mode dropout is the identity");

    check(context_vecs.sizes() == Shape{2, 5, 4}, "CausalAttention maps (2, 5, 4) to (2, 5, 4)");
    check(max_abs_diff(slice(changed_vecs, 1, 0, 3), slice(context_vecs, 1, 0, 3)) == 0,
          "changing tokens 3 and 4 leaves the outputs of positions 0..2 unchanged");
    check(max_abs_diff(slice(changed_vecs, 1, 3, 5), slice(context_vecs, 1, 3, 5)) > 0,
          "(and the change does reach positions 3 and 4)");
  } catch (const Error& e) {
    std::cerr << "attograd error: " << e.what() << '\n';
    return 1;
  }
  return examples::exit_code();
}
