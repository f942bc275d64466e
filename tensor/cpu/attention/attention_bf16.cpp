// The fused attention in bfloat16 on AMX tiles: bfloat16 q, k, v, dout and
// out, float32 products (TDPBF16PS), a float32 online softmax and a float32
// log-sum-exp, bfloat16 outputs and gradients. The tile products are
// tensor/cpu/matmul_bf16/amx.h's 32 x 32 blocks, run on the hardware or on
// its scalar model over the same packed buffers (so the layouts are tested on
// every machine); the masking, dropout and online softmax are the float32
// kernel's (tensor/cpu/attention/), on float32 score tiles. The conventions
// (masking, dropout's stream, the all-hidden row) are base/attention_problem.h's.
//
// Its parts, in the order they build on each other:
//   bf16_tiles.h     the operands' and tiles' layouts, and why each product reads what it reads
//   bf16_problem.h   the problem: bfloat16 rows, float32 metadata
//   bf16_forward.h   the forward, a head at a time
//   bf16_backward.h  the backward, a head at a time
// Heads are the tasks: each packs its operands once, and B * H heads keep a
// few threads busy at the sizes people train.
#include <cstdint>

#include "tensor/attention_call.h"
#include "tensor/cpu/attention/attention.h"
#include "tensor/cpu/attention/bf16_backward.h"
#include "tensor/cpu/attention/bf16_forward.h"
#include "tensor/cpu/attention/isa.h"
#include "tensor/parallel.h"

namespace attograd::cpu::attention_bf16 {
namespace {

Bf16Problem bf16_problem(const AttentionCall& call) {
  return {attention_rows<const bfloat16>(call.q), attention_rows<const bfloat16>(call.k),
          attention_rows<const bfloat16>(call.v), attention_problem_settings<float>(call)};
}

// One forward and one backward per tile machine: the hardware's compiled for
// AVX-512 (every CPU with AMX has it), the model's for the build's baseline.
#if AG_BF16_AMX_KERNEL
AG_TARGET_AVX512 void forward_amx(const Bf16Problem& P, const ForwardOutputs& O, TaskQueue& heads) {
  bf16_gemm::AmxTiles tiles;
  forward_heads<bf16_gemm::AmxTiles, attention_detail::TileAvx512>(tiles, P, O, heads);
}
AG_TARGET_AVX512 void backward_amx(const Bf16Problem& P, const BackwardIo& io, TaskQueue& heads) {
  bf16_gemm::AmxTiles tiles;
  backward_heads<bf16_gemm::AmxTiles, attention_detail::TileAvx512>(tiles, P, io, heads);
}
#endif
void forward_model(const Bf16Problem& P, const ForwardOutputs& O, TaskQueue& heads) {
  bf16_gemm::AmxModel tiles;
  forward_heads<bf16_gemm::AmxModel, attention_detail::TileBaseline>(tiles, P, O, heads);
}
void backward_model(const Bf16Problem& P, const BackwardIo& io, TaskQueue& heads) {
  bf16_gemm::AmxModel tiles;
  backward_heads<bf16_gemm::AmxModel, attention_detail::TileBaseline>(tiles, P, io, heads);
}

void check_tile_kernel(Bf16Kernel kernel) {
  AG_CHECK(attention_bf16_runs_on(kernel), "attention", "the bfloat16 attention has no {} kernel here",
           bf16_kernel_name(kernel));
}

}  // namespace
}  // namespace attograd::cpu::attention_bf16

namespace attograd::cpu {

using namespace attention_bf16;

bool attention_bf16_runs_on(Bf16Kernel kernel) {
  return ((kernel == Bf16Kernel::amx && AG_BF16_AMX_KERNEL) || kernel == Bf16Kernel::amx_model) &&
         bf16_kernel_runs_here(kernel);
}

void attention_forward_bf16(const AttentionCall& call, kernels::AttentionForwardResult& r, Bf16Kernel kernel) {
  check_tile_kernel(kernel);
  const Bf16Problem P = bf16_problem(call);
  // r.out is a (B, H, Tq, D) view of (B, Tq, H, D) memory (kernels::attention_forward).
  const ForwardOutputs O{r.out.data<bfloat16>(), r.lse.data<float>()};
  parallel_tasks(0, P.meta.B * P.meta.H, 1, [&](TaskQueue& heads) {
#if AG_BF16_AMX_KERNEL
    if (kernel == Bf16Kernel::amx) return forward_amx(P, O, heads);
#endif
    forward_model(P, O, heads);
  });
}

void attention_backward_bf16(const AttentionCall& call, const AttentionSaved& s, const kernels::AttentionGrads& g,
                             Bf16Kernel kernel) {
  check_tile_kernel(kernel);
  const Bf16Problem P = bf16_problem(call);
  const BackwardIo io{attention_rows<const bfloat16>(s.dout), attention_rows<const bfloat16>(s.out),
                      s.lse.data<float>(), attention_rows<bfloat16>(g.dq), attention_rows<bfloat16>(g.dk),
                      attention_rows<bfloat16>(g.dv)};
  parallel_tasks(0, P.meta.B * P.meta.H, 1, [&](TaskQueue& heads) {
#if AG_BF16_AMX_KERNEL
    if (kernel == Bf16Kernel::amx) return backward_amx(P, io, heads);
#endif
    backward_model(P, io, heads);
  });
}

}  // namespace attograd::cpu
