// Fused attention on CUDA tensors (float32): the launchers of
// cuda/attention.cu over the problem both devices read
// (tensor/attention_call.h, base/attention_problem.h), into the outputs
// tensor/dispatch.cpp allocated: the output laid out (B, Tq, H, D) and seen
// as a (B, H, Tq, D) view, so merging heads afterwards is free; the same
// Philox dropout stream and all-hidden-row convention as the CPU's.
#include "tensor/attention_call.h"
#include "tensor/cuda/launch.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {

void attention_forward(const AttentionCall& call, kernels::AttentionForwardResult& r) {
  const Tensor& out = r.out;  // (B, H, Tq, D) view of (B, Tq, H, D) memory
  cuda::attention_forward(attention_problem<float>(call), out.data<float>(), out.stride(0), out.stride(1),
                          out.stride(2), r.lse.data<float>(),
                          call.options.return_weights ? r.weights.data<float>() : nullptr, stream_of(call.q));
}

void attention_backward(const AttentionCall& call, const AttentionSaved& s, const kernels::AttentionGrads& g) {
  // The kernels write contiguous gradients: a gradient asked for elsewhere (a
  // view of one packed d(qkv), say) is computed aside and copied there.
  const auto contiguous_target = [](const Tensor& grad) {
    return grad.is_contiguous() ? grad : empty(grad.sizes(), grad.options());
  };
  const kernels::AttentionGrads into{contiguous_target(g.dq), contiguous_target(g.dk), contiguous_target(g.dv)};
  cuda::attention_backward(attention_problem<float>(call), attention_rows<const float>(s.dout),
                           attention_rows<const float>(s.out), s.lse.data<float>(), into.dq.data<float>(),
                           into.dk.data<float>(), into.dv.data<float>(), stream_of(call.q));
  for (const auto& [target, computed] : {std::pair{&g.dq, &into.dq}, std::pair{&g.dk, &into.dk},
                                         std::pair{&g.dv, &into.dv}})
    if (target->raw_data() != computed->raw_data()) copy_(*target, *computed);
}

}  // namespace attograd::gpu
