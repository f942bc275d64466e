#include "bench_common.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "cpu/attention/attention.h"
#include "cpu/blas_setup.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"

namespace attograd::bench {
namespace {

// Written into the JSON's "context", where bench/compare reads them. Runs
// before main (benchmark_main), the only hook before the run starts.
const bool context_added = [] {
  benchmark::AddCustomContext("framework", "attograd " ATTOGRAD_VERSION);
  benchmark::AddCustomContext("threads", std::to_string(requested_threads()));
  try {
    benchmark::AddCustomContext("attention_isa", cpu::attention_isa());
  } catch (const Error& e) {  // a bad ATTOGRAD_ATTENTION_ISA: every attention case reports it
    benchmark::AddCustomContext("attention_isa", e.what());
  }
  try {  // the bfloat16 products' kernel: "amx", "avx512_bf16", "widen" (bench_peak_bf16.cpp)
    benchmark::AddCustomContext("bf16_isa", kernels::bf16_matmul_kernel());
  } catch (const Error& e) {  // a bad ATTOGRAD_BF16_ISA
    benchmark::AddCustomContext("bf16_isa", e.what());
  }
  try {  // the float32 products' kernel: "avx512", "avx2", "openblas", "portable"; and widened bfloat16's
    benchmark::AddCustomContext("f32_gemm", kernels::f32_matmul_kernel());
    benchmark::AddCustomContext("widening_gemm", kernels::widening_matmul_kernel());
  } catch (const Error& e) {  // a bad ATTOGRAD_F32_GEMM
    benchmark::AddCustomContext("f32_gemm", e.what());
  }
  // OpenBLAS's kernel family ("SkylakeX", "Haswell"): its own choice for this
  // CPU, OPENBLAS_CORETYPE's, which some environments set, or prepare_blas's
  // where OpenBLAS does not know the CPU.
  prepare_blas();
  benchmark::AddCustomContext("blas_core", openblas_get_corename());
  return true;
}();

}  // namespace

double closeness(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (!a.defined() || !b.defined() || a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double ratio = std::abs(va[i] - vb[i]) / (atol + rtol * std::abs(vb[i]));
    if (!(ratio <= worst)) worst = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
  }
  return worst;
}

bool check_close(benchmark::State& state, const std::string& what, const Tensor& got, const Tensor& want, double atol,
                 double rtol) {
  const double c = closeness(got, want, atol, rtol);
  if (c <= 1.0) return true;
  const std::string shapes = got.defined() && want.defined() ? " (" + got.str() + " vs " + want.str() + ")" : "";
  state.SkipWithError(("check failed: " + what + " differs from its reference by " + std::to_string(c) +
                       "x the tolerance" + shapes)
                          .c_str());
  return false;
}

Tensor random_input(const Shape& sizes, std::uint64_t seed, double scale, bool requires_grad) {
  Generator gen(seed);
  Tensor t = normal(sizes, 0.0, scale, {DType::f32}, gen);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor random_tokens(std::int64_t B, std::int64_t T, std::int64_t vocab, std::uint64_t seed) {
  Generator gen(seed);
  const std::vector<float> u = rand({B, T}, {}, gen).to_vector<float>();
  std::vector<std::int64_t> ids(u.size());
  for (std::size_t i = 0; i < u.size(); ++i)
    ids[i] = std::min<std::int64_t>(vocab - 1, static_cast<std::int64_t>(u[i] * static_cast<float>(vocab)));
  return from_vector(ids, {B, T});
}

Tensor run_core(const CoreInputs& in, AttentionImpl impl, bool backward_too, double dropout_p) {
  for (const Tensor& t : {in.q, in.k, in.v}) t.set_grad(Tensor());
  Generator masks(31);
  AttentionOptions options;
  options.causal = true;
  options.impl = impl;
  options.dropout_p = dropout_p;
  options.generator = &masks;
  if (!backward_too) {
    NoGradGuard no_grad;
    return attention(in.q, in.k, in.v, options).out;
  }
  Tensor out = attention(in.q, in.k, in.v, options).out;  // (B, H, T, D)
  backward(out, in.dout);
  return out;
}

CoreInputs cast_inputs(const CoreInputs& in, DType dtype) {
  CoreInputs out;
  for (auto [from, to] : {std::pair{&in.q, &out.q}, {&in.k, &out.k}, {&in.v, &out.v}, {&in.dout, &out.dout}}) {
    *to = kernels::cast(*from, dtype);
    to->set_requires_grad(from != &in.dout);
  }
  return out;
}

namespace {

double largest_magnitude(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector<double>()) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace

bool check_bf16_core(benchmark::State& state, const CoreInputs& in, bool backward_too, double dropout_p) {
  const CoreInputs wide = cast_inputs(in, DType::f32);
  const Tensor want = run_core(wide, AttentionImpl::fused, backward_too, dropout_p);
  const Tensor got = run_core(in, AttentionImpl::fused, backward_too, dropout_p);
  const double tol = 0x1p-6;
  if (!check_close(state, "bf16 attention output", kernels::cast(got, DType::f32), want, tol * largest_magnitude(want),
                   tol))
    return false;
  if (!backward_too) return true;
  const std::pair<const Tensor*, const Tensor*> grads[] = {{&in.q, &wide.q}, {&in.k, &wide.k}, {&in.v, &wide.v}};
  for (const auto& [g, w] : grads)
    if (!check_close(state, "bf16 attention gradient", kernels::cast(g->grad(), DType::f32), w->grad(),
                     tol * largest_magnitude(w->grad()), tol))
      return false;
  return true;
}

}  // namespace attograd::bench
