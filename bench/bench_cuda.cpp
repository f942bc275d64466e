// GPU cases, registered only when a CUDA device is present (names start with
// "cuda_"; the rest of each name follows the CPU cases'):
//   cuda_matmul/{1024,2048,4096}                         square float32 SGEMM
//   cuda_matmul/gpt_MxKxN[_at]                           the toy GPT's products (_at: A read transposed)
//   cuda_matmul/tc/...                                   the same on the tensor-core kernels (3xTF32)
//   cuda_matmul/bf16/...                                 the same on bfloat16 operands (tensor cores),
//   cuda_matmul/bf16/gpt2_MxKxN[_at][_bt]                and GPT-2 small's products (_bt: B read transposed)
//   cuda_matmul/bf16_wgmma/{4096,4096_bt,gpt2_...}        those on the sm_90a kernels (wgmma, TMA copies)
//   cuda_matmul/bf16_wgmma_cp_async/{4096,4096_bt}       the sm_90a kernel with cp.async copies
//   cuda_attn_core_{fwd,fwdbwd}/{fused,fused_tc,composed}/{S..XXL} causal attention on given q, k, v
//   cuda_attn_core_{fwd,fwdbwd}/bf16/{S..XXL}             the same fused on bfloat16 (cuda/attention_bf16.cu)
//   cuda_attn_core_fwdbwd/bf16_dropout/XL                 the same with dropout 0.1 on the weights
//   cuda_mha_fwdbwd/{fused,fused_tc}/{S..XXL}             nn::MultiHeadAttention, forward + backward
//     (fused: the SIMT kernels; fused_tc: the tensor-core ones, 3xTF32; see cuda/runtime.h)
//   cuda_softmax_fwdbwd/XL, cuda_layer_norm_fwdbwd/XL, cuda_cross_entropy_fwdbwd/V50304
//   cuda_gpt_step, cuda_gpt_step_tc                        the toy GPT's training step (tokens/s), its
//                                                          attention and matmul on the SIMT or the tensor-core kernels
//   cuda_gpt_step/bf16, cuda_gpt2_step[/bf16[_wgmma]]      the toy GPT under autocast; GPT-2 small (12 layers,
//                                                          768, block 1024, batch 8, vocab 65) in either dtype
//   cuda_gpt2_124m_step/bf16[_wgmma]                       the same with GPT-2's vocabulary (50304), under autocast
// Shapes (B, T, C, H) are the design notes': S, M, L of bench_common.h, and on
// the GPU also XL = (8, 1024, 768, 12) and XXL = (4, 4096, 768, 12); the
// composed path is left out at XXL (its (T, T) matrices alone are 3 GiB).
//
// GPU time is measured with CUDA events around each iteration's work
// (UseManualTime), so it excludes nothing the GPU waits for but counts no host
// time after the last kernel. FLOP and byte formulas are those of
// bench_attention.cpp, bench_ops.cpp and bench_gpt.cpp.
//
// Each case checks its result once before timing: matmul against the CPU on a
// band of rows; fused attention against the composed path on the GPU (on the
// first batch entry for the big shapes); the row ops against the CPU; the GPT
// by its first loss (near ln V) and by four steps lowering it.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "bench_common.h"
#include "bench_step_case.h"
#include "cuda/runtime.h"
#include "nn/attention.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"

