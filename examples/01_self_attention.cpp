// 01 - Self-attention from scratch.
//
// Follows "Understand Attention in an Intuitive Way" (seeds/002), from the five
// tokens "Once upon a time there" to the context vectors:
//
//   X = Embedding(tokens)         (5, 4)   one row per token
//   Q = X W_Q, K = X W_K, V = X W_V        W_* are (4, 4) uniform random, as torch.rand
//   scores  = Q K^T / sqrt(4)     (5, 5)   how well query i matches key j
//   weights = softmax(scores)     (5, 5)   each row sums to 1
//   context = weights V           (5, 4)   row i mixes the value rows by row i's weights
//
// What to look at: the shapes (the context has the input's shape again), and
// in each row of the weights, which keys that query favours. The numbers differ
// from the tutorial's: attograd has its own random generator, not torch's.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "check.h"
#include "nn/layers.h"
#include "tensor/rng.h"

using namespace attograd;
using examples::check;

int main() {
  try {
    // A toy tokenizer: each word is its own token, numbered in order of appearance.
    const std::vector<std::string> tokens = {"Once", "upon", "a", "time", "there"};
    std::map<std::string, std::int64_t> token_to_idx;
    for (const auto& token : tokens) token_to_idx.emplace(token, static_cast<std::int64_t>(token_to_idx.size()));

    const std::int64_t T = static_cast<std::int64_t>(tokens.size()), embedding_dim = 4;
    manual_seed(123);
    nn::Embedding embedding_layer(T, embedding_dim, default_generator());
    std::vector<std::int64_t> ids;
    for (const auto& token : tokens) ids.push_back(token_to_idx.at(token));
    const Tensor input_indices = from_vector(ids, {T});  // [0, 1, 2, 3, 4]
    const Tensor X = embedding_layer(input_indices);     // (T, C)
    std::cout << "shape of input X: " << shape_str(X.sizes()) << '\n' << X << "\n\n";

    // The tutorial's W_Q, W_K, W_V are Parameters with requires_grad=False:
    // plain tensors here, and nothing below records a graph.
    NoGradGuard no_grad;
    const Tensor W_Q = rand({embedding_dim, embedding_dim});  // (C, C), U[0, 1)
    const Tensor W_K = rand({embedding_dim, embedding_dim});
    const Tensor W_V = rand({embedding_dim, embedding_dim});
    std::cout << "shape of W_Q: " << shape_str(W_Q.sizes()) << "\nW_Q: " << W_Q << "\n\n";

    const Tensor Q = matmul(X, W_Q);  // (T, C) @ (C, C) -> (T, C)
    const Tensor K = matmul(X, W_K);
    const Tensor V = matmul(X, W_V);
    std::cout << "shape of Q: " << shape_str(Q.sizes()) << "\nQ: " << Q << "\n\n";

    const Tensor scores = matmul(Q, transpose(K, 0, 1));  // (T, C) @ (C, T) -> (T, T)
    std::cout << "shape of scores: " << shape_str(scores.sizes()) << "\nscores: " << scores << "\n\n";

    // Scaling by sqrt(d) keeps the softmax below from saturating on one key.
    const Tensor attention_scores = scores / std::sqrt(static_cast<double>(embedding_dim));
    std::cout << "attention_scores: " << attention_scores << "\n\n";

    const Tensor attention_weights = softmax(attention_scores, -1);  // (T, T)
    std::cout << "shape of attention_weights: " << shape_str(attention_weights.sizes()) << '\n'
              << attention_weights << "\n\n";

    const Tensor output = matmul(attention_weights, V);  // (T, T) @ (T, C) -> (T, C)
    std::cout << "shape of output: " << shape_str(output.sizes()) << '\n' << output << "\n\n";

    std::cout << "claims:\n";
    check(X.sizes() == Shape{T, embedding_dim} && Q.sizes() == Shape{T, embedding_dim},
          "X and Q are (5, 4)");
    check(attention_weights.sizes() == Shape{T, T}, "the attention weights are (5, 5)");
    check(output.sizes() == X.sizes(), "the context vectors have the input's shape (5, 4)");

    const std::vector<double> w = attention_weights.to_vector<double>();
    bool rows_sum_to_one = true;
    for (std::int64_t i = 0; i < T; ++i) {
      double row_sum = 0;
      for (std::int64_t j = 0; j < T; ++j) row_sum += w[i * T + j];
      rows_sum_to_one = rows_sum_to_one && std::fabs(row_sum - 1.0) < 1e-6;
    }
    check(rows_sum_to_one, "each row of the attention weights sums to 1 (within 1e-6)");

    // context[i] = sum_j weights[i][j] * V[j], one row at a time, in double.
    const std::vector<double> v = V.to_vector<double>(), out = output.to_vector<double>();
    double largest_error = 0;
    for (std::int64_t i = 0; i < T; ++i) {
      for (std::int64_t c = 0; c < embedding_dim; ++c) {
        double context = 0;
        for (std::int64_t j = 0; j < T; ++j) context += w[i * T + j] * v[j * embedding_dim + c];
        const double error = std::fabs(context - out[i * embedding_dim + c]);
        if (!(error <= largest_error)) largest_error = error;  // NaN wins
      }
    }
    std::cout << "  largest difference from the hand-computed rows: " << largest_error << '\n';
    check(largest_error < 1e-5, "context = weights @ V, row by row by hand (within 1e-5)");
  } catch (const Error& e) {
    std::cerr << "attograd error: " << e.what() << '\n';
    return 1;
  }
  return examples::exit_code();
}
