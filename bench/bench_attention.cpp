// Attention cases, causal, float32 on the CPU, at the design notes' shapes
// S, M, L (bench_common.h), each for the composed reference path and the fused
// path of the attention op (autograd/attention.h):
//   attn_core_{fwd,fwdbwd}/{composed,fused}/{S,M,L}: attention(q, k, v) on
//       given q, k, v (B, H, T, D), D = C / H;
//   mha_{fwd,fwdbwd}/{composed,fused}/{S,M,L}: nn::MultiHeadAttention on
//       x (B, T, C) with its four C x C projections (q, k, v packed as one
//       (C, 3C) matmul, then out_proj), biases on;
//   attn_core_{fwd,fwdbwd}/fused/{T2048,T4096}: long sequences, (1, T, 512, 8),
//       heads of 64: the fused path only (the composed one is checked against
//       it once, as above).
//   attn_core_{fwd,fwdbwd}/bf16/{S,M,L,T2048}: the fused path on bfloat16 q, k,
//       v and dout (on AMX tiles where the CPU has them, widened to float32
//       elsewhere: the context's bf16_isa), checked against float32's fused
//       path within a few bfloat16 roundings.
// "_fwd" runs under NoGradGuard (no graph, as inference); "_fwdbwd" runs the
// forward with grad on, then backward from a fixed random dout, producing the
// gradients of every input and parameter. Before timing, the fused result is
// checked against the composed one (output, and for _fwdbwd every gradient).
//
// FLOP counts (matmul FLOPs only; the softmax, scaling and masking are not
// counted; bench/torch_reference.py uses the same formulas):
//   core fwd     2 matmuls (q k^T and P v) over the causal lower triangle,
//                diagonal included: T (T + 1) / 2 dot products of length D each,
//                2 B H D T (T + 1) FLOPs in all. The composed path computes the
//                full T x T products but is credited the same count, so the
//                rate is useful work per second and compares paths by time.
//   core fwdbwd  3 x fwd: backward is 4 triangle matmuls (dv = P^T dout,
//                dP = dout v^T, dq = dS k, dk = dS^T q); the fused backward's
//                recomputation of q k^T is not counted (as FlashAttention counts).
//   mha fwd      core fwd + projections: (B T, C) x (C, 3C) and (B T, C) x (C, C),
//                8 B T C^2 FLOPs (bias adds not counted).
//   mha fwdbwd   3 x mha fwd (each matmul's backward is two matmuls of its size).
// Bytes are the compulsory float32 traffic (each tensor read or written once; half of it in bfloat16):
//   core fwd     reads q, k, v, writes out: 16 B H T D
//   core fwdbwd  + reads q, k, v, out, dout, writes dq, dk, dv: 48 B H T D
//   mha fwd      reads x and the parameters P = 4 C^2 + 4 C, writes y: 4 (2 B T C + P)
//   mha fwdbwd   + reads dout, x, P, writes dx and P gradients: 4 (4 B T C + 3 P)
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/attention.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "bench_common.h"
#include "nn/attention.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"

