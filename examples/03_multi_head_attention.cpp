// 03 - Multi-head attention, two ways, one answer.
//
// Follows seeds/002 "Multi-Head Attention" (and the MHA classes of seeds/000,
// 001, 004). H heads each attend in their own D = C / H dimensional subspace:
//   stacked: H separate CausalAttention heads (C -> D each), outputs
//            concatenated on the last dim (the tutorial's MultiHeadAttentionWrapper);
//   split:   one C -> C projection per Q, K, V, cut into heads by
//            view (B, T, H, D) + transpose -> (B, H, T, D) (the tutorial's
//            MultiHeadAttention, and attograd's nn::MultiHeadAttention).
// Head h of the split form uses rows [h*D, (h+1)*D) of each projection, so
// copying those rows into stacked head h makes the two forms the same
// function. Both then go through the same output projection W_O (the wrapper
// has none of its own). Scores are divided by sqrt(D), the head size: the
// tutorial's split class divides by sqrt(d_out) of the whole layer, which
// would make the two forms differ.
//
// What to look at: the (B, H, T, D) shapes, and the max differences at the
// end, which are float32 rounding (about 1e-7).
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/attention.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "causal_attention.h"
#include "check.h"
#include "nn/attention.h"
#include "nn/module.h"
#include "tensor/rng.h"

using namespace attograd;
using examples::check;
using examples::max_abs_diff;

// The tutorial's MultiHeadAttentionWrapper: num_heads single heads side by side.
class MultiHeadAttentionWrapper : public nn::Module {
 public:
  MultiHeadAttentionWrapper(std::int64_t d_in, std::int64_t d_out, std::int64_t context_length, double dropout_p,
                            std::int64_t num_heads, Generator& gen) {
    AG_CHECK(d_out % num_heads == 0, "MultiHeadAttentionWrapper", "d_out {} is not divisible by num_heads {}",
             d_out, num_heads);
    for (std::int64_t h = 0; h < num_heads; ++h)
      heads.append(std::make_unique<examples::CausalAttention>(d_in, d_out / num_heads, context_length, dropout_p, gen));
    register_module("heads", heads);
  }
  // x (B, T, d_in) -> (B, T, d_out): each head gives (B, T, D), concatenated on the last dim.
  Tensor forward(const Tensor& x) const {
    std::vector<Tensor> outputs;
    for (const auto& head : heads) outputs.push_back((*head)(x));
    return cat(outputs, -1);
  }
  Tensor operator()(const Tensor& x) const { return forward(x); }

  nn::ModuleList<examples::CausalAttention> heads;
};

int main() {
  try {
    NoGradGuard no_grad;
    manual_seed(123);
    const Tensor batch = randn({2, 5, 6});  // (B, T, C)
    const std::int64_t B = 2, T = 5, C = 6, H = 2, D = C / H;

    // The split form: attograd's module (packed q/k/v projection, causal flag).
    nn::MultiHeadAttention mha({.d_model = C, .num_heads = H, .bias = false, .causal = true}, default_generator());
    // The stacked form, then the split form's weights copied into its heads.
    MultiHeadAttentionWrapper wrapper(C, C, T, /*dropout_p=*/0.0, H, default_generator());
    for (std::int64_t h = 0; h < H; ++h) {
      wrapper.heads[h].load_state_dict({{"W_Q.weight", narrow(mha.w_q(), 0, h * D, D)},
                                        {"W_K.weight", narrow(mha.w_k(), 0, h * D, D)},
                                        {"W_V.weight", narrow(mha.w_v(), 0, h * D, D)}});
    }
    const Tensor stacked = mha.out_proj(wrapper(batch));
    std::cout << "stacked heads, concatenated, then W_O: shape " << shape_str(stacked.sizes()) << '\n'
              << stacked << "\n\n";

    // The split form written out, as the tutorial's MultiHeadAttention.forward:
    // (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
    auto split_heads = [&](const Tensor& projected) { return transpose(view(projected, {B, T, H, D}), 1, 2); };
    const Tensor Q = split_heads(linear(batch, mha.w_q()));
    const Tensor K = split_heads(linear(batch, mha.w_k()));
    const Tensor V = split_heads(linear(batch, mha.w_v()));
    std::cout << "Q, K, V split into heads: " << shape_str(Q.sizes()) << " (B, H, T, D)\n";
    Tensor scores = matmul(Q, transpose(K, -2, -1)) / std::sqrt(static_cast<double>(D));  // (B, H, T, T)
    scores = masked_fill(scores, examples::future_mask(T), -std::numeric_limits<double>::infinity());
    const Tensor heads_out = matmul(softmax(scores, -1), V);  // (B, H, T, D)
    // (B, H, T, D) -> (B, T, H, D) -> (B, T, C): the heads side by side again.
    auto merge_heads = [&](const Tensor& x) { return view(contiguous(transpose(x, 1, 2)), {B, T, C}); };
    const Tensor split = mha.out_proj(merge_heads(heads_out));
    std::cout << "one projection split by view + transpose: shape " << shape_str(split.sizes()) << '\n'
              << split << "\n\n";

    // The same heads through attograd's attention op (fused: no (T, T) matrix kept).
    const Tensor fused = mha.out_proj(merge_heads(attention(Q, K, V, {.causal = true}).out));
    const Tensor module = mha(batch);

    const double stacked_vs_split = max_abs_diff(stacked, split);
    const double fused_vs_split = max_abs_diff(fused, split);
    const double module_vs_split = max_abs_diff(module, split);
    std::cout << "max |stacked - split|               = " << stacked_vs_split << '\n'
              << "max |attention(causal=true) - split| = " << fused_vs_split << '\n'
              << "max |nn::MultiHeadAttention - split| = " << module_vs_split << "\n\n";

    // float32 rounding on values of size ~1 through a few matmuls and a softmax.
    const double tolerance = 1e-5;
    std::cout << "claims:\n";
    check(stacked.sizes() == Shape{B, T, C} && split.sizes() == Shape{B, T, C}, "both forms map (2, 5, 6) to (2, 5, 6)");
    check(Q.sizes() == Shape{B, H, T, D}, "the split heads are (B, H, T, D) = (2, 2, 5, 3)");
    check(stacked_vs_split < tolerance, "stacked heads with copied weights equal the split projection (1e-5)");
    check(fused_vs_split < tolerance, "attention(q, k, v, {.causal = true}) equals the composed masked softmax (1e-5)");
    check(module_vs_split < tolerance, "nn::MultiHeadAttention equals the split form written out (1e-5)");
  } catch (const Error& e) {
    std::cerr << "attograd error: " << e.what() << '\n';
    return 1;
  }
  return examples::exit_code();
}