namespace attograd::bench {
namespace {

inline constexpr AttentionShape kShapeXL{"XL", 8, 1024, 768, 12};
inline constexpr AttentionShape kShapeXXL{"XXL", 4, 4096, 768, 12};
inline constexpr AttentionShape kGpuShapes[] = {kShapeS, kShapeM, kShapeL, kShapeXL, kShapeXXL};

const Device kGpu = Device::cuda(0);

// A float32 N(0, scale) tensor on the GPU, optionally a leaf requiring grad.
Tensor gpu_input(const Shape& sizes, std::uint64_t seed, double scale = 1.0, bool requires_grad = false) {
  Tensor t = kernels::to_device(random_input(sizes, seed, scale), kGpu);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// Times every iteration's GPU work with CUDA events.
template <typename Fn>
void time_iterations(benchmark::State& state, Fn work) {
  for (auto _ : state) state.SetIterationTime(cuda::time_gpu_ms(0, work) / 1000.0);
}

template <typename Fn>
benchmark::internal::Benchmark* register_gpu_case(const std::string& name, Fn&& fn) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Fn>(fn))
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

// ---- matmul ------------------------------------------------------------------------------------

// C (M, N) = A (M, K) B (K, N); with a_transposed, A is stored as (K, M) and
// read through a transposed view, as a Linear's weight gradient X^T dY is.
void matmul_case(benchmark::State& state, cuda::KernelSet kernels_to_use, std::int64_t M, std::int64_t K,
                 std::int64_t N, bool a_transposed = false) {
  const cuda::ScopedKernelSet kernels(cuda::KernelOp::matmul, kernels_to_use);
  const Tensor a_stored = gpu_input(a_transposed ? Shape{K, M} : Shape{M, K}, 1), b = gpu_input({K, N}, 2);
  const Tensor a = a_transposed ? make_view(a_stored, {M, K}, {1, M}, 0) : a_stored;
  {
    // The first 64 rows against the CPU (OpenBLAS), 1e-4 sqrt(K) as in bench_ops.cpp.
    const std::int64_t band = std::min<std::int64_t>(64, M);
    const Tensor rows = kernels::to_device(kernels::matmul(a, b), Device::cpu());
    const Tensor a_cpu = kernels::contiguous(kernels::to_device(a, Device::cpu()));
    const Tensor want = kernels::matmul(make_view(a_cpu, {band, K}, {K, 1}, 0), kernels::to_device(b, Device::cpu()));
    const Tensor got = make_view(rows, {band, N}, {N, 1}, 0);
    if (!check_close(state, "cuda matmul rows 0..63 vs the CPU", got, want, 1e-4 * std::sqrt(double(K)), 1e-4)) return;
  }
  time_iterations(state, [&] { benchmark::DoNotOptimize(kernels::matmul(a, b).raw_data()); });
  const double m = static_cast<double>(M), k = static_cast<double>(K), n = static_cast<double>(N);
  set_counters(state, 2 * m * k * n, 4 * (m * k + k * n + m * n));
}

// The same product on bfloat16 operands (cuda/matmul_bf16.cu: the tensor
// cores, float32 sums, a bfloat16 result), checked on the first 64 rows
// against the CPU's bfloat16 product of the same operands: each result is one
// rounding of a float32 sum, the two sums added in different orders, so they
// may differ by a unit of bfloat16 (2^-7 relative) and the sums' own error.
void matmul_bf16_case(benchmark::State& state, std::int64_t M, std::int64_t K, std::int64_t N,
                      bool a_transposed = false, bool b_transposed = false) {
  const auto bf16 = [](const Tensor& x) { return kernels::cast(x, DType::bf16); };
  const Tensor a_stored = bf16(gpu_input(a_transposed ? Shape{K, M} : Shape{M, K}, 1));
  const Tensor b_stored = bf16(gpu_input(b_transposed ? Shape{N, K} : Shape{K, N}, 2));
  const Tensor a = a_transposed ? make_view(a_stored, {M, K}, {1, M}, 0) : a_stored;
  const Tensor b = b_transposed ? make_view(b_stored, {K, N}, {1, K}, 0) : b_stored;
  {
    const std::int64_t band = std::min<std::int64_t>(64, M);
    const auto f32_on_cpu = [](const Tensor& x) {
      return kernels::cast(kernels::to_device(x, Device::cpu()), DType::f32);
    };
    const Tensor rows = f32_on_cpu(kernels::matmul(a, b));
    const Tensor a_band = make_view(a_stored, {band, K}, a.strides(), 0);  // A's first rows, brought over alone
    const Tensor want = kernels::matmul(kernels::to_device(a_band, Device::cpu()), kernels::to_device(b, Device::cpu()));
    const Tensor got = make_view(rows, {band, N}, {N, 1}, 0);
    if (!check_close(state, "cuda bfloat16 matmul rows 0..63 vs the CPU", got, kernels::cast(want, DType::f32),
                     1e-4 * std::sqrt(double(K)), 1.0 / 128))
      return;
  }
  time_iterations(state, [&] { benchmark::DoNotOptimize(kernels::matmul(a, b).raw_data()); });
  const double m = static_cast<double>(M), k = static_cast<double>(K), n = static_cast<double>(N);
  set_counters(state, 2 * m * k * n, 2 * (m * k + k * n + m * n));
}

// The toy GPT's products (B T = 4096 tokens, C = 128): the forward's X W^T of
// the attention projection, the MLP's two, and a weight gradient X^T dY.
// Skinny products leave few 64 x 64 tiles per SM, where square ones fill it.
struct GemmShape {
  std::int64_t M, K, N;
  bool a_transposed;
};
constexpr GemmShape kGptGemms[] = {
    {4096, 128, 128, false}, {4096, 128, 512, false}, {4096, 512, 128, false}, {128, 4096, 512, true}};

std::string gemm_name(const std::string& prefix, const GemmShape& s) {
  return prefix + "gpt_" + std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N) +
         (s.a_transposed ? "_at" : "");
}

// GPT-2 small's products at batch 8 x 1024 (8192 tokens, C 768, vocab 50304), as
// nn::Linear makes them: forward X W^T (B transposed: W is (out, in)), the
// input's gradient dY W, the weight's dY^T X (A transposed; few tiles over a
// long K, so split into slices). The qkv, the MLP's two, the head.
struct Gpt2Gemm {
  std::int64_t M, K, N;
  bool a_transposed, b_transposed;
};
constexpr Gpt2Gemm kGpt2Gemms[] = {{8192, 768, 2304, false, true},  {8192, 768, 3072, false, true},
                                   {8192, 3072, 768, false, true},  {8192, 768, 50304, false, true},
                                   {8192, 3072, 768, false, false}, {3072, 8192, 768, true, false},
                                   {50304, 8192, 768, true, false}};

std::string gemm_name(const std::string& prefix, const Gpt2Gemm& s) {
  return prefix + "gpt2_" + std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N) +
         (s.a_transposed ? "_at" : "") + (s.b_transposed ? "_bt" : "");
}