namespace attograd::bench {
namespace {

double core_fwd_flops(const AttentionShape& s) {
  return 2.0 * s.B * s.H * s.D() * s.T * (s.T + 1);
}
double projection_fwd_flops(const AttentionShape& s) { return 8.0 * s.B * s.T * s.C * s.C; }

const char* impl_name(AttentionImpl impl) { return impl == AttentionImpl::fused ? "fused" : "composed"; }

// ---- core: attention(q, k, v) --------------------------------------------------

CoreInputs core_inputs(const AttentionShape& s) {
  const Shape sizes{s.B, s.H, s.T, s.D()};
  return {random_input(sizes, 11, 1.0, true), random_input(sizes, 12, 1.0, true), random_input(sizes, 13, 1.0, true),
          random_input(sizes, 14)};
}

// The fused path against the composed one, on the same inputs.
bool check_core(benchmark::State& state, const CoreInputs& in, bool backward_too) {
  const Tensor out = run_core(in, AttentionImpl::composed, backward_too);
  const Tensor dq = in.q.grad(), dk = in.k.grad(), dv = in.v.grad();
  const Tensor fused_out = run_core(in, AttentionImpl::fused, backward_too);
  if (!check_close(state, "fused attention output", fused_out, out)) return false;
  if (!backward_too) return true;
  return check_close(state, "fused attention dq", in.q.grad(), dq) &&
         check_close(state, "fused attention dk", in.k.grad(), dk) &&
         check_close(state, "fused attention dv", in.v.grad(), dv);
}

void attn_core_case(benchmark::State& state, const AttentionShape& s, AttentionImpl impl, bool backward_too) {
  const CoreInputs in = core_inputs(s);
  if (!check_core(state, in, backward_too)) return;
  for (auto _ : state) {
    Tensor out = run_core(in, impl, backward_too);
    benchmark::DoNotOptimize(out.raw_data());
  }
  const double btd = static_cast<double>(s.B * s.H * s.T * s.D());
  set_counters(state, (backward_too ? 3 : 1) * core_fwd_flops(s), (backward_too ? 48 : 16) * btd);
}

// ---- core in bfloat16 -------------------------------------------------------------

void attn_core_bf16_case(benchmark::State& state, const AttentionShape& s, bool backward_too) {
  const CoreInputs in = cast_inputs(core_inputs(s), DType::bf16);
  if (!check_bf16_core(state, in, backward_too)) return;
  for (auto _ : state) {
    Tensor out = run_core(in, AttentionImpl::fused, backward_too);
    benchmark::DoNotOptimize(out.raw_data());
  }
  const double btd = static_cast<double>(s.B * s.H * s.T * s.D());
  set_counters(state, (backward_too ? 3 : 1) * core_fwd_flops(s), (backward_too ? 24 : 8) * btd);
}

// ---- module: nn::MultiHeadAttention --------------------------------------------

nn::MultiHeadAttentionConfig mha_config(const AttentionShape& s, AttentionImpl impl) {
  nn::MultiHeadAttentionConfig config;
  config.d_model = s.C;
  config.num_heads = s.H;
  config.causal = true;
  config.impl = impl;
  return config;
}

Tensor run_mha(const nn::MultiHeadAttention& mha, const Tensor& x, const Tensor& dout, bool backward_too) {
  if (!backward_too) {
    NoGradGuard no_grad;
    return mha(x);
  }
  x.set_grad(Tensor());
  for (const Tensor& p : mha.parameters()) p.set_grad(Tensor());
  Tensor y = mha(x);  // (B, T, C)
  backward(y, dout);
  return y;
}

void mha_case(benchmark::State& state, const AttentionShape& s, AttentionImpl impl, bool backward_too) {
  const Tensor x = random_input({s.B, s.T, s.C}, 21, 1.0, backward_too);  // (B, T, C)
  const Tensor dout = random_input({s.B, s.T, s.C}, 22);                  // (B, T, C)
  // Two modules from the same seed hold the same weights; they differ only in the attention path.
  Generator init(23), init_reference(23);
  const nn::MultiHeadAttention mha(mha_config(s, impl), init);
  const nn::MultiHeadAttention reference(mha_config(s, AttentionImpl::composed), init_reference);
  {
    const Tensor want = run_mha(reference, x, dout, backward_too);
    const Tensor dx = backward_too ? x.grad() : Tensor();
    const Tensor got = run_mha(mha, x, dout, backward_too);
    if (!check_close(state, std::string("mha output vs composed"), got, want)) return;
    if (backward_too) {
      if (!check_close(state, "mha dx vs composed", x.grad(), dx)) return;
      const std::vector<nn::NamedParameter> ps = mha.named_parameters(), rs = reference.named_parameters();
      for (std::size_t i = 0; i < ps.size(); ++i)
        if (!check_close(state, "mha d" + ps[i].name + " vs composed", ps[i].tensor.grad(), rs[i].tensor.grad(),
                         1e-3, 1e-3))
          return;
    }
  }
  for (auto _ : state) {
    Tensor y = run_mha(mha, x, dout, backward_too);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double fwd = core_fwd_flops(s) + projection_fwd_flops(s);
  const double btc = static_cast<double>(s.B * s.T * s.C), params = 4.0 * s.C * s.C + 4.0 * s.C;
  set_counters(state, (backward_too ? 3 : 1) * fwd, backward_too ? 4 * (4 * btc + 3 * params) : 4 * (2 * btc + params));
}

// The L cases take a second or more per iteration with the composed path, and
// the long ones a good fraction of one with the fused path;
// a fixed, small iteration count keeps the whole suite within its time budget.
void limit_large(benchmark::internal::Benchmark* b, const AttentionShape& s) {
  if (s.T >= 1024) b->Iterations(3);
}

const bool registered = [] {
  for (bool bwd : {false, true}) {
    for (AttentionImpl impl : {AttentionImpl::composed, AttentionImpl::fused}) {
      for (const AttentionShape& s : kAttentionShapes) {
        const std::string tail = std::string("/") + impl_name(impl) + "/" + s.name;
        limit_large(register_case((bwd ? "attn_core_fwdbwd" : "attn_core_fwd") + tail,
                                  [s, impl, bwd](benchmark::State& st) { attn_core_case(st, s, impl, bwd); }),
                    s);
        limit_large(register_case((bwd ? "mha_fwdbwd" : "mha_fwd") + tail,
                                  [s, impl, bwd](benchmark::State& st) { mha_case(st, s, impl, bwd); }),
                    s);
      }
    }
  }
  for (bool bwd : {false, true})
    for (const AttentionShape& s : {kShapeS, kShapeM, kShapeL, kLongShapes[0]})
      limit_large(register_case(std::string(bwd ? "attn_core_fwdbwd" : "attn_core_fwd") + "/bf16/" + s.name,
                                [s, bwd](benchmark::State& st) { attn_core_bf16_case(st, s, bwd); }),
                  s);
  for (bool bwd : {false, true})
    for (const AttentionShape& s : kLongShapes)
      limit_large(register_case(std::string(bwd ? "attn_core_fwdbwd" : "attn_core_fwd") + "/fused/" + s.name,
                                [s, bwd](benchmark::State& st) { attn_core_case(st, s, AttentionImpl::fused, bwd); }),
                  s);
  return true;
}();

}  // namespace
}  // namespace attograd::bench
