// Fused attention on the CPU, flash-attention style (Dao et al. 2022, 2023):
// queries and keys are processed in tiles with an online softmax, so no
// (Tq, Tk) score matrix is needed; the forward saves one log-sum-exp per
// query row and the backward recomputes the probabilities from it. Within a
// memory budget the forward keeps its probability tiles instead, and the
// backward skips that recomputation (see "saved probabilities").
//
// The tasks are (batch, head, query block) in the forward and (batch, head)
// in the backward, handed to threads one at a time as they come free
// (parallel_tasks), not in fixed shares. Every product is a small
// GEMM done by one register-blocked micro-kernel (as BLIS and OpenBLAS do):
// an MR x NR tile of C stays in vector registers while it accumulates over
// the shared dimension, each step one vector load of B and MR broadcasts of
// A feeding MR x NR/lanes multiply-adds. The two products of the forward and
// the five of the backward differ only in the strides A is read with.
//
// The forward keeps its score tiles transposed, (keys, queries): S^T =
// k (scale q)^T needs only the queries transposed (once per query block,
// D x 64 values), reads k and v rows where they lie, and puts queries along
// the vector lanes, so the online softmax's per-query max, sum and rescaling
// are plain vector operations down the rows, with no horizontal reductions.
// The backward, which has no running reduction, keeps them (queries, keys):
// it transposes each key tile once and reads q and do rows where they lie.
// Tiles, micro-tiles and key ranges wholly hidden by the causal flag are
// skipped. The exponentials are cpu/vec_math.h's polynomial for
// float32, trimmed to the softmax's arguments (libm's for float64, which
// serves gradcheck).
//
// Masking: a key is hidden by the causal flag (j > i, top-left aligned as
// torch's is_causal) or by the boolean mask (true = hidden). A row whose keys
// are all hidden has no softmax; its output and gradients are zero and its
// log-sum-exp is -inf, which is also how the backward recognises it.
//
// Dropout reproduces the composed path exactly: weight (b, h, i, j) is
// dropped when philox_uniform(seed, offset, ((b*H + h)*Tq + i)*Tk + j) < p,
// the same function kernels::dropout_mask evaluates over the contiguous
// (B, H, Tq, Tk) weights; kept weights are scaled by 1/(1-p). The problem,
// masking and dropout conventions are base/attention_problem.h's, which the
// CUDA kernels (cuda/attention*.cu) read too.
//
// This file is the one translation unit of the fused attention: its parts are
// the headers beside it, in the order they build on each other:
//   tiling.h        tile sizes, cache-line-aligned scratch
//   isa.h           instruction sets: vector widths and register tiles, the run-time choice
//   vectors.h       vector loads and stores, the softmax's exponential
//   micro_kernel.h  the register-blocked micro-kernel and the three tile products
//   problem.h       the problem (base/attention_problem.h) with the tile geometry
//   packing.h       rows read in place or copied compact; transposes in registers
//   prefetch.h      software prefetch of the next tile and the next task
//   tasks.h         the tasks a thread claims, each with its successor
//   masking.h       hiding keys in a score tile; a tile's dropout factors
//   saved_probs.h   the probability tiles a forward keeps for its backward
//   forward.h       the forward, a query block at a time
//   backward.h      the backward, a head at a time
// Everything in them is forced inline (AG_ALWAYS_INLINE, cpu/vec_math.h)
// into the per-instruction-set entry points below, so it is compiled for
// their target; hence one translation unit, and headers rather than files of
// their own.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "tensor/attention_call.h"
#include "cpu/attention/attention.h"
#include "cpu/attention/backward.h"
#include "cpu/attention/forward.h"
#include "cpu/attention/isa.h"
#include "cpu/attention/saved_probs.h"
#include "tensor/device_kernels.h"
#include "cpu/parallel.h"

namespace attograd::cpu::attention_detail {

// ---- entry points per instruction set ---------------------------------------------------
// One forward and one backward per instruction set, each compiled for its
// target with the tiles of isa.h; everything they call is forced inline.
// A build without the run-time choice (AG_ATTENTION_ISA_DISPATCH: clang's, or
// not x86-64) runs the baseline alone, so it compiles no other: the wider
// tiles, compiled for the baseline target, take 4 registers a vector, and
// allocating registers for their always-inlined backward grows faster than
// its size (most of the sanitizer build's time, when it was compiled).
#define AG_ATTENTION_ENTRY_POINTS(isa, target, Tile)                                                  \
  template <typename T>                                                                               \
  target void forward_tasks_##isa(const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) { \
    forward_tasks<T, Tile>(P, O, tasks);                                                              \
  }                                                                                                   \
  template <typename T>                                                                               \
  target void backward_heads_##isa(const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {   \
    backward_heads<T, Tile>(P, io, heads);                                                            \
  }
#if AG_ATTENTION_ISA_DISPATCH
AG_ATTENTION_ENTRY_POINTS(avx512, AG_TARGET_AVX512, TileAvx512)
AG_ATTENTION_ENTRY_POINTS(avx2, AG_TARGET_AVX2, TileAvx2)
#endif
AG_ATTENTION_ENTRY_POINTS(baseline, /* the build's own target */, TileBaseline)
#undef AG_ATTENTION_ENTRY_POINTS