// ---- attention -----------------------------------------------------------------------------------

double core_fwd_flops(const AttentionShape& s) { return 2.0 * s.B * s.H * s.D() * s.T * (s.T + 1); }

CoreInputs core_inputs(const AttentionShape& s, std::int64_t batch) {
  const Shape sizes{batch, s.H, s.T, s.D()};
  return {gpu_input(sizes, 11, 1.0, true), gpu_input(sizes, 12, 1.0, true), gpu_input(sizes, 13, 1.0, true),
          gpu_input(sizes, 14)};
}

// Fused against composed on the GPU, on the first batch entry (the (b, h)
// problems are independent, so one entry checks the kernels at full T and D).
bool check_core(benchmark::State& state, const AttentionShape& s, bool backward_too) {
  const CoreInputs in = core_inputs(s, 1);
  const Tensor want = run_core(in, AttentionImpl::composed, backward_too);
  const Tensor dq = in.q.grad(), dk = in.k.grad(), dv = in.v.grad();
  const Tensor got = run_core(in, AttentionImpl::fused, backward_too);
  if (!check_close(state, "cuda fused attention output", got, want)) return false;
  if (!backward_too) return true;
  return check_close(state, "cuda fused attention dq", in.q.grad(), dq) &&
         check_close(state, "cuda fused attention dk", in.k.grad(), dk) &&
         check_close(state, "cuda fused attention dv", in.v.grad(), dv);
}

// A case's variant: its name in the case's name ("fused", "fused_tc", "composed"), the path and the kernels.
struct AttentionVariant {
  const char* name;
  AttentionImpl impl;
  cuda::KernelSet kernels;
};
constexpr AttentionVariant kFusedSimt{"fused", AttentionImpl::fused, cuda::KernelSet::simt};
constexpr AttentionVariant kFusedTensorCore{"fused_tc", AttentionImpl::fused, cuda::KernelSet::tensor_core};
constexpr AttentionVariant kComposed{"composed", AttentionImpl::composed, cuda::KernelSet::simt};

void attn_core_case(benchmark::State& state, const AttentionShape& s, const AttentionVariant& variant,
                    bool backward_too) {
  const cuda::ScopedKernelSet kernels(cuda::KernelOp::attention, variant.kernels);
  const AttentionImpl impl = variant.impl;
  if (!check_core(state, s, backward_too)) return;
  const CoreInputs in = core_inputs(s, s.B);
  time_iterations(state, [&] { benchmark::DoNotOptimize(run_core(in, impl, backward_too).raw_data()); });
  const double bhtd = static_cast<double>(s.B * s.H * s.T * s.D());
  set_counters(state, (backward_too ? 3 : 1) * core_fwd_flops(s), (backward_too ? 48 : 16) * bhtd);
}

