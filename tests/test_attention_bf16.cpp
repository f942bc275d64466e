// The bfloat16 fused attention (cpu/attention/attention_bf16.cpp)
// against the float64 fused attention on the same (exactly widened) inputs, on
// the AMX and AVX512_BF16 hardware where this CPU has it and on the scalar
// models of their instructions everywhere, within bounds derived from
// bfloat16's 8-bit significand; and kernels::attention_forward choosing it.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "helpers.h"
#include "tensor/attention_call.h"
#include "cpu/attention/attention.h"
#include "cpu/parallel.h"

using namespace attograd;
using namespace attograd::test;

namespace {

struct Bf16AttentionCase {
  std::int64_t B, H, Tq, Tk, D;
  bool causal, masked, heads_interleaved;  // heads_interleaved: q, k, v are (B, T, H, D) memory seen as (B, H, T, D)
  double dropout_p;
};

// A bfloat16 (B, H, T, D) operand with N(0, 1) values, contiguous or a view of (B, T, H, D) memory.
Tensor bf16_operand(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool interleaved,
                    std::uint64_t seed, Device device = Device::cpu()) {
  Generator gen(seed);
  if (!interleaved) return to(kernels::cast(randn({B, H, T, D}, {DType::f32}, gen), DType::bf16), device);
  return permute(to(kernels::cast(randn({B, T, H, D}, {DType::f32}, gen), DType::bf16), device), {0, 2, 1, 3});
}

// A forward's output as kernels::attention_forward allocates it: (B, H, Tq, D) over (B, Tq, H, D) memory.
Tensor heads_view_output(std::int64_t B, std::int64_t H, std::int64_t Tq, std::int64_t D) {
  return make_view(empty({B, Tq, H, D}, {DType::bf16}), {B, H, Tq, D}, {Tq * H * D, D, H * D, 1}, 0);
}

Tensor f64(const Tensor& t) { return kernels::cast(t, DType::f64); }
Tensor abs64(const Tensor& t) { return kernels::unary(kernels::Unary::abs, f64(t)); }

// |got - want| <= 2^-8 (roundings * terms + |want|) + 2^-14 terms, element by
// element: `roundings` bfloat16 roundings of the terms on the way (each moves
// a term by 2^-8 of itself), one of the result, and float32 sums of at most
// (Tq + Tk + D) < 1024 terms, n 2^-24 < 2^-14 of the sum of their magnitudes.
// Infinities (an all-hidden row's log-sum-exp) must match exactly.
void check_within(const char* what, const Tensor& got, const Tensor& want, const Tensor& terms, double roundings) {
  REQUIRE(got.sizes() == want.sizes());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>(), t = terms.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isinf(w[i])) {
      INFO(what << " element " << i);
      REQUIRE(g[i] == w[i]);
      continue;
    }
    const double bound = kBf16UnitRoundoff * (roundings * t[i] + std::abs(w[i])) + 0x1p-14 * t[i] + 1e-30;
    INFO(what << " element " << i << ": got " << g[i] << ", want " << w[i] << ", bound " << bound);
    REQUIRE(std::abs(g[i] - w[i]) <= bound);
  }
}

// A case's operands and the kernel's outputs and gradients on them.
struct Bf16AttentionRun {
  Tensor q, k, v, dout, mask;
  kernels::AttentionKernelOptions options;
  kernels::AttentionForwardResult r;
  kernels::AttentionGrads g;
};

// A case's operands on `device`: q, k, v, dout and the mask, with its options.
Bf16AttentionRun case_operands(const Bf16AttentionCase& c, Device device) {
  Bf16AttentionRun run;
  run.q = bf16_operand(c.B, c.H, c.Tq, c.D, c.heads_interleaved, 1, device);
  run.k = bf16_operand(c.B, c.H, c.Tk, c.D, c.heads_interleaved, 2, device);
  run.v = bf16_operand(c.B, c.H, c.Tk, c.D, c.heads_interleaved, 3, device);
  run.dout = bf16_operand(c.B, c.H, c.Tq, c.D, false, 4, device);
  if (c.masked) {  // (Tq, Tk), broadcast over B and H; query 2 sees no key at all
    Generator gen(5);
    Tensor mask = kernels::binary(kernels::Binary::lt, uniform({c.Tq, c.Tk}, 0, 1, {DType::f32}, gen),
                                  full({}, 0.3, {DType::f32}));
    if (c.Tq > 2) kernels::fill_(select(mask, 0, 2), 1);
    run.mask = to(mask, device);
  }
  kernels::AttentionKernelOptions& options = run.options;
  options.causal = c.causal;
  options.scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  options.dropout_p = c.dropout_p;
  options.seed = 7;
  options.offset = 11;
  return run;
}

