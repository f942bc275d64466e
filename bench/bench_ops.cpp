// Single-op cases: matmul, softmax, layer_norm, cross_entropy, and the GPT
// step's GELU and bias-gradient sum, through the differentiable ops users call
// (autograd/ops.h), float32 on the CPU.
//
// FLOP counts per iteration (a convention: one FLOP per add, multiply, max or
// exp; the same formulas are in bench/torch_reference.py):
//   matmul (M,K) @ (K,N)            2 M K N
//   softmax over R rows of n        fwd 5 R n (max, sub, exp, sum, scale)
//                                   bwd 4 R n (dy*y, sum, sub, mul)
//   layer_norm over N rows of C     fwd 8 N C (mean 1, variance 3, normalise 2, affine 2)
//                                   bwd 11 N C (dy*w 1, two row sums 3, dx 4, dw 2, db 1)
//   cross_entropy, N rows of V      fwd 4 N V (max, sub, exp, sum)
//                                   bwd 3 N V (sub, exp, scale; the one-hot subtraction is per row)
//   gelu over n elements            fwd 9 n (x^3 2, c x^3 + x 2, scale 1, exp 1, 1 + e 1, divide 1, x s 1)
//                                   bwd 18 n (s again 8, then s + 2 x s (1 - s) k (1 + 3 c x^2) 9, dy * 1)
//   sum over the N rows of (N, C)   N C
//   adamw over n elements           14 n (m 3, v 4, the update 7 with its square root and division)
// Bytes per iteration are the compulsory float32 traffic: each input read once
// and each output written once (4 bytes an element), not what the caches see:
//   matmul 4 (MK + KN + MN); softmax fwd 8 R n, bwd 12 R n (reads y, dy; writes dx);
//   layer_norm fwd 8 N C, bwd 12 N C; cross_entropy fwd 4 N V, bwd 8 N V;
//   gelu fwd 8 n, bwd 12 n; sum 4 N C + 4 C; adamw 28 n (reads p, g, m, v; writes p, m, v).
// A "_fwdbwd" case counts fwd + bwd.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "autograd/ops/reference.h"
#include "bench_common.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"
#include "tensor/storage.h"

namespace attograd::bench {
namespace {

// ---- matmul ----------------------------------------------------------------------

// out = a @ b on (M, K) x (K, N), checked against a naive double loop on its
// top-left corner (up to 16 x 16) before timing.
void matmul_case(benchmark::State& state, std::int64_t M, std::int64_t K, std::int64_t N) {
  const Tensor a = random_input({M, K}, 1);  // (M, K)
  const Tensor b = random_input({K, N}, 2);  // (K, N)
  {
    const Tensor out = matmul(a, b);  // (M, N)
    const float *pa = a.data<float>(), *pb = b.data<float>(), *po = out.data<float>();
    const std::int64_t rows = std::min<std::int64_t>(M, 16), cols = std::min<std::int64_t>(N, 16);
    // A float32 sum of K unit-size products is off by about sqrt(K) * 6e-8 (float32's
    // half-ulp at 1); 1e-4 sqrt(K) leaves a wide margin yet catches any wrong element.
    const double tolerance = 1e-4 * std::sqrt(static_cast<double>(K));
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        double want = 0;
        for (std::int64_t k = 0; k < K; ++k) want += static_cast<double>(pa[i * K + k]) * pb[k * N + j];
        if (std::abs(po[i * N + j] - want) > tolerance) {
          state.SkipWithError(("check failed: matmul differs from a naive loop at (" + std::to_string(i) + ", " +
                               std::to_string(j) + "): " + std::to_string(po[i * N + j]) + " vs " +
                               std::to_string(want))
                                  .c_str());
          return;
        }
      }
  }
  for (auto _ : state) {
    Tensor out = matmul(a, b);
    benchmark::DoNotOptimize(out.raw_data());
  }
  set_counters(state, 2.0 * M * K * N, 4.0 * (M * K + K * N + M * N));
}

// out = a @ b in bfloat16 (float32 sums), the kernel of cpu/matmul_bf16/
// (its name in the JSON context, bf16_kernel), checked on its top-left corner
// against float64 sums of the same bfloat16 operands: within bfloat16's
// rounding of the result (2^-8) and K float32 additions of terms under 16.
void matmul_bf16_case(benchmark::State& state, std::int64_t M, std::int64_t K, std::int64_t N) {
  const Tensor a = kernels::cast(random_input({M, K}, 1), DType::bf16);  // (M, K)
  const Tensor b = kernels::cast(random_input({K, N}, 2), DType::bf16);  // (K, N)
  {
    const Tensor out = kernels::cast(matmul(a, b), DType::f64);
    const Tensor a64 = kernels::cast(a, DType::f64), b64 = kernels::cast(b, DType::f64);
    const double *pa = a64.data<double>(), *pb = b64.data<double>(), *po = out.data<double>();
    for (std::int64_t i = 0; i < std::min<std::int64_t>(M, 16); ++i)
      for (std::int64_t j = 0; j < std::min<std::int64_t>(N, 16); ++j) {
        double want = 0, scale = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          want += pa[i * K + k] * pb[k * N + j];
          scale += std::abs(pa[i * K + k] * pb[k * N + j]);
        }
        if (std::abs(po[i * N + j] - want) > std::abs(want) / 256 + K * 0x1p-24 * scale) {
          state.SkipWithError(("check failed: bfloat16 matmul differs from float64 sums at (" + std::to_string(i) +
                               ", " + std::to_string(j) + ")")
                                  .c_str());
          return;
        }
      }
  }
  for (auto _ : state) {
    Tensor out = matmul(a, b);
    benchmark::DoNotOptimize(out.raw_data());
  }
  set_counters(state, 2.0 * M * K * N, 2.0 * (M * K + K * N + M * N));
}

