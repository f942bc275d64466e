// Fused attention on CUDA tensors (float32): the launchers of
// cuda/attention.cu with the CPU's conventions (tensor/cpu/attention.cpp):
// the output laid out (B, Tq, H, D) and returned as a (B, H, Tq, D) view, so
// merging heads afterwards is free; contiguous (B, H, T, D) gradients; the
// same Philox dropout stream and all-hidden-row convention.
#include "tensor/cuda/gpu_kernels.h"
#include "tensor/cuda/launch.h"

namespace attograd::gpu {
namespace {

cuda::AttentionRows rows_of(const Tensor& x) { return {x.data<float>(), x.stride(0), x.stride(1), x.stride(2)}; }

cuda::AttentionProblem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const kernels::AttentionKernelOptions& o) {
  cuda::AttentionProblem p{rows_of(q), rows_of(k), rows_of(v), q.size(0), q.size(1), q.size(2), k.size(2), q.size(3),
                           static_cast<float>(o.scale), o.causal};
  AG_CHECK(p.D <= cuda::kAttentionMaxHeadDim, "attention", "head dim {} is above the CUDA kernels' maximum of {}", p.D,
           cuda::kAttentionMaxHeadDim);
  if (mask.defined()) {
    p.mask = mask.data<bool>();
    const Shape strides = broadcast_strides(mask.sizes(), mask.strides(), {p.B, p.H, p.Tq, p.Tk});
    std::copy(strides.begin(), strides.end(), p.mask_strides);
  }
  p.dropout_threshold = static_cast<float>(o.dropout_p);
  p.keep_scale = static_cast<float>(1.0 / (1.0 - o.dropout_p));
  p.seed = o.seed;
  p.offset = o.offset;
  return p;
}

}  // namespace

kernels::AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                                  const kernels::AttentionKernelOptions& options) {
  require_float32("attention", q);
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  kernels::AttentionForwardResult r;
  Tensor out_bthd = empty({B, Tq, H, D}, q.options());
  r.out = make_view(out_bthd, {B, H, Tq, D}, {Tq * H * D, D, H * D, 1}, 0);
  r.lse = empty({B, H, Tq}, q.options());
  if (options.return_weights) r.weights = empty({B, H, Tq, Tk}, q.options());
  if (r.out.numel() == 0 && !(options.return_weights && r.weights.numel() > 0)) return r;
  const cuda::AttentionProblem p = make_problem(q, k, v, mask, options);
  cuda::attention_forward(p, out_bthd.data<float>(), Tq * H * D, D, H * D, r.lse.data<float>(),
                          options.return_weights ? r.weights.data<float>() : nullptr, stream_of(q));
  return r;
}

kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionKernelOptions& options) {
  require_float32("attention backward", q);
  kernels::AttentionGrads g{empty(q.sizes(), q.options()), empty(k.sizes(), k.options()),
                            empty(v.sizes(), v.options())};
  if (g.dq.numel() == 0 && g.dk.numel() == 0) return g;
  const cuda::AttentionProblem p = make_problem(q, k, v, mask, options);
  cuda::attention_backward(p, rows_of(dout), rows_of(out), lse.data<float>(), g.dq.data<float>(), g.dk.data<float>(),
                           g.dv.data<float>(), stream_of(q));
  return g;
}

}  // namespace attograd::gpu