// bfloat16 q, k, v on cuda/attention_bf16.cu, checked as the CPU's bfloat16 case is, on the first batch entry.
void attn_core_bf16_case(benchmark::State& state, const AttentionShape& s, bool backward_too, double dropout_p = 0.0) {
  if (!check_bf16_core(state, cast_inputs(core_inputs(s, 1), DType::bf16), backward_too, dropout_p)) return;
  const CoreInputs in = cast_inputs(core_inputs(s, s.B), DType::bf16);
  time_iterations(state, [&] {
    benchmark::DoNotOptimize(run_core(in, AttentionImpl::fused, backward_too, dropout_p).raw_data());
  });
  const double bhtd = static_cast<double>(s.B * s.H * s.T * s.D());
  set_counters(state, (backward_too ? 3 : 1) * core_fwd_flops(s), (backward_too ? 24 : 8) * bhtd);
}

void mha_case(benchmark::State& state, const AttentionShape& s, cuda::KernelSet kernels_to_use) {
  const cuda::ScopedKernelSet kernels(cuda::KernelOp::attention, kernels_to_use);
  nn::MultiHeadAttentionConfig config;
  config.d_model = s.C;
  config.num_heads = s.H;
  config.causal = true;
  config.impl = AttentionImpl::fused;
  Generator init(23);
  nn::MultiHeadAttention mha(config, init);
  mha.to(kGpu);
  const Tensor x = gpu_input({s.B, s.T, s.C}, 21, 1.0, true), dout = gpu_input({s.B, s.T, s.C}, 22);
  time_iterations(state, [&] {
    x.set_grad(Tensor());
    for (const Tensor& p : mha.parameters()) p.set_grad(Tensor());
    backward(mha(x), dout);
  });
  const double btc = static_cast<double>(s.B * s.T * s.C), params = 4.0 * s.C * s.C + 4.0 * s.C;
  set_counters(state, 3 * (core_fwd_flops(s) + 8.0 * s.B * s.T * s.C * s.C), 4 * (4 * btc + 3 * params));
}

// ---- row ops --------------------------------------------------------------------------------------

// The GPU inputs of a row-op case, drawn and checked against the CPU once per process: Google
// Benchmark calls a case once per repetition, and at the cross-entropy shape (206M logits)
// drawing the inputs and comparing took about 30 s of CPU time each time.
struct RowOpInputs {
  Tensor x, dout;
  bool checked = false;
};

// fn's output and its input's gradient (under dout) on the GPU against the CPU, then timed.
void row_op_case(benchmark::State& state, const std::string& what, const Shape& sizes,
                 const std::function<Tensor(const Tensor&)>& fn, double flops, double bytes) {
  // Leaked, as the allocator's caches are: freed at exit, the tensors would outlive the CUDA runtime.
  static auto& prepared = *new std::map<std::string, RowOpInputs>;
  const auto [entry, fresh] = prepared.try_emplace(what);
  RowOpInputs& in = entry->second;
  if (fresh) {
    const Tensor x_cpu = random_input(sizes, 41, 1.0, true), dout_cpu = random_input(sizes, 42);
    in.x = kernels::to_device(x_cpu.detach(), kGpu);
    in.x.set_requires_grad(true);
    in.dout = kernels::to_device(dout_cpu, kGpu);
    const Tensor want = fn(x_cpu);
    backward(want, dout_cpu.sizes() == want.sizes() ? dout_cpu : ones(want.sizes()));
    const Tensor got = fn(in.x);
    backward(got, in.dout.sizes() == got.sizes() ? in.dout : ones(got.sizes(), got.options()));
    in.checked = check_close(state, what + " vs the CPU", got, want) &&
                 check_close(state, what + " gradient vs the CPU", in.x.grad(), x_cpu.grad());
    if (!in.checked) return;
  } else if (!in.checked) {
    state.SkipWithError(("check failed: " + what + " (see its first repetition)").c_str());
    return;
  }
  Tensor& x = in.x;
  const Tensor& dout = in.dout;
  time_iterations(state, [&] {
    x.set_grad(Tensor());
    const Tensor y = fn(x);
    backward(y, dout.sizes() == y.sizes() ? dout : ones(y.sizes(), y.options()));
  });
  set_counters(state, flops, bytes);
}

// ---- training steps --------------------------------------------------------------------------------

// bench_step_case.h's step on the GPU; kernels_to_use: for both attention and matmul.
void gpu_step_case(benchmark::State& state, const StepCase& c, cuda::KernelSet kernels_to_use) {
  const cuda::ScopedKernelSet attention(cuda::KernelOp::attention, kernels_to_use);
  const cuda::ScopedKernelSet matmul(cuda::KernelOp::matmul, kernels_to_use);
  step_case(state, c, kGpu);
}

