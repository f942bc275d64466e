// Fused attention on CUDA tensors: the launchers of cuda/attention.cu
// (float32) and cuda/attention_bf16.cu (bfloat16) over the problem both
// devices read (tensor/attention_call.h, base/attention_problem.h), into the outputs
// tensor/dispatch_attention.cpp allocated: the output laid out (B, Tq, H, D) and seen
// as a (B, H, Tq, D) view, so merging heads afterwards is free; the same
// Philox dropout stream and all-hidden-row convention as the CPU's.
#include <cstdint>
#include <initializer_list>

#include "tensor/attention_call.h"
#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {

namespace {

// Whether every row of x starts 16 bytes (8 values) aligned, and D is a multiple of 8.
bool rows_in_eights(const Tensor& x) {
  const auto whole = [](std::int64_t n) { return n % 8 == 0; };
  return reinterpret_cast<std::uintptr_t>(x.raw_data()) % 16 == 0 && whole(x.size(3)) && whole(x.stride(0)) &&
         whole(x.stride(1)) && whole(x.stride(2));
}

// The call's operands, moved 8 values at a time when they and `also` all allow it.
cuda::Bf16AttentionOperands bf16_operands(const AttentionCall& call, std::initializer_list<const Tensor*> also) {
  bool vec = rows_in_eights(call.q) && rows_in_eights(call.k) && rows_in_eights(call.v);
  for (const Tensor* t : also) vec = vec && rows_in_eights(*t);
  return {attention_rows<const bfloat16>(call.q), attention_rows<const bfloat16>(call.k),
          attention_rows<const bfloat16>(call.v), vec};
}

}  // namespace

// The bfloat16 kernels return no weights: a call asking for them is widened.
bool attention_takes_bf16(bool return_weights) { return !return_weights; }

void attention_forward(const AttentionCall& call, kernels::AttentionForwardResult& r) {
  const Tensor& out = r.out;  // (B, H, Tq, D) view of (B, Tq, H, D) memory
  if (call.q.dtype() == DType::bf16) {  // no weights: kernels::attention_forward widens for those
    cuda::attention_forward_bf16(attention_problem_settings<float>(call), bf16_operands(call, {&out}),
                                 attention_rows<bfloat16>(out), r.lse.data<float>(), stream_of(call.q));
    return;
  }
  cuda::attention_forward(attention_problem<float>(call), out.data<float>(), out.stride(0), out.stride(1),
                          out.stride(2), r.lse.data<float>(),
                          call.options.return_weights ? r.weights.data<float>() : nullptr, stream_of(call.q));
}

void attention_backward(const AttentionCall& call, const AttentionSaved& s, const kernels::AttentionGrads& g) {
  if (call.q.dtype() == DType::bf16) {  // the bfloat16 kernels write any rows
    cuda::attention_backward_bf16(attention_problem_settings<float>(call),
                                  bf16_operands(call, {&s.dout, &g.dq, &g.dk, &g.dv}),
                                  attention_rows<const bfloat16>(s.dout), attention_rows<const bfloat16>(s.out),
                                  s.lse.data<float>(), attention_rows<bfloat16>(g.dq), attention_rows<bfloat16>(g.dk),
                                  attention_rows<bfloat16>(g.dv), stream_of(call.q));
    return;
  }
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