// The case on the CPU's `kernel`, called as kernels::attention_forward and _backward call it.
Bf16AttentionRun run_case(const Bf16AttentionCase& c, cpu::Bf16Kernel kernel) {
  Bf16AttentionRun run = case_operands(c, Device::cpu());
  const AttentionCall call{run.q, run.k, run.v, run.mask, run.options};
  run.r.out = heads_view_output(c.B, c.H, c.Tq, c.D);
  run.r.lse = empty({c.B, c.H, c.Tq}, {DType::f32});
  cpu::attention_forward_bf16(call, run.r, kernel);
  run.g = {empty(run.q.sizes(), {DType::bf16}), empty(run.k.sizes(), {DType::bf16}), empty(run.v.sizes(), {DType::bf16})};
  cpu::attention_backward_bf16(call, {run.dout, run.r.out, run.r.lse, Tensor()}, run.g, kernel);
  return run;
}

// The case on the GPU through kernels::attention_forward and _backward, its
// operands and results brought back to the CPU.
Bf16AttentionRun run_case_on_gpu(const Bf16AttentionCase& c) {
  Bf16AttentionRun gpu = case_operands(c, Device::cuda());
  gpu.r = kernels::attention_forward(gpu.q, gpu.k, gpu.v, gpu.mask, gpu.options);
  gpu.g = kernels::attention_backward(gpu.dout, gpu.q, gpu.k, gpu.v, gpu.mask, gpu.r.out, gpu.r.lse, Tensor(),
                                      gpu.options);
  Bf16AttentionRun run;
  const auto back = [](const Tensor& x) { return x.defined() ? to(x, Device::cpu()) : x; };
  run.q = back(gpu.q), run.k = back(gpu.k), run.v = back(gpu.v), run.dout = back(gpu.dout), run.mask = back(gpu.mask);
  run.options = gpu.options;
  run.r.out = back(gpu.r.out), run.r.lse = back(gpu.r.lse);
  run.g = {back(gpu.g.dq), back(gpu.g.dk), back(gpu.g.dv)};
  return run;
}

// The run's outputs and gradients within bfloat16's bounds of float64 on the same operands.
void check_run(const Bf16AttentionCase& c, const Bf16AttentionRun& run) {
  REQUIRE(c.Tq + c.Tk + c.D < 1024);
  const Tensor &q = run.q, &k = run.k, &v = run.v, &dout = run.dout, &mask = run.mask;
  const kernels::AttentionKernelOptions& options = run.options;
  const kernels::AttentionForwardResult& r = run.r;
  const kernels::AttentionGrads& g = run.g;
  const double keep = 1.0 / (1.0 - c.dropout_p);

  // float64 on the same values, with the weights (before dropout) for the bounds.
  kernels::AttentionKernelOptions with_weights = options;
  with_weights.return_weights = true;
  const kernels::AttentionForwardResult want = kernels::attention_forward(f64(q), f64(k), f64(v), mask, with_weights);
  const kernels::AttentionGrads dwant = kernels::attention_backward(f64(dout), f64(q), f64(k), f64(v), mask, want.out,
                                                                    want.lse, Tensor(), options);
  const Tensor weights = kernels::binary(kernels::Binary::mul, want.weights, full({}, keep, {DType::f64}));
  // |dS_ij| <= scale W_ij (keep |dP_ij| + sum_d |do_id o_id|), dP = do v^T: the
  // magnitude of dS's terms, with delta_i = do_i . o_i bounded by its terms'
  // sum (the kernel's o is rounded, so its delta moves by 2^-8 of that).
  const Tensor dp = kernels::matmul(abs64(dout), transpose(abs64(v), 2, 3));
  const Tensor delta_terms = kernels::sum(kernels::binary(kernels::Binary::mul, abs64(dout), abs64(want.out)), {3}, true);
  const Tensor ds_terms = kernels::binary(
      kernels::Binary::mul, want.weights,
      kernels::binary(kernels::Binary::add, kernels::binary(kernels::Binary::mul, dp, full({}, keep, {DType::f64})),
                      delta_terms));
  const Tensor ds = kernels::binary(kernels::Binary::mul, ds_terms, full({}, options.scale, {DType::f64}));

  // out: P rounded before P v (1); dv: P rounded (1); dq, dk: dS rounded, and o in delta (2).
  check_within("out", r.out, want.out, kernels::matmul(weights, abs64(v)), 1);
  check_within("lse", r.lse, want.lse, full(want.lse.sizes(), 1, {DType::f64}), 0);
  check_within("dv", g.dv, dwant.dv, kernels::matmul(transpose(weights, 2, 3), abs64(dout)), 1);
  check_within("dk", g.dk, dwant.dk, kernels::matmul(transpose(ds, 2, 3), abs64(q)), 2);
  check_within("dq", g.dq, dwant.dq, kernels::matmul(ds, abs64(k)), 2);
}