template <typename T>
void forward_tasks_any([[maybe_unused]] Isa isa, const Problem<T>& P, const ForwardOutputs<T>& O, TaskQueue& tasks) {
#if AG_ATTENTION_ISA_DISPATCH
  (isa == Isa::avx512 ? forward_tasks_avx512<T> : isa == Isa::avx2 ? forward_tasks_avx2<T> : forward_tasks_baseline<T>)(
      P, O, tasks);
#else
  forward_tasks_baseline<T>(P, O, tasks);  // cpu_isa() is baseline here
#endif
}

template <typename T>
void backward_heads_any([[maybe_unused]] Isa isa, const Problem<T>& P, const BackwardIo<T>& io, TaskQueue& heads) {
#if AG_ATTENTION_ISA_DISPATCH
  (isa == Isa::avx512 ? backward_heads_avx512<T> : isa == Isa::avx2 ? backward_heads_avx2<T> : backward_heads_baseline<T>)(
      P, io, heads);
#else
  backward_heads_baseline<T>(P, io, heads);
#endif
}

}  // namespace attograd::cpu::attention_detail

namespace attograd::cpu {

using namespace attention_detail;

const char* attention_isa() { return kIsaNames[static_cast<int>(cpu_isa())]; }

void attention_forward(const AttentionCall& call, kernels::AttentionForwardResult& r) {
  if (call.q.dtype() == DType::bf16) {  // where attention_takes_bf16: on the product's blocks
    attention_forward_bf16(call, r, bf16_kernel());
    return;
  }
  const kernels::AttentionKernelOptions& options = call.options;
  const std::int64_t B = call.q.size(0), H = call.q.size(1), Tq = call.q.size(2), Tk = call.k.size(2);
  const Isa isa = cpu_isa();  // here, not in the workers: a bad ATTOGRAD_ATTENTION_ISA throws to the caller
  AG_DISPATCH_FLOAT(call.q.dtype(), "attention", [&] {
    using T = scalar_t;
    const Problem<T> P = attention_problem<T>(call);
    // r.out is a (B, H, Tq, D) view of (B, Tq, H, D) memory (kernels::attention_forward).
    ForwardOutputs<T> O{r.out.data<T>(), r.lse.data<T>(), options.return_weights ? r.weights.data<T>() : nullptr, {}};
    SavedProbs<T> saved(Tq, Tk, options.causal);
    const std::int64_t bytes =
        kernels::attention_probs_bytes(B * H, Tq, Tk, options.causal, sizeof(T), options.probs_budget);
    if (bytes > 0) {
      saved.heads = bytes / (saved.values(1) * static_cast<std::int64_t>(sizeof(T)));
      r.probs = empty({saved.values(saved.heads)}, call.q.options());
      saved.data = r.probs.data<T>();
      O.saved = saved;
    }
    const std::int64_t blocks = (Tq + kBlockQ - 1) / kBlockQ;
    parallel_tasks(0, B * H * blocks, 1, [&](TaskQueue& tasks) { forward_tasks_any(isa, P, O, tasks); });
  });
}

void attention_backward(const AttentionCall& call, const AttentionSaved& s, const kernels::AttentionGrads& g) {
  if (call.q.dtype() == DType::bf16) {
    attention_backward_bf16(call, s, g, bf16_kernel());
    return;
  }
  const std::int64_t B = call.q.size(0), H = call.q.size(1), Tq = call.q.size(2), Tk = call.k.size(2);
  const Isa isa = cpu_isa();
  AG_DISPATCH_FLOAT(call.q.dtype(), "attention backward", [&] {
    using T = scalar_t;
    const Problem<T> P = attention_problem<T>(call);
    BackwardIo<T> io{attention_rows<const T>(s.dout), attention_rows<const T>(s.out), s.lse.data<T>(),
                     attention_rows<T>(g.dq),        attention_rows<T>(g.dk),        attention_rows<T>(g.dv), {}};
    if (s.probs.defined()) {  // checked by kernels::attention_backward: whole heads of this layout
      SavedProbs<T> saved(Tq, Tk, call.options.causal);
      saved.heads = s.probs.numel() / saved.values(1);
      saved.data = const_cast<T*>(s.probs.data<T>());
      io.saved = saved;
    }
    parallel_tasks(0, B * H, 1, [&](TaskQueue& heads) { backward_heads_any(isa, P, io, heads); });
  });
}

}  // namespace attograd::cpu

// The CPU's saved tiles answer the public query (tensor/kernels.h): the GPU keeps none.
namespace attograd::kernels {

std::int64_t attention_probs_bytes(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal,
                                   std::int64_t element_bytes, std::int64_t budget) {
  using cpu::attention_detail::SavedProbs;
  const std::int64_t per_head = SavedProbs<float>(Tq, Tk, causal).values(1) * element_bytes;  // any T: one layout
  return per_head > 0 && budget >= per_head ? std::min(heads, budget / per_head) * per_head : 0;
}

}  // namespace attograd::kernels
