// Checks and routing of the fused attention, forward and backward, and the
// bfloat16 policy its kernels follow: the part of the dispatch (tensor/dispatch.cpp)
// for attention.
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "cuda/runtime.h"
#include "tensor/attention_call.h"
#include "tensor/dense_span.h"
#include "tensor/dispatch_checks.h"

namespace attograd::kernels {

namespace {

// Whether a bfloat16 attention runs on q's device's bfloat16 kernels, else
// widened to float32 (the device's policy: tensor/device_kernels.h).
bool bf16_attention_fused(const Tensor& q, bool return_weights) {
  return AG_DEVICE_KERNEL(q, attention_takes_bf16)(return_weights);
}

// A fused call: its operands checked, the options in range and what the CUDA
// kernels support; each row made contiguous (a copy only of an operand whose
// last dim is strided). For the forward and again for the backward: a caller
// of the kernels need not come through autograd.
AttentionCall attention_call(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                             const AttentionKernelOptions& options) {
  check_attention_operands(op, q, k, v, mask);
  const Shape& qs = q.sizes();
  AG_CHECK(options.dropout_p >= 0 && options.dropout_p < 1, op, "dropout_p must be in [0, 1), got {}",
           options.dropout_p);
  if (q.device().is_cuda()) {
    check_not_cuda_float64(op, q);
    AG_CHECK(qs[3] <= cuda::kAttentionMaxHeadDim, op, "head dim {} is above the CUDA kernels' maximum of {}", qs[3],
             cuda::kAttentionMaxHeadDim);
  }
  return {rows_contiguous(q), rows_contiguous(k), rows_contiguous(v), mask, options};
}

}  // namespace

void check_attention_operands(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_floating(op, q);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  AG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, "q, k, v must be (B, H, T, D), got {}, {}, {}",
           shape_str(q.sizes()), shape_str(k.sizes()), shape_str(v.sizes()));
  const Shape& qs = q.sizes();
  const Shape& ks = k.sizes();
  AG_CHECK(ks == v.sizes() && qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3], op,
           "q {} and k, v {}, {} must share B, H and D, and k and v must match", shape_str(qs), shape_str(ks),
           shape_str(v.sizes()));
  if (!mask.defined()) return;
  AG_CHECK(mask.dtype() == DType::b8, op, "mask must be bool (true = hidden), got {}", dtype_name(mask.dtype()));
  check_same_device(op, q, mask);
  const Shape scores{qs[0], qs[1], qs[2], ks[2]};
  AG_CHECK(broadcasts_to(mask.sizes(), scores), op,
           "mask {} does not broadcast to the scores (B, H, Tq, Tk) = {}", shape_str(mask.sizes()), shape_str(scores));
}

AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                         const AttentionKernelOptions& options) {
  const bool bf16 = is_bf16(q) && is_bf16(k) && is_bf16(v);
  if (bf16 && !bf16_attention_fused(q, options.return_weights)) {
    // Widened: the output rounded to bfloat16; lse, weights and probs float32.
    // q, k, v (a packed projection's views) widen in one flat pass, and the
    // output, laid out (B, Tq, H, D), rounds so: its heads merge for free.
    const std::vector<Tensor> wide = cast_keeping_layout({q, k, v}, DType::f32);
    AttentionForwardResult r = attention_forward(wide[0], wide[1], wide[2], mask, options);
    r.out = cast_keeping_layout({r.out}, DType::bf16)[0];
    r.weights = to_bf16(r.weights);
    return r;
  }
  const AttentionCall call = attention_call("attention", q, k, v, mask, options);
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  AttentionForwardResult r;
  // The output is laid out (B, Tq, H, D) and returned as a (B, H, Tq, D) view,
  // so merging the heads back to (B, Tq, H*D) afterwards is free.
  const Tensor out_bthd = empty({B, Tq, H, D}, q.options());
  r.out = make_view(out_bthd, {B, H, Tq, D}, {Tq * H * D, D, H * D, 1}, 0);
  r.lse = empty({B, H, Tq}, {compute_dtype(q.dtype()), q.device()});
  if (options.return_weights) r.weights = empty({B, H, Tq, Tk}, q.options());
  if (r.out.numel() == 0 && !(options.return_weights && r.weights.numel() > 0)) return r;
  AG_DEVICE_KERNEL(q, attention_forward)(call, r);
  return r;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& probs,
                                  const AttentionKernelOptions& options, const AttentionGrads& into) {
  const char* op = "attention backward";
  const bool bf16 = is_bf16(q) && is_bf16(k) && is_bf16(v);
  if (bf16 && (!bf16_attention_fused(q, false) || probs.defined() || lse.dtype() != DType::f32)) {
    // Widened (as its forward was): float32 gradients, rounded into bfloat16
    // ones. Casts keep the layouts, and the three gradients, when they are one
    // packed d(qkv)'s views, are computed into a float32 twin of it and rounded
    // in one flat pass.
    const std::vector<Tensor> wide = cast_keeping_layout({q, k, v}, DType::f32);
    const Tensor wide_dout = cast_keeping_layout({dout}, DType::f32)[0];
    const Tensor wide_out = cast_keeping_layout({out}, DType::f32)[0];
    if (const std::optional<StorageSpan> span = dense_span({into.dq, into.dk, into.dv})) {
      const Tensor twin = empty({span->numel}, {DType::f32, q.device()});
      const std::vector<Tensor> twins = views_over(twin, {into.dq, into.dk, into.dv}, *span);
      attention_backward(wide_dout, wide[0], wide[1], wide[2], mask, wide_out, widen(lse), probs, options,
                         {twins[0], twins[1], twins[2]});
      copy_(flat_view(into.dq, *span), twin);
      return into;
    }
    const AttentionGrads g =
        attention_backward(wide_dout, wide[0], wide[1], wide[2], mask, wide_out, widen(lse), probs, options);
    AttentionGrads rounded;
    for (auto [target, computed, result] : {std::tuple{&into.dq, &g.dq, &rounded.dq}, std::tuple{&into.dk, &g.dk, &rounded.dk},
                                            std::tuple{&into.dv, &g.dv, &rounded.dv}}) {
      *result = target->defined() ? *target : empty(computed->sizes(), {DType::bf16, computed->device()});
      copy_(*result, *computed);
    }
    return rounded;
  }
  const AttentionCall call = attention_call(op, q, k, v, mask, options);
  check_defined(op, dout, "dout");
  check_defined(op, out, "out");
  check_defined(op, lse, "lse");
  check_same_dtype(op, dout, q);
  AG_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes(), op, "dout {} and out {} must match q {}",
           shape_str(dout.sizes()), shape_str(out.sizes()), shape_str(q.sizes()));
  AG_CHECK(lse.sizes() == Shape(q.sizes().begin(), q.sizes().end() - 1) && lse.is_contiguous(), op,
           "lse {} must be a contiguous (B, H, Tq) for q {}", shape_str(lse.sizes()), shape_str(q.sizes()));
  for (const Tensor* t : {&dout, &out, &lse}) check_same_device(op, q, *t);
  if (probs.defined()) {  // the CPU forward's saved tiles: whole heads of them, for these shapes
    const std::int64_t per_head = attention_probs_bytes(1, q.size(2), k.size(2), options.causal, 1,
                                                        std::numeric_limits<std::int64_t>::max());
    AG_CHECK(probs.device().is_cpu() && probs.dtype() == q.dtype() && probs.is_contiguous() && per_head > 0 &&
                 probs.numel() > 0 && probs.numel() % per_head == 0 && probs.numel() <= per_head * q.size(0) * q.size(1),
             op, "probs {} {} is not the forward's saved tiles for q {}, k {} (whole heads of {} values, at most {})",
             dtype_name(probs.dtype()), shape_str(probs.sizes()), shape_str(q.sizes()), shape_str(k.sizes()),
             per_head, q.size(0) * q.size(1));
  }
  const std::pair<const Tensor*, const Tensor*> outputs[] = {{&into.dq, &q}, {&into.dk, &k}, {&into.dv, &v}};
  for (const auto& [grad, input] : outputs) {
    if (!grad->defined()) continue;
    check_same_dtype(op, q, *grad);
    check_same_device(op, q, *grad);
    AG_CHECK(grad->sizes() == input->sizes() && (grad->size(-1) <= 1 || grad->stride(-1) == 1), op,
             "gradient output {} must have its input's shape {} and contiguous rows", grad->str(),
             shape_str(input->sizes()));
  }
  const AttentionGrads g{into.dq.defined() ? into.dq : empty(q.sizes(), q.options()),
                         into.dk.defined() ? into.dk : empty(k.sizes(), k.options()),
                         into.dv.defined() ? into.dv : empty(v.sizes(), v.options())};
  if (g.dq.numel() == 0 && g.dk.numel() == 0) return g;
  const AttentionSaved saved{rows_contiguous(dout), rows_contiguous(out), lse, probs};
  AG_DEVICE_KERNEL(q, attention_backward)(call, saved, g);
  return g;
}

}  // namespace attograd::kernels