const Bf16AttentionCase kCases[] = {
    {1, 1, 1, 1, 1, true, false, false, 0.0},      // one query, one key, one value
    {2, 3, 70, 70, 24, true, false, false, 0.0},   // D not whole steps, T not whole tiles
    {1, 2, 65, 130, 64, false, true, false, 0.0},  // Tq != Tk, a mask with a row of hidden keys
    {1, 2, 130, 130, 40, true, false, false, 0.2},  // dropout
    {2, 2, 96, 96, 64, true, false, true, 0.0},    // heads interleaved in memory, as a packed qkv's
    {8, 4, 16, 16, 16, true, false, false, 0.1},   // the default task's heads: T, D 16, a corner of a tile
};

std::string describe(const Bf16AttentionCase& c) {
  return fmt::format("B {} H {} Tq {} Tk {} D {}{}{}{} dropout {}", c.B, c.H, c.Tq, c.Tk, c.D, c.causal ? " causal" : "",
                     c.masked ? " masked" : "", c.heads_interleaved ? " interleaved" : "", c.dropout_p);
}

}  // namespace

TEST_CASE("bfloat16 attention on AMX, on AVX512_BF16 and on their scalar models, within bfloat16's bound of float64",
          "[bf16][attention]") {
  for (cpu::Bf16Kernel kernel : {cpu::Bf16Kernel::amx, cpu::Bf16Kernel::avx512_bf16, cpu::Bf16Kernel::amx_model,
                                 cpu::Bf16Kernel::avx512_bf16_model}) {
    if (!cpu::attention_bf16_runs_on(kernel)) {
      WARN("skipped: the bfloat16 attention has no " << cpu::bf16_kernel_name(kernel) << " kernel on this CPU");
      continue;
    }
    for (const Bf16AttentionCase& c : kCases) {
      INFO(cpu::bf16_kernel_name(kernel) << ": " << describe(c));
      check_run(c, run_case(c, kernel));
    }
  }
}

// cuda/attention_bf16.cu, attention_bf16_flash.cu and attention_bf16_flash_backward.cu (on a GPU, or
// the emulator) within the same bounds:
// the CPU's cases, and with every option on one at head dim 128 over several
// of the kernels' query blocks and key tiles, and one whose head dim (20)
// makes the kernels move a value at a time, not 8 (the other D are whole eights but 1).
TEST_CASE("cuda: bfloat16 attention on the tensor cores, within bfloat16's bound of float64", "[cuda][bf16][attention]") {
  SKIP_WITHOUT_CUDA();
  std::vector<Bf16AttentionCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({1, 2, 150, 150, 128, true, true, true, 0.1});
  cases.push_back({2, 2, 70, 90, 20, true, true, true, 0.1});  // D not a multiple of 8: a value at a time
  // The FlashAttention-2-shaped forward and backward (D 64 and 32): several query blocks and key
  // tiles, ragged; Tq != Tk both ways, causal or not; with a mask, dropout, both. The backward's
  // key blocks add their parts of dQ in turn: a wrong turn stops the emulator.
  cases.push_back({1, 2, 300, 300, 64, true, false, false, 0.0});
  cases.push_back({1, 1, 200, 330, 64, false, false, true, 0.0});
  cases.push_back({2, 1, 150, 70, 64, true, false, false, 0.0});
  cases.push_back({1, 1, 1, 1, 64, false, false, false, 0.0});
  cases.push_back({2, 1, 100, 100, 64, true, false, false, 0.2});
  cases.push_back({1, 1, 70, 77, 64, false, false, false, 0.3});  // odd Tk: the general kernels' dropout
  cases.push_back({1, 1, 70, 200, 64, true, false, false, 0.0});  // causal, Tk > Tq: key blocks no query sees
  cases.push_back({1, 2, 150, 150, 64, true, true, true, 0.1});
  cases.push_back({1, 2, 300, 300, 32, true, false, false, 0.0});  // head size 32: the toy GPT's
  cases.push_back({2, 1, 130, 77, 32, false, true, true, 0.2});
  // The flash forward at head size 128 (Q read from its tile, the scores half a key tile at a
  // time): causal over several tiles, Tk ragged and > Tq, a mask with dropout.
  cases.push_back({1, 1, 200, 200, 128, true, false, false, 0.0});
  cases.push_back({2, 1, 70, 150, 128, false, false, true, 0.0});
  cases.push_back({1, 2, 130, 100, 128, false, true, false, 0.2});
  // The flash backward's dropout (Tk a multiple of 4: a Philox draw for four weights), with a mask.
  cases.push_back({1, 2, 150, 152, 64, true, true, true, 0.1});
  cases.push_back({2, 1, 130, 76, 32, false, true, true, 0.2});
  for (const Bf16AttentionCase& c : cases) {
    INFO("cuda: " << describe(c));
    check_run(c, run_case_on_gpu(c));
  }
}

