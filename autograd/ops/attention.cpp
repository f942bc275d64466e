// The attention op (autograd/attention.h): the composed reference path, built
// from differentiable ops, and the fused path, whose backward is the fused
// kernel's. Both draw dropout the same way so they agree bit for bit on which
// weights are dropped.
#include "autograd/attention.h"

#include <array>
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {
namespace {

// The causal pattern as a bool (Tq, Tk) matrix on `device`, true above the
// diagonal (hidden). Only the composed path materialises it.
Tensor causal_mask(std::int64_t tq, std::int64_t tk, Device device) {
  Tensor m = empty({tq, tk}, {DType::b8});
  bool* p = m.data<bool>();
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) p[i * tk + j] = j > i;
  return kernels::to_device(m, device);
}

AttentionOutput attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                   double scale, bool dropout_on, std::uint64_t seed, std::uint64_t offset) {
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2);
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);  // (B, H, Tq, Tk)
  Tensor hidden;  // bool, broadcastable to (B, H, Tq, Tk): causal or masked
  if (o.causal) hidden = causal_mask(Tq, Tk, q.device());
  if (o.mask.defined()) hidden = hidden.defined() ? kernels::where(o.mask, full({}, 1, {DType::b8, q.device()}), hidden) : o.mask;
  Tensor all_hidden;  // (..., Tq, 1): rows with no visible key
  if (hidden.defined()) {
    // softmax of a row of -inf is 0/0. Such rows are unhidden for the softmax
    // (so it stays finite) and zeroed after it, which also zeroes their gradient.
    const Tensor hidden_count = kernels::sum(kernels::cast(hidden, q.dtype()), {static_cast<int>(hidden.dim()) - 1},
                                             /*keepdim=*/true);
    all_hidden = kernels::binary(kernels::Binary::eq, hidden_count, full({}, static_cast<double>(Tk), q.options()));
    hidden = kernels::where(all_hidden, full({}, 0, {DType::b8, q.device()}), hidden);
    scores = masked_fill(scores, hidden, -std::numeric_limits<double>::infinity());
  }
  Tensor weights = softmax(scores, -1);  // (B, H, Tq, Tk)
  if (all_hidden.defined()) weights = masked_fill(weights, all_hidden, 0.0);
  Tensor dropped = weights;
  if (dropout_on) dropped = mul(weights, kernels::dropout_mask({B, H, Tq, Tk}, o.dropout_p, seed, offset, q.options()));
  AttentionOutput result;
  result.out = matmul(dropped, v);  // (B, H, Tq, D)
  if (o.return_weights) result.weights = weights.detach();
  return result;
}

// The bytes of probabilities a fused call on heads of head_dim values, Tq
// queries and Tk keys, may keep (autograd/attention.h's automatic rule).
std::int64_t saved_probs_budget(const AttentionOptions& o, std::int64_t Tq, std::int64_t Tk, std::int64_t head_dim) {
  if (o.saved_probs_limit != kAutoSavedProbsLimit) return o.saved_probs_limit;
  const std::int64_t probs = o.causal ? Tq * Tk / 2 : Tq * Tk, inputs_and_output = 2 * (Tq + Tk) * head_dim;
  return head_dim >= kSavedProbsMinHeadDim && probs <= inputs_and_output ? kDefaultSavedProbsLimit : 0;
}

// The kernel options of one fused call on (B, H, T, D) q and k: the
// probabilities are kept for the backward only when there will be one.
kernels::AttentionKernelOptions fused_options(kernels::AttentionKernelOptions ko, const AttentionOptions& o,
                                              const Tensor& q, const Tensor& k, const std::vector<Tensor>& inputs) {
  ko.probs_budget = any_requires_grad(inputs) ? saved_probs_budget(o, q.size(2), k.size(2), q.size(3)) : 0;
  return ko;
}