// ---- softmax ---------------------------------------------------------------------

// softmax over the last dim of the attention scores (B, H, T, T) of a shape.
void softmax_case(benchmark::State& state, const AttentionShape& s, bool backward_too) {
  const Shape sizes{s.B, s.H, s.T, s.T};
  const Tensor x = random_input(sizes, 3, 1.0, backward_too);  // (B, H, T, T)
  const Tensor dy = random_input(sizes, 4);                   // (B, H, T, T)
  {
    Tensor y = softmax(x, -1);
    Tensor ref_x = x.detach();
    if (backward_too) ref_x.set_requires_grad(true);
    Tensor ref = reference::softmax(ref_x, -1);
    if (!check_close(state, "softmax", y, ref, 1e-6, 1e-4)) return;
    if (backward_too) {
      backward(y, dy);
      backward(ref, dy);
      if (!check_close(state, "softmax grad", x.grad(), ref_x.grad(), 1e-6, 1e-4)) return;
    }
  }
  for (auto _ : state) {
    x.set_grad(Tensor());
    Tensor y = softmax(x, -1);
    if (backward_too) backward(y, dy);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double n = static_cast<double>(s.B * s.H * s.T * s.T);
  set_counters(state, backward_too ? 9 * n : 5 * n, backward_too ? 20 * n : 8 * n);
}

// ---- layer_norm ------------------------------------------------------------------

// layer_norm over (N, C) rows with weight and bias (C).
void layer_norm_case(benchmark::State& state, std::int64_t N, std::int64_t C, bool backward_too) {
  const Tensor x = random_input({N, C}, 5, 1.0, backward_too);  // (N, C)
  const Tensor weight = random_input({C}, 6, 1.0, backward_too);
  const Tensor bias = random_input({C}, 7, 1.0, backward_too);
  const Tensor dy = random_input({N, C}, 8);  // (N, C)
  {
    Tensor y = layer_norm(x, weight, bias);
    Tensor rx = x.detach(), rw = weight.detach(), rb = bias.detach();
    if (backward_too) rx.set_requires_grad(true), rw.set_requires_grad(true), rb.set_requires_grad(true);
    Tensor ref = reference::layer_norm(rx, rw, rb);
    if (!check_close(state, "layer_norm", y, ref)) return;
    if (backward_too) {
      backward(y, dy);
      backward(ref, dy);
      if (!check_close(state, "layer_norm dx", x.grad(), rx.grad()) ||
          !check_close(state, "layer_norm dweight", weight.grad(), rw.grad(), 1e-3, 1e-3) ||
          !check_close(state, "layer_norm dbias", bias.grad(), rb.grad(), 1e-3, 1e-3))
        return;
    }
  }
  for (auto _ : state) {
    for (const Tensor& t : {x, weight, bias}) t.set_grad(Tensor());
    Tensor y = layer_norm(x, weight, bias);
    if (backward_too) backward(y, dy);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double n = static_cast<double>(N * C);
  set_counters(state, backward_too ? 19 * n : 8 * n, backward_too ? 20 * n : 8 * n);
}

// ---- cross_entropy ---------------------------------------------------------------

// Mean cross-entropy of (N, V) logits against int64 targets (N).
void cross_entropy_case(benchmark::State& state, std::int64_t N, std::int64_t V, bool backward_too) {
  const Tensor logits = random_input({N, V}, 9, 1.0, backward_too);  // (N, V)
  std::vector<std::int64_t> ids(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) ids[static_cast<std::size_t>(i)] = (i * 7919) % V;
  const Tensor targets = from_vector(ids, {N});  // (N) int64
  {
    Tensor loss = cross_entropy(logits, targets);
    Tensor rl = logits.detach();
    if (backward_too) rl.set_requires_grad(true);
    Tensor ref = reference::cross_entropy(rl, targets);
    if (!check_close(state, "cross_entropy", loss, ref, 1e-5, 1e-5)) return;
    if (backward_too) {
      backward(loss);
      backward(ref);
      if (!check_close(state, "cross_entropy grad", logits.grad(), rl.grad(), 1e-7, 1e-4)) return;
    }
  }
  for (auto _ : state) {
    logits.set_grad(Tensor());
    Tensor loss = cross_entropy(logits, targets);
    if (backward_too) backward(loss);
    benchmark::DoNotOptimize(loss.raw_data());
  }
  const double n = static_cast<double>(N * V);
  set_counters(state, backward_too ? 7 * n : 4 * n, backward_too ? 12 * n : 4 * n);
}

// ---- the classifier and its loss ---------------------------------------------------------

// GPT's head and loss over N positions of width C and a vocabulary of V, forward
// and backward: composed (linear, then cross_entropy over the whole (N, V)
// logits) or fused (linear_cross_entropy, a chunk of rows at a time). The
// counter held_MB is what the forward leaves allocated for the backward: the
// composed op's (N, V) logits, or the fused op's gradients.
void classifier_case(benchmark::State& state, std::int64_t N, std::int64_t C, std::int64_t V, bool fused) {
  const Tensor x = random_input({N, C}, 3, 1.0, true), weight = random_input({V, C}, 4, 0.02, true);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) ids[static_cast<std::size_t>(i)] = (i * 7919) % V;
  const Tensor targets = from_vector(ids, {N});
  const auto loss_of = [&] { return fused ? linear_cross_entropy(x, weight, targets) : cross_entropy(linear(x, weight), targets); };
  {
    const Tensor a = linear_cross_entropy(x, weight, targets), b = cross_entropy(linear(x, weight), targets);
    if (!check_close(state, "linear_cross_entropy", a, b, 1e-5, 1e-5)) return;
  }
  double held = 0;
  for (auto _ : state) {
    x.set_grad(Tensor()), weight.set_grad(Tensor());
    const std::size_t before = cpu_alloc_stats().bytes_in_use;
    Tensor loss = loss_of();
    held = static_cast<double>(cpu_alloc_stats().bytes_in_use - before);
    backward(loss);
    benchmark::DoNotOptimize(loss.raw_data());
  }
  state.counters["held_MB"] = held / 1e6;
  const double n = static_cast<double>(N * V);
  set_counters(state, 6 * n * static_cast<double>(C), 4 * static_cast<double>(V * C + N * C));
}

// ---- gelu and the bias gradient --------------------------------------------------------

// GELU (tanh form) over (N, C).
void gelu_case(benchmark::State& state, std::int64_t N, std::int64_t C, bool backward_too) {
  const Tensor x = random_input({N, C}, 10, 1.0, backward_too);  // (N, C)
  const Tensor dy = random_input({N, C}, 11);                     // (N, C)
  {
    Tensor y = gelu(x);
    Tensor rx = x.detach();
    if (backward_too) rx.set_requires_grad(true);
    Tensor ref = reference::gelu(rx);
    if (!check_close(state, "gelu", y, ref)) return;
    if (backward_too) {
      backward(y, dy);
      backward(ref, dy);
      if (!check_close(state, "gelu dx", x.grad(), rx.grad())) return;
    }
  }
  for (auto _ : state) {
    x.set_grad(Tensor());
    Tensor y = gelu(x);
    if (backward_too) backward(y, dy);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double n = static_cast<double>(N * C);
  set_counters(state, backward_too ? 27 * n : 9 * n, backward_too ? 20 * n : 8 * n);
}

// A Linear's bias gradient: the sum of the output gradient (N, C) over its rows.
void sum_rows_case(benchmark::State& state, std::int64_t N, std::int64_t C) {
  const Tensor g = random_input({N, C}, 12);  // (N, C)
  {
    const Tensor want = to(sum(to(g, DType::f64), {0}), DType::f32);
    if (!check_close(state, "sum over rows", sum(g, {0}), want)) return;
  }
  for (auto _ : state) {
    Tensor s = sum(g, {0});
    benchmark::DoNotOptimize(s.raw_data());
  }
  set_counters(state, static_cast<double>(N * C), 4.0 * static_cast<double>(N * C + C));
}

// Case names: matmul/<n> (square), matmul_bf16/<n|mlp_up|mlp_down>, matmul/proj/<shape> ((B*T, C) @ (C, C)),
// softmax_{fwd,fwdbwd}/<shape>, layer_norm_{fwd,fwdbwd}/<shape|gpt>,
// cross_entropy_{fwd,fwdbwd}/<gpt|V8192>, classifier_fwdbwd/gpt2/<composed|fused>, gelu_{fwd,fwdbwd}/gpt, sum_rows/gpt.
// ---- AdamW ------------------------------------------------------------------------

// One float32 AdamW update of n elements (kernels::adamw_step_, as
// train::optim::AdamW calls it), checked on its first element against the
// formula in float64 first.
void adamw_case(benchmark::State& state, std::int64_t n) {
  const Tensor param = random_input({n}, 1), grad = random_input({n}, 2);
  const Tensor m = zeros({n}), v = zeros({n});
  const std::vector<kernels::AdamWParameter> params = {{param, grad, m, v, true}};
  const kernels::AdamWStep step{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 1};
  {
    const double p0 = param.data<float>()[0], g0 = grad.data<float>()[0];
    kernels::adamw_step_(params, step);
    // Step 1: m^ = g, v^ = g^2, so p = p (1 - lr wd) - lr g / (|g| + eps).
    const double want = p0 * (1 - 1e-5) - 1e-4 * g0 / (std::abs(g0) + 1e-8);
    if (std::abs(param.data<float>()[0] - want) > 1e-6 * (1 + std::abs(want))) {
      state.SkipWithError(("check failed: AdamW's first element " + std::to_string(param.data<float>()[0]) +
                           ", the formula gives " + std::to_string(want))
                              .c_str());
      return;
    }
  }
  for (auto _ : state) kernels::adamw_step_(params, step);
  set_counters(state, 14.0 * n, 28.0 * n);
}

const bool registered = [] {
  for (std::int64_t n : {256, 512, 1024, 2048}) {
    register_case("matmul/" + std::to_string(n), [n](benchmark::State& st) { matmul_case(st, n, n, n); });
  }
  for (std::int64_t n : {768, 2048})
    register_case("matmul_bf16/" + std::to_string(n), [n](benchmark::State& st) { matmul_bf16_case(st, n, n, n); });
  // The shakespeare_char MLP's products (batch 16 x block 256 tokens, width 384):
  // each shape is one layer's forward and the other layer's input gradient.
  register_case("matmul_bf16/mlp_up", [](benchmark::State& st) { matmul_bf16_case(st, 4096, 384, 1536); });
  register_case("matmul_bf16/mlp_down", [](benchmark::State& st) { matmul_bf16_case(st, 4096, 1536, 384); });
  for (const AttentionShape& s : kAttentionShapes) {
    register_case(std::string("matmul/proj/") + s.name,
                  [s](benchmark::State& st) { matmul_case(st, s.B * s.T, s.C, s.C); });
  }
  for (bool bwd : {false, true}) {
    const std::string suffix = bwd ? "_fwdbwd/" : "_fwd/";
    for (const AttentionShape& s : kAttentionShapes) {
      register_case("softmax" + suffix + s.name, [s, bwd](benchmark::State& st) { softmax_case(st, s, bwd); });
      register_case("layer_norm" + suffix + s.name,
                    [s, bwd](benchmark::State& st) { layer_norm_case(st, s.B * s.T, s.C, bwd); });
    }
    // The toy GPT's final norm and loss: batch 32 x block 128 tokens, width 128, vocab 65.
    register_case("layer_norm" + suffix + "gpt", [bwd](benchmark::State& st) { layer_norm_case(st, 4096, 128, bwd); });
    register_case("cross_entropy" + suffix + "gpt",
                  [bwd](benchmark::State& st) { cross_entropy_case(st, 4096, 65, bwd); });
    register_case("cross_entropy" + suffix + "V8192",
                  [bwd](benchmark::State& st) { cross_entropy_case(st, 1024, 8192, bwd); });
    // The toy GPT's MLP: 4096 tokens, 4 x 128 wide.
    register_case("gelu" + suffix + "gpt", [bwd](benchmark::State& st) { gelu_case(st, 4096, 512, bwd); });
  }
  // GPT-2's head and loss: 1024 positions (a batch of one block), width 768, its vocabulary padded.
  for (bool fused : {false, true})
    register_case(std::string("classifier_fwdbwd/gpt2/") + (fused ? "fused" : "composed"),
                  [fused](benchmark::State& st) { classifier_case(st, 1024, 768, 50304, fused); });
  // The toy GPT's widest bias gradient, its qkv projection's: 4096 tokens, 3 x 128.
  register_case("sum_rows/gpt", [](benchmark::State& st) { sum_rows_case(st, 4096, 384); });
  // GPT-2 small's 124,439,808 parameters, updated as one.
  register_case("adamw/gpt2", [](benchmark::State& st) { adamw_case(st, 124439808); });
  return true;
}();

}  // namespace
}  // namespace attograd::bench