// The flash backward sums each query tile's dQ over its key blocks in their
// order, not by atomics: two runs give the same bits (on a GPU, where blocks
// run at once; the emulator runs them in turn).
TEST_CASE("cuda: the bfloat16 attention backward gives the same bits on every run", "[cuda][bf16][attention]") {
  SKIP_WITHOUT_CUDA();
  const Bf16AttentionCase c{2, 2, 200, 260, 64, false, false, false, 0.0};
  const Bf16AttentionRun first = run_case_on_gpu(c), second = run_case_on_gpu(c);
  for (const auto& [name, a, b] : {std::tuple{"dq", first.g.dq, second.g.dq}, std::tuple{"dk", first.g.dk, second.g.dk},
                                   std::tuple{"dv", first.g.dv, second.g.dv}}) {
    INFO(name);
    REQUIRE(a.to_vector<double>() == b.to_vector<double>());
  }
}

// A NaN in a key poisons every row that sees it, and one in a query its own
// row alone, as on the CPU: the kernels' max lets a NaN win (the flash
// forward's at head sizes 64 and 32, the general one's at 24), so a row's lanes agree.
TEST_CASE("cuda: bfloat16 attention with NaN inputs gives NaN rows where the CPU does", "[cuda][bf16][attention]") {
  SKIP_WITHOUT_CUDA();
  for (std::int64_t D : {64, 32, 24})
    for (bool causal : {true, false}) {
      Tensor q = bf16_operand(1, 2, 150, D, false, 1), k = bf16_operand(1, 2, 150, D, false, 2);
      const Tensor v = bf16_operand(1, 2, 150, D, false, 3);
      q = kernels::clone(q), k = kernels::clone(k);
      k.data<bfloat16>()[5 * D + 3] = bfloat16(std::nanf(""));          // head 0, key 5
      q.data<bfloat16>()[(150 + 140) * D + 7] = bfloat16(std::nanf(""));  // head 1, query 140
      kernels::AttentionKernelOptions options;
      options.causal = causal;
      options.scale = 1.0 / std::sqrt(static_cast<double>(D));
      const Tensor gpu =
          to(kernels::attention_forward(to(q, Device::cuda()), to(k, Device::cuda()), to(v, Device::cuda()), Tensor(),
                                        options).out,
             Device::cpu());
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 150; ++i) {
          INFO("D " << D << " causal " << causal << " head " << h << " query " << i);
          const bool expected = h == 0 ? (!causal || i >= 5) : i == 140;
          REQUIRE(std::isnan(gpu.at({0, h, i, 0})) == expected);
          REQUIRE(std::isnan(gpu.at({0, h, i, D - 1})) == expected);
        }
    }
}

