#pragma once
// One fused attention call as the dispatch (tensor/dispatch_attention.cpp)
// hands it to a device, after checking it (kernels::attention_forward and
// _backward, tensor/kernels.h), and the raw problem both devices compute it
// from (base/attention_problem.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/attention_problem.h"
#include "tensor/kernels.h"

namespace attograd {

// The operands of one call: checked to agree, each row contiguous.
struct AttentionCall {
  Tensor q;     // (B, H, Tq, D)
  Tensor k, v;  // (B, H, Tk, D)
  Tensor mask;  // undefined, or bool broadcasting to (B, H, Tq, Tk), true = hidden
  kernels::AttentionKernelOptions options;
};

// What the backward reads besides the call: the forward's output, its
// log-sum-exp and saved probability tiles, and the gradient of its output.
struct AttentionSaved {
  Tensor dout;   // (B, H, Tq, D), rows contiguous
  Tensor out;    // (B, H, Tq, D), rows contiguous
  Tensor lse;    // (B, H, Tq), contiguous
  Tensor probs;  // the CPU forward's kept tiles, or undefined
};

// A (B, H, T, D) tensor's rows, as the kernels index them.
template <typename T>
AttentionRows<T> attention_rows(const Tensor& x) {
  return {x.data<std::remove_const_t<T>>(), x.stride(0), x.stride(1), x.stride(2)};
}

// A call's sizes, scale, causal flag, mask and dropout in arithmetic type T,
// its rows left null: for a kernel that reads rows of another type (the
// bfloat16 attention computes its scores in float32).
template <typename T>
AttentionProblem<T> attention_problem_settings(const AttentionCall& call) {
  const Tensor &q = call.q, &k = call.k;
  const kernels::AttentionKernelOptions& o = call.options;
  AttentionProblem<T> p{{},        {},        {},        q.size(0), q.size(1), q.size(2), k.size(2),
                        q.size(3), static_cast<T>(o.scale), o.causal};
  if (call.mask.defined()) {
    p.mask = call.mask.data<bool>();
    const Shape strides = broadcast_strides(call.mask.sizes(), call.mask.strides(), {p.B, p.H, p.Tq, p.Tk});
    std::copy(strides.begin(), strides.end(), p.mask_strides);
  }
  p.set_dropout(o.dropout_p, o.seed, o.offset);
  return p;
}

// The raw problem of a call, in element type T (the tensors' dtype).
template <typename T>
AttentionProblem<T> attention_problem(const AttentionCall& call) {
  AttentionProblem<T> p = attention_problem_settings<T>(call);
  p.q = attention_rows<const T>(call.q);
  p.k = attention_rows<const T>(call.k);
  p.v = attention_rows<const T>(call.v);
  return p;
}

}  // namespace attograd
