#pragma once
// Scaled dot-product attention as one differentiable op:
//
//   out = dropout(softmax(q k^T / sqrt(D), hiding masked keys)) @ v
//
// on q (B, H, Tq, D), k and v (B, H, Tk, D). Two implementations, tested
// against each other:
//  - composed: matmul, masked_fill, softmax, dropout, matmul, each a
//    differentiable op (the reference, and what the fused path must equal);
//  - fused: kernels::attention_forward / _backward (cpu/attention/),
//    blocked with an online softmax. It needs no (Tq, Tk) matrix; within
//    saved_probs_limit it keeps the probabilities for the backward, tile by
//    tile, so that the backward need not recompute them.
//
// Semantics shared by both:
//  - causal: query i sees keys j <= i, aligned to the top-left corner when
//    Tq != Tk (as torch's is_causal); a flag, never a materialised matrix.
//  - mask: bool, broadcastable to (B, H, Tq, Tk), true = hidden.
//  - a query row whose keys are all hidden yields zeros (not NaN), and its
//    gradient is zero.
//  - dropout on the weights (inverted: kept weights scaled by 1/(1-p)) only
//    when training and dropout_p > 0. The mask is drawn at
//    (seed, offset = generator.reserve(B*H*Tq*Tk)) over the contiguous
//    (B, H, Tq, Tk) weights: weight i is dropped when
//    philox_uniform(seed, offset, i) < p, identically in both paths.
//  - return_weights gives the softmax weights (B, H, Tq, Tk) before dropout,
//    for inspection: they carry no gradient (in either path).
#include <cstdint>
#include <vector>

#include "tensor/rng.h"
#include "tensor/tensor.h"

namespace attograd {

enum class AttentionImpl {
  automatic,  // fused where the device has a fused kernel (the CPU does)
  fused,
  composed,
};

// AttentionOptions::saved_probs_limit: kAutoSavedProbsLimit (the default) keeps
// up to kDefaultSavedProbsLimit bytes on heads of kSavedProbsMinHeadDim values
// or more whose probabilities are no more values than their q, k, v and
// output (Tq Tk / 2 <= 2 (Tq + Tk) D when causal, so T <= 8 D), none on
// others. The saving per tile grows with D and its memory traffic does not:
// at D = 32 (the toy GPT's heads) keeping them made the attention alone faster
// but the whole training step slower, as the kept probabilities push the
// step's other operands out of the cache. And on long heads they would be most
// of a layer's activations (GPT-2's 1024 positions: twice its attention's
// inputs and output) for one tile product in five of the backward.
constexpr std::int64_t kAutoSavedProbsLimit = -1;
constexpr std::int64_t kDefaultSavedProbsLimit = std::int64_t(64) << 20;
constexpr std::int64_t kSavedProbsMinHeadDim = 64;

struct AttentionOptions {
  bool causal = false;
  Tensor mask{};                   // bool, broadcastable to (B, H, Tq, Tk); true = hidden
  double dropout_p = 0.0;          // on the attention weights
  bool training = true;            // dropout is the identity when false
  Generator* generator = nullptr;  // for dropout; nullptr = default_generator()
  bool return_weights = false;
  AttentionImpl impl = AttentionImpl::automatic;
  // The fused CPU path's forward keeps probabilities for the backward, up to
  // this many bytes (a head's take about Tq Tk / 2 values when causal, Tq Tk
  // otherwise), and only when the call records a graph: whole heads' of them,
  // as many as fit. The backward skips recomputing those, one tile product in
  // five, and recomputes the others' as FlashAttention does. At 0 memory stays
  // O(T) per head. kAutoSavedProbsLimit: see above.
  std::int64_t saved_probs_limit = kAutoSavedProbsLimit;
};

struct AttentionOutput {
  Tensor out;      // (B, H, Tq, D)
  Tensor weights;  // (B, H, Tq, Tk), when return_weights; no gradient
};

AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

// The bytes of probabilities a fused CPU call keeps for its backward while its
// graph lives, on `heads` (B * H) heads of head_dim values, Tq queries and Tk
// keys of element_bytes each, when it records a graph (none otherwise): the
// tiles of as many whole heads as options.saved_probs_limit allows.
std::int64_t saved_probs_bytes(const AttentionOptions& options, std::int64_t heads, std::int64_t Tq, std::int64_t Tk,
                               std::int64_t head_dim, std::int64_t element_bytes);

// (B, T, n * H * D) holding n projections side by side (q, k, v of a packed
// Linear) -> n differentiable (B, H, T, D) views of it, no copy.
std::vector<Tensor> split_packed_heads(const Tensor& packed, std::int64_t n, std::int64_t heads);

// Self-attention on one packed projection, as MultiHeadAttention's qkv Linear
// makes it: qkv (B, T, 3 * num_heads * D) holds q, k, v side by side, each
// (num_heads, D) per token. Equal to attention() on the three (B, H, T, D)
// views of it, but the fused path is one op whose backward writes the packed
// gradient d(qkv) directly, where three separate views would each need a
// zero-filled qkv-sized gradient and two additions to combine them. qkv may
// also be (B, 3, num_heads, T, D), as linear_heads writes it (each head's rows
// back to back, which the fused kernel reads with no copies); its gradient
// then lies (B, T, 3, num_heads, D) in memory, as linear_heads' backward reads it.
AttentionOutput attention_packed(const Tensor& qkv, std::int64_t num_heads, const AttentionOptions& options = {});

}  // namespace attograd