// The bounds hold for the widened float32 kernels too: that the GPU's
// bfloat16 calls ran the bfloat16 kernels shows in the probabilities rounded
// before P V, which the widened output (asked for with the weights) lacks.
TEST_CASE("cuda: bfloat16 attention runs the bfloat16 kernels, and widens for the weights", "[cuda][bf16][attention]") {
  SKIP_WITHOUT_CUDA();
  const Tensor q = bf16_operand(1, 2, 40, 32, false, 1, Device::cuda());
  const Tensor k = bf16_operand(1, 2, 40, 32, false, 2, Device::cuda());
  const Tensor v = bf16_operand(1, 2, 40, 32, false, 3, Device::cuda());
  kernels::AttentionKernelOptions options;
  options.causal = true;
  options.scale = 1.0 / std::sqrt(32.0);
  const kernels::AttentionForwardResult fused = kernels::attention_forward(q, k, v, Tensor(), options);
  options.return_weights = true;
  const kernels::AttentionForwardResult widened = kernels::attention_forward(q, k, v, Tensor(), options);
  REQUIRE(fused.out.dtype() == DType::bf16);
  REQUIRE(fused.lse.dtype() == DType::f32);
  REQUIRE(widened.weights.defined());
  const std::vector<double> a = to(fused.out, Device::cpu()).to_vector<double>();
  const std::vector<double> b = to(widened.out, Device::cpu()).to_vector<double>();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  INFO(differ << " of " << a.size() << " outputs differ");
  CHECK(differ > 0);
  CHECK(differ < a.size() / 2);  // by a rounding here and there, not everywhere
}

// The VDPBF16PS kernel rounds its float32 tiles (P, dS) by VCVTNE2PS2BF16, its
// model by bfloat16_bits, and the blocks' sums are the instruction's own on
// both: the same bits, on scores of ordinary size. (Sharp ones, q x 40,
// differed in a few dq and dk elements of 25600 on a Zen 5, where dS falls
// among float32's denormals; modelling the instruction's flushing of them did
// not remove it, so it is left unasserted. AMX's bits have not been compared
// with its model's on hardware: that pair is not asserted either.) The
// kernel also writes O and dQ from their transposed accumulators by 16 x 16
// register transposes, 32 values a rounding: the second case's head dim (40)
// and rows (70) leave partial ones, its heads interleaved in memory.
TEST_CASE("bfloat16 attention on AVX512_BF16 gives its scalar model's bits", "[bf16][attention]") {
  if (!cpu::attention_bf16_runs_on(cpu::Bf16Kernel::avx512_bf16)) {
    WARN("skipped: the bfloat16 attention has no avx512_bf16 kernel on this CPU");
    return;
  }
  for (const Bf16AttentionCase& c : {Bf16AttentionCase{2, 2, 100, 100, 64, true, false, false, 0.1},
                                     Bf16AttentionCase{1, 3, 70, 70, 40, true, false, true, 0.0}}) {
    INFO(describe(c));
    const Bf16AttentionRun got = run_case(c, cpu::Bf16Kernel::avx512_bf16);
    const Bf16AttentionRun want = run_case(c, cpu::Bf16Kernel::avx512_bf16_model);
    const std::pair<const Tensor*, const Tensor*> outputs[] = {{&got.r.out, &want.r.out}, {&got.r.lse, &want.r.lse},
                                                                {&got.g.dq, &want.g.dq}, {&got.g.dk, &want.g.dk},
                                                                {&got.g.dv, &want.g.dv}};
    for (const auto& [x, y] : outputs) CHECK(x->to_vector<double>() == y->to_vector<double>());
  }
}

TEST_CASE("bfloat16 attention: the dispatch runs the tiles where they run, and widens for the weights",
          "[bf16][attention]") {
  if (!cpu::attention_bf16_runs_on(cpu::bf16_kernel())) {
    WARN("skipped: bfloat16 products run on " << cpu::bf16_kernel_name(cpu::bf16_kernel())
                                              << " here, and the attention widens to float32");
    return;
  }
  Generator gen(3);
  const Tensor q = kernels::cast(randn({1, 2, 40, 32}, {DType::f32}, gen), DType::bf16);
  kernels::AttentionKernelOptions options;
  options.causal = true;
  options.scale = 1.0 / std::sqrt(32.0);
  const kernels::AttentionForwardResult r = kernels::attention_forward(q, q, q, Tensor(), options);
  CHECK(r.out.dtype() == DType::bf16);
  CHECK(r.lse.dtype() == DType::f32);
  CHECK_FALSE(r.probs.defined());  // the tiles keep none: the backward recomputes
  kernels::AttentionForwardResult direct;
  direct.out = heads_view_output(1, 2, 40, 32);
  direct.lse = empty(r.lse.sizes(), {DType::f32});
  cpu::attention_forward_bf16({q, q, q, Tensor(), options}, direct, cpu::bf16_kernel());
  CHECK(r.out.to_vector<double>() == direct.out.to_vector<double>());
  options.return_weights = true;  // the tiles return none: widened to float32
  const kernels::AttentionForwardResult widened = kernels::attention_forward(q, q, q, Tensor(), options);
  CHECK(widened.out.dtype() == DType::bf16);
  CHECK(widened.weights.defined());
}