AttentionOutput attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                const kernels::AttentionKernelOptions& ko) {
  const kernels::AttentionKernelOptions forward_options = fused_options(ko, o, q, k, {q, k, v});
  kernels::AttentionForwardResult r = kernels::attention_forward(q, k, v, o.mask, forward_options);
  AttentionOutput result;
  result.weights = r.weights;
  kernels::AttentionKernelOptions backward_options = ko;
  backward_options.return_weights = false;
  result.out = record("attention", r.out, {q, k, v}, {q, k, v, o.mask, r.out, r.lse, r.probs},
                      [backward_options](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                        // forward: out = dropout(softmax(scale q k^T, masked)) @ v, with one
                        // log-sum-exp per row saved, and the probabilities where kept; the kernel
                        // recomputes them from the log-sum-exp otherwise (the formulas are
                        // written out in cpu/attention/backward.h).
                        kernels::AttentionGrads d = kernels::attention_backward(g, s[0], s[1], s[2], s[3], s[4], s[5],
                                                                                s[6], backward_options);
                        return {d.dq, d.dk, d.dv};
                      });
  return result;
}

// The three (B, H, T, D) views of a packed projection, made without recording
// (the packed op's node stands for them): of a (B, T, 3 H D) one, or of a
// (B, 3, H, T, D) one (linear_heads').
std::array<Tensor, 3> packed_heads(const Tensor& qkv, std::int64_t heads) {
  std::array<Tensor, 3> views;
  if (qkv.dim() == 5) {
    const Shape& st = qkv.strides();
    for (std::int64_t i = 0; i < 3; ++i)
      views[i] = make_view(qkv, {qkv.size(0), qkv.size(2), qkv.size(3), qkv.size(4)}, {st[0], st[2], st[3], st[4]},
                           qkv.offset() + i * st[1]);
    return views;
  }
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / heads;
  const std::int64_t s0 = qkv.stride(0), s1 = qkv.stride(1), s2 = qkv.stride(2);
  for (std::int64_t i = 0; i < 3; ++i)
    views[i] = make_view(qkv, {B, heads, T, D}, {s0, D * s2, s1, s2}, qkv.offset() + i * C * s2);
  return views;
}

// A new gradient for a packed projection of qkv's shape, laid out (B, T, 3, H,
// D) either way: the layout linear's and linear_heads' backward read with no
// copy.
Tensor packed_gradient(const Tensor& qkv) {
  if (qkv.dim() == 3) return empty(qkv.sizes(), qkv.options());
  const std::int64_t B = qkv.size(0), H = qkv.size(2), T = qkv.size(3), D = qkv.size(4), C = H * D;
  const Tensor rows = empty({B, T, 3, H, D}, qkv.options());
  return make_view(rows, {B, 3, H, T, D}, {T * 3 * C, C, D, 3 * C, 1}, 0);
}

AttentionOutput attention_fused_packed(const Tensor& qkv, std::int64_t heads, const AttentionOptions& o,
                                       const kernels::AttentionKernelOptions& ko) {
  const auto [q, k, v] = packed_heads(qkv.detach(), heads);
  const kernels::AttentionKernelOptions forward_options = fused_options(ko, o, q, k, {qkv});
  kernels::AttentionForwardResult r = kernels::attention_forward(q, k, v, o.mask, forward_options);
  AttentionOutput result;
  result.weights = r.weights;
  kernels::AttentionKernelOptions backward_options = ko;
  backward_options.return_weights = false;
  result.out = record("attention", r.out, {qkv}, {qkv, o.mask, r.out, r.lse, r.probs},
                      [backward_options, heads](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                        // attention_fused's backward, with the three gradients written into
                        // their places in one packed d(qkv).
                        const Tensor d_qkv = packed_gradient(s[0]);
                        const auto [q, k, v] = packed_heads(s[0], heads);
                        const auto [dq, dk, dv] = packed_heads(d_qkv, heads);
                        kernels::attention_backward(g, q, k, v, s[1], s[2], s[3], s[4], backward_options,
                                                    {dq, dk, dv});
                        return {d_qkv};
                      });
  return result;
}

