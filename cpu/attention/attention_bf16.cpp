// The fused attention in bfloat16 on AMX tiles or AVX512_BF16 vectors:
// bfloat16 q, k, v, dout and out, float32 products (TDPBF16PS or VDPBF16PS), a
// float32 online softmax and a float32 log-sum-exp, bfloat16 outputs and
// gradients. The products are the bfloat16 matrix product's 32 x 32 blocks
// (cpu/matmul_bf16/amx.h's and dpbf16.h's, which read the same packed
// layouts), run on the hardware or on its scalar model over the same packed
// buffers (so the layouts are tested on every machine); the masking, dropout
// and online softmax are the float32 kernel's (cpu/attention/), on
// float32 score tiles. The conventions (masking, dropout's stream, the
// all-hidden row) are base/attention_problem.h's.
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
#include "cpu/attention/attention.h"
#include "cpu/attention/bf16_backward.h"
#include "cpu/attention/bf16_forward.h"
#include "cpu/attention/isa.h"
#include "cpu/matmul_bf16/amx.h"
#include "cpu/matmul_bf16/dpbf16.h"
#include "tensor/device_kernels.h"
#include "cpu/parallel.h"

namespace attograd::cpu::attention_bf16 {
namespace {

Bf16Problem bf16_problem(const AttentionCall& call) {
  return {attention_rows<const bfloat16>(call.q), attention_rows<const bfloat16>(call.k),
          attention_rows<const bfloat16>(call.v), attention_problem_settings<float>(call)};
}

// A forward and a backward per kernel: the hardware's compiled for AVX-512
// (every CPU with AMX or AVX512_BF16 has it; the VDPBF16PS block is a function
// of its own, compiled for AVX512_BF16, dpbf16.h), rounding their tiles by
// AVX512_BF16's instruction (which every such CPU has) where this build has
// it; the models' for the build's baseline.
#if AG_BF16_AVX512_KERNEL
struct TileAvx512Bf16 : attention_detail::TileAvx512 {
  static constexpr bool kRoundsBf16 = true;
};
#else
using TileAvx512Bf16 = attention_detail::TileAvx512;
#endif
template <typename Blocks>
AG_TARGET_AVX512 void forward_avx512(const Bf16Problem& P, const ForwardOutputs& O, TaskQueue& heads) {
  Blocks blocks;
  forward_heads<Blocks, TileAvx512Bf16>(blocks, P, O, heads);
}
template <typename Blocks>
AG_TARGET_AVX512 void backward_avx512(const Bf16Problem& P, const BackwardIo& io, TaskQueue& heads) {
  Blocks blocks;
  backward_heads<Blocks, TileAvx512Bf16>(blocks, P, io, heads);
}
template <typename Blocks>
void forward_baseline(const Bf16Problem& P, const ForwardOutputs& O, TaskQueue& heads) {
  Blocks blocks;
  forward_heads<Blocks, attention_detail::TileBaseline>(blocks, P, O, heads);
}
template <typename Blocks>
void backward_baseline(const Bf16Problem& P, const BackwardIo& io, TaskQueue& heads) {
  Blocks blocks;
  backward_heads<Blocks, attention_detail::TileBaseline>(blocks, P, io, heads);
}

using Forward = void (*)(const Bf16Problem&, const ForwardOutputs&, TaskQueue&);
using Backward = void (*)(const Bf16Problem&, const BackwardIo&, TaskQueue&);
struct Passes {
  Forward forward = nullptr;
  Backward backward = nullptr;
};
// The kernel's passes; none for widen, or for a hardware kernel this build lacks.
Passes passes_of(Bf16Kernel kernel) {
  using bf16_gemm::AmxBlocks;
  using bf16_gemm::Dpbf16Blocks;
  switch (kernel) {
#if AG_BF16_AMX_KERNEL
    case Bf16Kernel::amx:
      return {forward_avx512<AmxBlocks<bf16_gemm::AmxTiles>>, backward_avx512<AmxBlocks<bf16_gemm::AmxTiles>>};
#endif
#if AG_BF16_AVX512_KERNEL
    case Bf16Kernel::avx512_bf16:
      return {forward_avx512<Dpbf16Blocks<bf16_gemm::Dpbf16Vectors>>,
              backward_avx512<Dpbf16Blocks<bf16_gemm::Dpbf16Vectors>>};
#endif
    case Bf16Kernel::amx_model:
      return {forward_baseline<AmxBlocks<bf16_gemm::AmxModel>>, backward_baseline<AmxBlocks<bf16_gemm::AmxModel>>};
    case Bf16Kernel::avx512_bf16_model:
      return {forward_baseline<Dpbf16Blocks<bf16_gemm::Dpbf16Model>>,
              backward_baseline<Dpbf16Blocks<bf16_gemm::Dpbf16Model>>};
    default: return {};
  }
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
  return passes_of(kernel).forward != nullptr && bf16_kernel_runs_here(kernel);
}

// The bfloat16 kernels return no weights: a call asking for them is widened.
bool attention_takes_bf16(bool return_weights) { return !return_weights && attention_bf16_runs_on(bf16_kernel()); }

void attention_forward_bf16(const AttentionCall& call, kernels::AttentionForwardResult& r, Bf16Kernel kernel) {
  check_tile_kernel(kernel);
  const Bf16Problem P = bf16_problem(call);
  // r.out is a (B, H, Tq, D) view of (B, Tq, H, D) memory (kernels::attention_forward).
  const ForwardOutputs O{r.out.data<bfloat16>(), r.lse.data<float>()};
  parallel_tasks(0, P.meta.B * P.meta.H, 1, [&](TaskQueue& heads) { passes_of(kernel).forward(P, O, heads); });
}

void attention_backward_bf16(const AttentionCall& call, const AttentionSaved& s, const kernels::AttentionGrads& g,
                             Bf16Kernel kernel) {
  check_tile_kernel(kernel);
  const Bf16Problem P = bf16_problem(call);
  const BackwardIo io{attention_rows<const bfloat16>(s.dout), attention_rows<const bfloat16>(s.out),
                      s.lse.data<float>(), attention_rows<bfloat16>(g.dq), attention_rows<bfloat16>(g.dk),
                      attention_rows<bfloat16>(g.dv)};
  parallel_tasks(0, P.meta.B * P.meta.H, 1, [&](TaskQueue& heads) { passes_of(kernel).backward(P, io, heads); });
}

}  // namespace attograd::cpu