TEST_CASE("bfloat16 attention gives the same bits on any number of threads", "[bf16][attention][parallel]") {
  // Heads go to whichever thread is free; each head's arithmetic is one thread's.
  const Tensor q = bf16_operand(2, 4, 200, 64, false, 1), k = bf16_operand(2, 4, 200, 64, false, 2);
  const Tensor v = bf16_operand(2, 4, 200, 64, false, 3), dout = bf16_operand(2, 4, 200, 64, false, 4);
  kernels::AttentionKernelOptions options;
  options.causal = true;
  options.scale = 0.125;
  options.dropout_p = 0.1;
  options.seed = 3;
  const auto run = [&] {
    const kernels::AttentionForwardResult r = kernels::attention_forward(q, k, v, Tensor(), options);
    const kernels::AttentionGrads g =
        kernels::attention_backward(dout, q, k, v, Tensor(), r.out, r.lse, r.probs, options);
    std::vector<double> bits = r.out.to_vector<double>();
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) {
      const std::vector<double> x = t->to_vector<double>();
      bits.insert(bits.end(), x.begin(), x.end());
    }
    return bits;
  };
  set_num_threads(1);
  const std::vector<double> serial = run();
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    INFO(threads << " threads");
    CHECK(run() == serial);
  }
  set_num_threads(2);
}

TEST_CASE("bfloat16 attention on a packed projection's views gives the bits of contiguous operands",
          "[bf16][attention]") {
  // Where it widens, q, k, v of one packed (B, T, 3C) buffer are cast in one
  // flat pass and the gradients rounded from a float32 twin of d(qkv); the
  // same values as separate contiguous operands take the per-tensor casts.
  // Either way the arithmetic is the kernel's: the bits must agree, and the
  // output must keep the (B, T, H, D) layout that merges heads for free.
  const std::int64_t B = 2, T = 37, H = 3, D = 16, C = H * D;
  Generator gen(9);
  const Tensor qkv = kernels::cast(randn({B, T, 3 * C}, {DType::f32}, gen), DType::bf16);
  const Tensor d_qkv = zeros({B, T, 3 * C}, {DType::bf16});
  const auto heads = [&](const Tensor& packed, std::int64_t i) {
    return make_view(packed, {B, H, T, D}, {T * 3 * C, D, 3 * C, 1}, packed.offset() + i * C);
  };
  const Tensor q = heads(qkv, 0), k = heads(qkv, 1), v = heads(qkv, 2);
  const Tensor dout = bf16_operand(B, H, T, D, true, 4);
  kernels::AttentionKernelOptions options;
  options.causal = true;
  options.scale = 0.25;
  options.dropout_p = 0.2;
  options.seed = 5;

  const kernels::AttentionForwardResult packed = kernels::attention_forward(q, k, v, Tensor(), options);
  const kernels::AttentionGrads into{heads(d_qkv, 0), heads(d_qkv, 1), heads(d_qkv, 2)};
  kernels::attention_backward(dout, q, k, v, Tensor(), packed.out, packed.lse, packed.probs, options, into);

  const Tensor cq = contiguous(q), ck = contiguous(k), cv = contiguous(v);
  const kernels::AttentionForwardResult alone = kernels::attention_forward(cq, ck, cv, Tensor(), options);
  const kernels::AttentionGrads g =
      kernels::attention_backward(contiguous(dout), cq, ck, cv, Tensor(), alone.out, alone.lse, alone.probs, options);

  CHECK(packed.out.dtype() == DType::bf16);
  CHECK(packed.out.strides() == Shape{T * H * D, D, H * D, 1});
  CHECK(packed.out.to_vector<double>() == alone.out.to_vector<double>());
  CHECK(packed.lse.to_vector<double>() == alone.lse.to_vector<double>());
  CHECK(into.dq.to_vector<double>() == g.dq.to_vector<double>());
  CHECK(into.dk.to_vector<double>() == g.dk.to_vector<double>());
  CHECK(into.dv.to_vector<double>() == g.dv.to_vector<double>());
}
