#pragma once
// One fused attention problem as the kernels of every device read it: raw
// pointers, sizes and strides, no tensors. tensor/attention_call.h builds it
// once from checked tensors; the CPU kernels (cpu/attention/) and the
// CUDA kernels (cuda/attention*.cu) both take it, so the two agree on which
// key a query sees and which weight dropout drops.
//
//   out = dropout(softmax(scale q k^T, hidden keys at -inf)) @ v
//
// over (B, H, T, D) operands. A key is hidden from a query by the causal flag
// (j > i, top-left aligned as torch's is_causal) or by the boolean mask (true
// = hidden). A row whose keys are all hidden has no softmax: its output and
// gradients are zero and its log-sum-exp is -inf. Dropout drops weight
// (b, h, i, j) when philox_uniform(seed, offset, ((b*H + h)*Tq + i)*Tk + j) is
// below float(p) (what kernels::dropout_mask draws over the contiguous
// (B, H, Tq, Tk) weights) and scales the kept ones by 1 / (1 - p).
#include <cstdint>

#include "base/host_device.h"
#include "base/philox.h"

namespace attograd {

// A (B, H, T, D) operand: row (b, h, t) starts at data + b*sb + h*sh + t*st,
// and its D elements are contiguous. T is const for the inputs.
template <typename T>
struct AttentionRows {
  T* data;
  std::int64_t sb, sh, st;  // strides of B, H and T, in elements
  AG_HOST_DEVICE T* row(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return data + b * sb + h * sh + t * st;
  }
};

template <typename T>
struct AttentionProblem {
  AttentionRows<const T> q, k, v;
  std::int64_t B, H, Tq, Tk, D;
  T scale;                                      // usually 1 / sqrt(D)
  bool causal;                                  // key j hidden from query i when j > i
  const bool* mask = nullptr;                   // true = hidden, broadcast through mask_strides
  std::int64_t mask_strides[4] = {0, 0, 0, 0};  // over (B, H, Tq, Tk), 0 on broadcast dims
  float dropout_threshold = 0;                  // float(p): a weight is dropped when its draw is below it
  T keep_scale = 1;                             // 1 / (1 - p), the factor of a kept weight
  std::uint64_t seed = 0, offset = 0;           // of the dropout stream
  // The same, as the CUDA kernels read them: a weight is dropped when its
  // draw's bits are below drop_below (drop_bits_below), drawn with the seed's
  // round keys.
  std::uint32_t drop_below = 0;
  PhiloxRoundKeys round_keys{};

  // Dropout of probability `probability` drawn from (seed, offset): every field above that says so.
  void set_dropout(double probability, std::uint64_t stream_seed, std::uint64_t stream_offset) {
    dropout_threshold = static_cast<float>(probability);  // compared with float32 draws, as kernels::dropout_mask
    keep_scale = static_cast<T>(1.0 / (1.0 - probability));
    seed = stream_seed, offset = stream_offset;
    drop_below = drop_bits_below(dropout_threshold);
    round_keys = philox_round_keys(seed);
  }

  AG_HOST_DEVICE bool dropout() const { return dropout_threshold > 0; }
  // Keys [0, visible_end(i)) can be visible to query i.
  AG_HOST_DEVICE std::int64_t visible_end(std::int64_t i) const { return causal && i + 1 < Tk ? i + 1 : Tk; }
  // Mask row (b, h, i): its key j is at [j * mask_strides[3]]. Only with a mask.
  AG_HOST_DEVICE const bool* mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return mask + b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2];
  }
  // Key j is hidden from query i: out of range, in the causal future, or masked.
  AG_HOST_DEVICE bool hidden(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (i >= Tq || j >= Tk || (causal && j > i)) return true;
    return mask != nullptr && mask_row(b, h, i)[j * mask_strides[3]];
  }
  // The position of weight (b, h, i, j) in the dropout stream: its flat index
  // in a contiguous (B, H, Tq, Tk) tensor.
  AG_HOST_DEVICE std::uint64_t weight_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return static_cast<std::uint64_t>(((b * H + h) * Tq + i) * Tk + j);
  }
  // Weight (b, h, i, j)'s dropout factor: 0 when dropped, else keep_scale.
  AG_HOST_DEVICE T dropout_factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return philox_uniform(seed, offset, weight_index(b, h, i, j)) < dropout_threshold ? T(0) : keep_scale;
  }
};

}  // namespace attograd