const bool registered = [] {
  if (cuda::device_count() == 0) return false;
  // cuda_matmul/... on the CUDA cores, cuda_matmul/tc/... on the tensor cores (3xTF32).
  for (cuda::KernelSet k : {cuda::KernelSet::simt, cuda::KernelSet::tensor_core}) {
    const std::string prefix = k == cuda::KernelSet::simt ? "cuda_matmul/" : "cuda_matmul/tc/";
    for (std::int64_t n : {1024, 2048, 4096})
      register_gpu_case(prefix + std::to_string(n), [k, n](benchmark::State& st) { matmul_case(st, k, n, n, n); });
    for (const GemmShape& s : kGptGemms)
      register_gpu_case(gemm_name(prefix, s),
                        [k, s](benchmark::State& st) { matmul_case(st, k, s.M, s.K, s.N, s.a_transposed); });
  }
  // cuda_matmul/bf16/...: bfloat16 operands on the tensor cores (one kernel set).
  for (std::int64_t n : {1024, 2048, 4096})
    register_gpu_case("cuda_matmul/bf16/" + std::to_string(n),
                      [n](benchmark::State& st) { matmul_bf16_case(st, n, n, n); });
  for (const GemmShape& s : kGptGemms)
    register_gpu_case(gemm_name("cuda_matmul/bf16/", s),
                      [s](benchmark::State& st) { matmul_bf16_case(st, s.M, s.K, s.N, s.a_transposed); });
  for (const Gpt2Gemm& s : kGpt2Gemms)
    register_gpu_case(gemm_name("cuda_matmul/bf16/", s), [s](benchmark::State& st) {
      matmul_bf16_case(st, s.M, s.K, s.N, s.a_transposed, s.b_transposed);
    });
  // cuda_matmul/bf16_wgmma/...: the same on the sm_90a kernels, where they run (an sm_90a build on
  // an H100 or H200), their tiles copied by TMA; 4096 also with B transposed (x W^T's layout), and
  // both again with the tiles copied by cp.async (cuda_matmul/bf16_wgmma_cp_async/...).
  if (cuda::wgmma_kernels_run(0)) {
    for (const auto [name, copies] : {std::pair{"bf16_wgmma", cuda::WgmmaProducts::tma},
                                      std::pair{"bf16_wgmma_cp_async", cuda::WgmmaProducts::cp_async}})
      for (bool b_transposed : {false, true})
        register_gpu_case(std::string("cuda_matmul/") + name + "/4096" + (b_transposed ? "_bt" : ""),
                          [b_transposed, copies](benchmark::State& st) {
                            const cuda::ScopedWgmmaProducts wgmma(copies);
                            matmul_bf16_case(st, 4096, 4096, 4096, false, b_transposed);
                          });
    for (const Gpt2Gemm& s : kGpt2Gemms)
      register_gpu_case(gemm_name("cuda_matmul/bf16_wgmma/", s), [s](benchmark::State& st) {
        const cuda::ScopedWgmmaProducts wgmma(cuda::WgmmaProducts::tma);
        matmul_bf16_case(st, s.M, s.K, s.N, s.a_transposed, s.b_transposed);
      });
  }
  for (bool bwd : {false, true})
    for (const AttentionVariant& variant : {kFusedSimt, kFusedTensorCore, kComposed})
      for (const AttentionShape& s : kGpuShapes) {
        if (variant.impl == AttentionImpl::composed && s.T > 1024) continue;
        const std::string name = std::string(bwd ? "cuda_attn_core_fwdbwd/" : "cuda_attn_core_fwd/") + variant.name +
                                 "/" + s.name;
        register_gpu_case(name, [s, variant, bwd](benchmark::State& st) { attn_core_case(st, s, variant, bwd); });
      }
  for (bool bwd : {false, true})
    for (const AttentionShape& s : kGpuShapes)
      register_gpu_case(std::string(bwd ? "cuda_attn_core_fwdbwd" : "cuda_attn_core_fwd") + "/bf16/" + s.name,
                        [s, bwd](benchmark::State& st) { attn_core_bf16_case(st, s, bwd); });
  // The same with dropout 0.1 on the weights (the flash kernels' Philox path), at GPT-2's shape.
  register_gpu_case("cuda_attn_core_fwdbwd/bf16_dropout/XL",
                    [](benchmark::State& st) { attn_core_bf16_case(st, kShapeXL, true, 0.1); });
  for (const AttentionVariant& variant : {kFusedSimt, kFusedTensorCore})
    for (const AttentionShape& s : kGpuShapes)
      register_gpu_case(std::string("cuda_mha_fwdbwd/") + variant.name + "/" + s.name,
                        [s, variant](benchmark::State& st) { mha_case(st, s, variant.kernels); });

  // Row ops at the XL shape: softmax over (B H T, T) scores, layer_norm over (B T, C),
  // cross_entropy over GPT-2's padded vocabulary. FLOP and byte formulas of bench_ops.cpp (fwd + bwd).
  const double R = 8.0 * 12 * 1024, n = 1024, N = 8.0 * 1024, C = 768, V = 50304;
  register_gpu_case("cuda_softmax_fwdbwd/XL", [=](benchmark::State& st) {
    row_op_case(st, "softmax", {8 * 12 * 1024, 1024}, [](const Tensor& x) { return softmax(x, -1); }, 9 * R * n,
                20 * R * n);
  });
  register_gpu_case("cuda_layer_norm_fwdbwd/XL", [=](benchmark::State& st) {
    row_op_case(st, "layer_norm", {8 * 1024, 768}, [](const Tensor& x) { return layer_norm(x, {}, {}); }, 19 * N * C,
                20 * N * C);
  });
  register_gpu_case("cuda_cross_entropy_fwdbwd/V50304", [=](benchmark::State& st) {
    const Tensor targets_cpu = kernels::cast(
        kernels::unary(kernels::Unary::mul_scalar, rand({4096}, {DType::f64}), static_cast<double>(V) - 0.5),
        DType::i64);
    const Tensor targets_gpu = kernels::to_device(targets_cpu, kGpu);
    row_op_case(st, "cross_entropy", {4096, 50304}, [=](const Tensor& x) {
      return cross_entropy(x, x.device().is_cuda() ? targets_gpu : targets_cpu);
    }, 7 * 4096 * V, 12 * 4096 * V);
  });
  constexpr auto simt = cuda::KernelSet::simt, tensor_core = cuda::KernelSet::tensor_core;
  register_gpu_case("cuda_gpt_step", [](benchmark::State& st) { gpu_step_case(st, gpt_step(), simt); });
  register_gpu_case("cuda_gpt_step_tc", [](benchmark::State& st) { gpu_step_case(st, gpt_step(), tensor_core); });
  register_gpu_case("cuda_gpt_step/bf16", [](benchmark::State& st) { gpu_step_case(st, in_bf16(gpt_step()), simt); });
  // GPT-2 small at the batch of the GPU issue's target (8 x 1024 tokens), vocab 65 as on the CPU.
  const auto gpt2 = [] { return real_size(12, 768, 12, 1024, 8); };
  register_gpu_case("cuda_gpt2_step", [gpt2](benchmark::State& st) { gpu_step_case(st, gpt2(), simt); });
  register_gpu_case("cuda_gpt2_step/bf16", [gpt2](benchmark::State& st) { gpu_step_case(st, in_bf16(gpt2()), simt); });
  if (cuda::wgmma_kernels_run(0))
    register_gpu_case("cuda_gpt2_step/bf16_wgmma", [gpt2](benchmark::State& st) {
      const cuda::ScopedWgmmaProducts wgmma(cuda::WgmmaProducts::tma);
      gpu_step_case(st, in_bf16(gpt2()), simt);
    });
  // The same with GPT-2's vocabulary, padded to 50304 as nanoGPT pads it: the classifier and its
  // loss over 50304 logits a token, the step the GPT-2 target times.
  const auto gpt2_124m = [] { return in_bf16(real_size(12, 768, 12, 1024, 8, 50304)); };
  register_gpu_case("cuda_gpt2_124m_step/bf16", [gpt2_124m](benchmark::State& st) { gpu_step_case(st, gpt2_124m(), simt); });
  if (cuda::wgmma_kernels_run(0))
    register_gpu_case("cuda_gpt2_124m_step/bf16_wgmma", [gpt2_124m](benchmark::State& st) {
      const cuda::ScopedWgmmaProducts wgmma(cuda::WgmmaProducts::tma);
      gpu_step_case(st, gpt2_124m(), simt);
    });
  return true;
}();

}  // namespace
}  // namespace attograd::bench