// Checks shared by both entry points; the kernel options, with dropout's
// offset reserved from the generator when dropout is on.
kernels::AttentionKernelOptions checked_kernel_options(const Tensor& q, const Tensor& k, const Tensor& v,
                                                       const AttentionOptions& options) {
  const char* op = "attention";
  kernels::check_attention_operands(op, q, k, v, options.mask);
  AG_CHECK(options.dropout_p >= 0 && options.dropout_p < 1, op, "dropout_p must be in [0, 1), got {}",
           options.dropout_p);
  AG_CHECK(options.saved_probs_limit >= 0 || options.saved_probs_limit == kAutoSavedProbsLimit, op,
           "saved_probs_limit must be a byte count >= 0 or kAutoSavedProbsLimit (-1), got {}",
           options.saved_probs_limit);

  kernels::AttentionKernelOptions ko;
  ko.causal = options.causal;
  ko.scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  ko.return_weights = options.return_weights;
  const bool dropout_on = options.training && options.dropout_p > 0;
  if (dropout_on) {
    Generator& gen = options.generator ? *options.generator : default_generator();
    ko.dropout_p = options.dropout_p;
    ko.seed = gen.seed();
    ko.offset = gen.reserve(static_cast<std::uint64_t>(q.size(0) * q.size(1) * q.size(2) * k.size(2)));
  }
  return ko;
}

}  // namespace

AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const kernels::AttentionKernelOptions ko = checked_kernel_options(q, k, v, options);
  if (options.impl == AttentionImpl::composed)  // under autocast each op of it chooses its own precision
    return attention_composed(q, k, v, options, ko.scale, ko.dropout_p > 0, ko.seed, ko.offset);
  return attention_fused(autocast_low(q), autocast_low(k), autocast_low(v), options, ko);  // bfloat16 under autocast
}

std::int64_t saved_probs_bytes(const AttentionOptions& options, std::int64_t heads, std::int64_t Tq, std::int64_t Tk,
                               std::int64_t head_dim, std::int64_t element_bytes) {
  return kernels::attention_probs_bytes(heads, Tq, Tk, options.causal, element_bytes,
                                       saved_probs_budget(options, Tq, Tk, head_dim));
}

std::vector<Tensor> split_packed_heads(const Tensor& packed, std::int64_t n, std::int64_t heads) {
  const std::int64_t d = packed.size(-1) / (n * heads);
  const Tensor x = permute(view(packed, {packed.size(0), packed.size(1), n, heads, d}), {2, 0, 3, 1, 4});
  std::vector<Tensor> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(select(x, 0, i));  // (B, H, T, D)
  return out;
}

AttentionOutput attention_packed(const Tensor& qkv, std::int64_t num_heads, const AttentionOptions& options) {
  AG_CHECK(qkv.defined(), "attention_packed", "qkv is an undefined tensor");
  const bool by_heads = qkv.dim() == 5;  // linear_heads' layout
  AG_CHECK((qkv.dim() == 3 && num_heads > 0 && qkv.size(2) % (3 * num_heads) == 0) ||
               (by_heads && qkv.size(1) == 3 && qkv.size(2) == num_heads),
           "attention_packed", "qkv must be (B, T, 3 * num_heads * D) or (B, 3, num_heads, T, D), got {} with num_heads = {}",
           shape_str(qkv.sizes()), num_heads);
  if (options.impl == AttentionImpl::composed) {
    const auto heads = by_heads ? std::vector<Tensor>{select(qkv, 1, 0), select(qkv, 1, 1), select(qkv, 1, 2)}
                                : split_packed_heads(qkv, 3, num_heads);  // differentiable views
    return attention(heads[0], heads[1], heads[2], options);
  }
  const auto [q, k, v] = packed_heads(qkv, num_heads);
  return attention_fused_packed(autocast_low(qkv), num_heads, options, checked_kernel_options(q, k, v, options));
}

}  // namespace attograd
