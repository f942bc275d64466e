// The bfloat16 dtype (base/bfloat16.h, tensor/dtype.h): its rounding against
// an independent reference, casts, printing, checkpoints, and the ops
// computed in float32 against float64 within bfloat16's bound (tests/helpers.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include "base/bfloat16.h"
#include "helpers.h"
#include "cpu/bf16_rounding.h"
#include "cpu/matmul_bf16/matmul_bf16.h"
#include "cpu/matmul_f32/sgemm.h"
#include "cpu/parallel.h"
#include "train/output/safetensors.h"

using namespace attograd;
using namespace attograd::test;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Round to nearest, ties to even, by comparing distances in float64 rather
// than by bit arithmetic: the two bfloat16 neighbours of x (x's bits cut to
// the top 16, and one ulp up), the nearer one, the even one on a tie.
std::uint16_t reference_bits(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const std::uint16_t down = static_cast<std::uint16_t>(bits_of(x) >> 16);
  const std::uint16_t up = static_cast<std::uint16_t>(down + 1);
  // Past the largest finite value, `up` is the infinity IEEE rounds to: it
  // stands for 2^128, the next value the format would have with more exponent.
  const bool up_overflows = (up & 0x7fff) == 0x7f80;
  const double dx = x, ddown = bfloat16_to_float(down);
  const double dup = up_overflows ? std::copysign(0x1p128, dx) : bfloat16_to_float(up);
  if (dx == ddown) return down;
  const double to_down = std::abs(dx - ddown), to_up = std::abs(dup - dx);
  if (to_down != to_up) return to_down < to_up ? down : up;
  return (down & 1) == 0 ? down : up;
}

}  // namespace

TEST_CASE("bfloat16 rounds to nearest even, keeps NaN, infinities and signed zero", "[bf16]") {
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(1.0f + 0x1p-8f).bits == 0x3f80);        // a tie: to the even 1.0
  CHECK(bfloat16(1.0f + 3 * 0x1p-8f).bits == 0x3f82);    // a tie: to the even 1 + 2^-6
  CHECK(bfloat16(1.0f + 0x1p-8f + 0x1p-20f).bits == 0x3f81);  // past the tie: up
  CHECK(bfloat16(-0.0f).bits == 0x8000);
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(bfloat16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds past the largest bfloat16
  // A NaN whose payload lies only in the low bits would become an infinity if cut.
  float nan_low;
  const std::uint32_t nan_low_bits = 0x7f800001u;
  std::memcpy(&nan_low, &nan_low_bits, sizeof nan_low);
  CHECK(std::isnan(static_cast<float>(bfloat16(nan_low))));
  CHECK(std::isnan(static_cast<float>(bfloat16(-std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(bfloat16(0x1p-130f)) == 0x1p-130f);  // subnormals keep their top 7 bits

  // Every pattern of the high half with a spread of low halves, ties and
  // their neighbours among them, against the float64 reference.
  std::int64_t checked = 0;
  for (std::uint32_t high = 0; high < 0x10000u; ++high)
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xbeefu, 0xffffu}) {
      const std::uint32_t u = high << 16 | low;
      float x;
      std::memcpy(&x, &u, sizeof x);
      const std::uint16_t got = bfloat16(x).bits, want = reference_bits(x);
      if (std::isnan(x)) {
        REQUIRE(std::isnan(bfloat16_to_float(got)));
      } else if (got != want) {
        INFO("x bits 0x" << std::hex << u << ": got 0x" << got << ", want 0x" << want);
        REQUIRE(got == want);
      }
      ++checked;
    }
  CHECK(checked == 7 * 65536);
}

TEST_CASE("arrays round to bfloat16 as bfloat16_bits does, bit for bit, on VCVTNE2PS2BF16 where the CPU has it",
          "[bf16]") {
  INFO((cpu::rounds_bf16_by_instruction() ? "by VCVTNE2PS2BF16" : "by bfloat16_bits' arithmetic"));
  // ctest's bf16_on_widen runs this as a CPU without bfloat16 instructions:
  // the arithmetic path, tested so on machines that have the instruction.
  if (cpu::bf16_instructions_refused()) REQUIRE_FALSE(cpu::rounds_bf16_by_instruction());
  // Every pattern of the high half with a spread of low halves: NaNs with their
  // payloads, infinities, ties, denormals (which the instruction alone would flush).
  std::vector<float> x;
  for (std::uint32_t high = 0; high < 0x10000u; ++high)
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xbeefu, 0xffffu}) {
      const std::uint32_t u = high << 16 | low;
      float v;
      std::memcpy(&v, &u, sizeof v);
      x.push_back(v);
    }
  // Runs of 32 with one denormal among normal values, and runs without.
  for (int run = 0; run < 64; ++run)
    for (int i = 0; i < 32; ++i) x.push_back(i == run % 32 && run < 32 ? 0x1.8p-130f : 1.0f + i * 0x1p-9f + run * 0x1p-14f);
  std::vector<std::uint16_t> y(x.size());
  cpu::round_to_bf16(y.data(), x.data(), static_cast<std::int64_t>(x.size()));
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += y[i] != bfloat16_bits(x[i]);
  CHECK(differ == 0);
  // Lengths that end inside a run of 32, from offsets that start inside one,
  // among the patterns near 1.0 (high half 0x3f80).
  const std::int64_t near_one = 0x3f80 * 7;
  for (std::int64_t offset : {0, 3, 17})
    for (std::int64_t n : {1, 15, 16, 31, 33, 47}) {
      std::vector<std::uint16_t> part(n + 1, 0x1234);
      cpu::round_to_bf16(part.data(), x.data() + near_one + offset, n);
      for (std::int64_t i = 0; i < n; ++i) REQUIRE(part[i] == bfloat16_bits(x[near_one + offset + i]));
      CHECK(part[n] == 0x1234);  // nothing written past n
    }
}

TEST_CASE("bfloat16 tensors: casts round once and widen exactly, print, and stay on the CPU", "[bf16]") {
  const Tensor x = randn({5, 7}, {DType::f32});
  const Tensor b = kernels::cast(x, DType::bf16);
  CHECK(b.dtype() == DType::bf16);
  CHECK(b.str() == "[5,7] bfloat16 cpu");
  const std::vector<float> xs = x.to_vector<float>();
  const std::vector<double> widened = b.to_vector<double>();  // bfloat16 -> float64 is exact
  for (std::size_t i = 0; i < xs.size(); ++i) REQUIRE(widened[i] == bfloat16_to_float(reference_bits(xs[i])));
  // Back and forth changes nothing once rounded; a transposed view casts element for element.
  CHECK(max_abs_diff(kernels::cast(kernels::cast(b, DType::f32), DType::bf16), b) == 0);
  const Tensor bt = kernels::cast(transpose(x, 0, 1), DType::bf16);
  CHECK(max_abs_diff(bt, transpose(b, 0, 1)) == 0);

  std::ostringstream printed;
  printed << kernels::cast(from_vector(std::vector<float>{1.0f, 1.00390625f}, {2}), DType::bf16);
  CHECK(printed.str() == "tensor([1.0000, 1.0000], shape=[2], dtype=bfloat16)");
}

TEST_CASE("bfloat16: the cast is differentiable, its gradient cast back", "[bf16][autograd]") {
  // forward: y = bf16(x); so dx = dy in x's dtype (rounding is a step function:
  // finite differences cannot see its slope, so the chain rule is checked exactly).
  const Tensor x = leaf({3, 4});
  const Tensor w = kernels::cast(kernels::cast(randn({3, 4}, {DType::f64}), DType::bf16), DType::f64);
  const Tensor y = to(x, DType::bf16);
  CHECK(y.dtype() == DType::bf16);
  backward(sum(mul(to(y, DType::f64), w)));
  REQUIRE(x.grad().dtype() == DType::f64);
  CHECK(max_abs_diff(x.grad(), w) == 0);
}

TEST_CASE("bfloat16 ops compute in float32 and round once, within bfloat16's bound of float64", "[bf16]") {
  const DType bf = DType::bf16;
  const auto bf16_of = [&](const Tensor& t) { return kernels::cast(t, bf); };
  const auto exact = [](const Tensor& t) { return kernels::cast(t, DType::f64); };  // the bfloat16 inputs, exactly
  const Tensor a = bf16_of(randn({6, 9}, {DType::f32}));
  const Tensor b = bf16_of(randn({6, 9}, {DType::f32}));
  const Tensor p = bf16_of(uniform({6, 9}, 0.5, 2.0, {DType::f32}));
  const auto check = [&](const char* what, const Tensor& got, const Tensor& want) {
    INFO(what);
    REQUIRE(got.dtype() == bf);
    CHECK(all_close(got, want, atol_for(bf), rtol_for(bf)));
  };
  for (auto op : {kernels::Unary::neg, kernels::Unary::exp, kernels::Unary::tanh, kernels::Unary::gelu,
                  kernels::Unary::gelu_grad, kernels::Unary::relu})
    check(kernels::unary_name(op), kernels::unary(op, a), kernels::unary(op, exact(a)));
  check("log", kernels::unary(kernels::Unary::log, p), kernels::unary(kernels::Unary::log, exact(p)));
  for (auto op : {kernels::Binary::add, kernels::Binary::mul, kernels::Binary::sub, kernels::Binary::gelu_backward})
    check(kernels::binary_name(op), kernels::binary(op, a, b), kernels::binary(op, exact(a), exact(b)));
  check("div", kernels::binary(kernels::Binary::div, a, p), kernels::binary(kernels::Binary::div, exact(a), exact(p)));
  // A sum of n terms rounded once at the end: its bound is bfloat16's of the result,
  // which needs an absolute part where terms cancel (2^-8 of the sum of |terms|).
  const Tensor row_sums = kernels::sum(a, {1}, false);
  const Tensor abs_sums = kernels::sum(kernels::unary(kernels::Unary::abs, exact(a)), {1}, false);
  const auto got = row_sums.to_vector<double>(), want = kernels::sum(exact(a), {1}, false).to_vector<double>(),
             scale = abs_sums.to_vector<double>();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= kBf16UnitRoundoff * scale[i] + 1e-6);
  check("softmax", kernels::softmax_forward(a), kernels::softmax_forward(exact(a)));
  check("log_softmax", kernels::log_softmax_forward(a), kernels::log_softmax_forward(exact(a)));
  check("max", kernels::max(a, 1, false).values, kernels::max(exact(a), 1, false).values);
  CHECK(kernels::max(a, 1, false).indices.to_vector<std::int64_t>() ==
        kernels::max(exact(a), 1, false).indices.to_vector<std::int64_t>());
  check("transposed add", kernels::binary(kernels::Binary::add, transpose(a, 0, 1), transpose(b, 0, 1)),
        kernels::binary(kernels::Binary::add, transpose(exact(a), 0, 1), transpose(exact(b), 0, 1)));
  const Tensor row = bf16_of(randn({9}, {DType::f32}));
  check("broadcast mul", kernels::binary(kernels::Binary::mul, a, row),
        kernels::binary(kernels::Binary::mul, exact(a), exact(row)));
}

// The element-wise kernels read bfloat16 a chunk at a time (cpu/elementwise.cpp):
// the composed reference is the float32 op of the widened tensors, rounded once.
// Each product below is exact in float32 (alpha a power of two), so no fused
// multiply-add can tell them apart: bit for bit, past a chunk's end and in its tail.
TEST_CASE("bfloat16 element-wise ops, a chunk at a time, are the float32 op rounded once, bit for bit", "[bf16]") {
  const DType bf = DType::bf16;
  const auto bf16_of = [&](const Tensor& t) { return kernels::cast(t, bf); };
  const auto wide = [](const Tensor& t) { return kernels::cast(t, DType::f32); };
  const auto same_bits = [&](const char* what, const Tensor& got, const Tensor& reference_f32) {
    INFO(what << " " << shape_str(got.sizes()));
    REQUIRE(got.dtype() == bf);
    CHECK(wide(got).to_vector<float>() == wide(bf16_of(reference_f32)).to_vector<float>());
  };
  const Tensor a = bf16_of(randn({3, 1100}, {DType::f32}));  // 1100 = two chunks and a tail
  const Tensor b = bf16_of(randn({3, 1100}, {DType::f32}));
  const Tensor row = bf16_of(randn({1100}, {DType::f32}));
  const Tensor column = bf16_of(randn({3, 1}, {DType::f32}));
  const Tensor at = transpose(bf16_of(randn({1100, 3}, {DType::f32})), 0, 1);  // strided, 3 x 1100
  for (const Tensor& x : {a, at}) {
    for (auto op : {kernels::Unary::neg, kernels::Unary::exp, kernels::Unary::tanh, kernels::Unary::gelu,
                    kernels::Unary::gelu_grad, kernels::Unary::relu, kernels::Unary::mul_scalar})
      same_bits(kernels::unary_name(op), kernels::unary(op, x, 0.5), kernels::unary(op, wide(x), 0.5));
    for (auto op : {kernels::Binary::add, kernels::Binary::sub, kernels::Binary::mul, kernels::Binary::div,
                    kernels::Binary::maximum, kernels::Binary::gelu_backward})
      same_bits(kernels::binary_name(op), kernels::binary(op, x, b), kernels::binary(op, wide(x), wide(b)));
    for (const Tensor& y : {row, column})  // broadcast: a stride-0 operand
      for (auto op : {kernels::Binary::add, kernels::Binary::mul, kernels::Binary::div})
        same_bits(kernels::binary_name(op), kernels::binary(op, x, y), kernels::binary(op, wide(x), wide(y)));
  }
  // Sums read bfloat16 as it is, and add as its widened copy would: rows (a bias
  // gradient), columns, and a view's sum within the bound of its float64 one.
  const Tensor tall = bf16_of(randn({700, 30}, {DType::f32}));
  for (const std::vector<int>& dims : std::vector<std::vector<int>>{{0}, {1}, {}})
    same_bits("sum", kernels::sum(tall, dims, false), kernels::sum(wide(tall), dims, false));
  const auto view_sum = kernels::sum(transpose(tall, 0, 1), {1}, false).to_vector<double>();
  const auto view_want = kernels::sum(kernels::cast(tall, DType::f64), {0}, false).to_vector<double>();
  const auto view_scale =
      kernels::sum(kernels::unary(kernels::Unary::abs, kernels::cast(tall, DType::f64)), {0}, false).to_vector<double>();
  for (std::size_t i = 0; i < view_sum.size(); ++i)
    CHECK(std::abs(view_sum[i] - view_want[i]) <= kBf16UnitRoundoff * view_scale[i] + 1e-6);
  // Casts of views take the contiguous inner runs a chunk at a time too.
  const Tensor t32 = transpose(randn({1100, 3}, {DType::f32}), 0, 1);
  CHECK(wide(kernels::cast(t32, bf)).to_vector<float>() ==
        wide(kernels::cast(kernels::contiguous(t32), bf)).to_vector<float>());
  CHECK(wide(at).to_vector<float>() == wide(kernels::contiguous(at)).to_vector<float>());
  const Tensor heads32 = transpose(randn({4, 5, 600}, {DType::f32}), 0, 1);  // rows contiguous, not the whole
  const Tensor heads = kernels::cast(heads32, bf);
  CHECK(wide(heads).to_vector<float>() == wide(kernels::cast(kernels::contiguous(heads32), bf)).to_vector<float>());
  CHECK(wide(transpose(heads, 0, 1)).to_vector<float>() ==
        wide(kernels::contiguous(transpose(heads, 0, 1))).to_vector<float>());
  const Tensor into_view = transpose(kernels::cast(zeros({1100, 3}), bf), 0, 1);
  kernels::copy_(into_view, t32);
  CHECK(wide(into_view).to_vector<float>() == wide(kernels::cast(t32, bf)).to_vector<float>());
  CHECK(kernels::binary(kernels::Binary::gt, a, b).to_vector<bool>() ==
        kernels::binary(kernels::Binary::gt, wide(a), wide(b)).to_vector<bool>());
  for (double alpha : {1.0, -0.5}) {
    const Tensor y = kernels::clone(a), y_f32 = wide(a);
    kernels::add_(y, at, alpha);
    kernels::add_(y_f32, wide(at), alpha);
    same_bits("add_", y, y_f32);
    const Tensor z = kernels::clone(a), z_f32 = wide(a);  // broadcast into y
    kernels::add_(z, row, alpha);
    kernels::add_(z_f32, wide(row), alpha);
    same_bits("add_ of a row", z, z_f32);
  }
}

TEST_CASE("bfloat16: an op without bfloat16 support refuses it by name", "[bf16]") {
  const Tensor p = kernels::cast(zeros({4}), DType::bf16);
  CHECK_THROWS_WITH(kernels::adamw_step_(p, p, p, p, {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                                      .weight_decay = 0, .step = 1}),
                    Catch::StartsWith("[adamw] parameters and their state are float32"));
  // float32 meets bfloat16 in arithmetic only (below); float64 never, nor in a comparison.
  CHECK_THROWS_WITH(kernels::binary(kernels::Binary::add, p, zeros({4}, {DType::f64})), Catch::Contains("dtypes differ"));
  CHECK_THROWS_WITH(kernels::binary(kernels::Binary::gt, p, zeros({4})), Catch::Contains("dtypes differ"));
}

// autocast's float32 residual plus a bfloat16 branch: the kernel widens the
// bfloat16 operand as it reads it, and must give the float32 op of the widened
// copy (its composed reference) to the bit, in either order, with broadcast
// and strided operands, past a chunk's end; through autograd, each operand's
// gradient comes back in its own dtype, as through the cast.
TEST_CASE("float32 with bfloat16: the op of the widened operand, bit for bit, without widening a copy", "[bf16]") {
  const auto wide = [](const Tensor& t) { return kernels::cast(t, DType::f32); };
  const auto bf16_of = [](const Tensor& t) { return kernels::cast(t, DType::bf16); };
  const Tensor x = randn({3, 1100}, {DType::f32});
  const Tensor xt = transpose(randn({1100, 3}, {DType::f32}), 0, 1);  // strided, 3 x 1100
  const Tensor b = bf16_of(randn({3, 1100}, {DType::f32}));
  const Tensor bt = transpose(bf16_of(randn({1100, 3}, {DType::f32})), 0, 1);
  const Tensor row = bf16_of(randn({1100}, {DType::f32}));
  for (const Tensor& f : {x, xt})
    for (const Tensor& h : {b, bt, row})
      for (auto op : {kernels::Binary::add, kernels::Binary::sub, kernels::Binary::mul, kernels::Binary::div}) {
        INFO(kernels::binary_name(op) << " " << shape_str(h.sizes()) << (f.is_contiguous() ? "" : " strided"));
        const Tensor got = kernels::binary(op, f, h), got_swapped = kernels::binary(op, h, f);
        REQUIRE(got.dtype() == DType::f32);
        REQUIRE(got_swapped.dtype() == DType::f32);
        CHECK(got.to_vector<float>() == kernels::binary(op, f, wide(h)).to_vector<float>());
        CHECK(got_swapped.to_vector<float>() == kernels::binary(op, wide(h), f).to_vector<float>());
      }
  for (bool subtract : {false, true}) {
    INFO((subtract ? "sub" : "add"));
    Tensor residual = randn({3, 1100}, {DType::f32}), branch = bf16_of(randn({3, 1100}, {DType::f32}));
    Tensor bias = bf16_of(randn({1100}, {DType::f32}));  // broadcast
    Tensor r2 = kernels::clone(residual), br2 = kernels::clone(branch), bi2 = kernels::clone(bias);
    for (Tensor* t : {&residual, &branch, &bias, &r2, &br2, &bi2}) t->set_requires_grad(true);
    const Tensor weights = randn({3, 1100}, {DType::f32});
    const auto combine = [&](const Tensor& r, const Tensor& br, const Tensor& bi) {
      return subtract ? sub(sub(r, br), bi) : add(add(r, br), bi);
    };
    const Tensor y = combine(residual, branch, bias);
    REQUIRE(y.dtype() == DType::f32);
    backward(sum(mul(y, weights)));
    const Tensor y2 = combine(r2, to(br2, DType::f32), to(bi2, DType::f32));  // the composed reference
    backward(sum(mul(y2, weights)));
    CHECK(y.to_vector<float>() == y2.to_vector<float>());
    REQUIRE(residual.grad().dtype() == DType::f32);
    REQUIRE(branch.grad().dtype() == DType::bf16);
    REQUIRE(bias.grad().dtype() == DType::bf16);
    CHECK(residual.grad().to_vector<float>() == r2.grad().to_vector<float>());
    CHECK(wide(branch.grad()).to_vector<float>() == wide(br2.grad()).to_vector<float>());
    CHECK(wide(bias.grad()).to_vector<float>() == wide(bi2.grad()).to_vector<float>());
  }
}

TEST_CASE("bfloat16 tensors go through safetensors as BF16, bit for bit, and damaged ones are refused", "[bf16]") {
  const Tensor b = kernels::cast(randn({3, 5}, {DType::f32}), DType::bf16);
  const std::string bytes = train::output::serialize_safetensors({{"w", b}});
  CHECK(bytes.find("\"dtype\":\"BF16\"") != std::string::npos);
  const train::output::Safetensors back = train::output::parse_safetensors(bytes, "w.safetensors");
  const Tensor w = back.tensors.at("w");
  REQUIRE(w.dtype() == DType::bf16);
  REQUIRE(w.sizes() == b.sizes());
  CHECK(std::memcmp(w.raw_data(), b.raw_data(), 15 * 2) == 0);
  // The header promises 15 values of 2 bytes; a data section one byte short is refused.
  std::string short_data = bytes;
  short_data.pop_back();
  CHECK_THROWS_WITH(train::output::parse_safetensors(short_data, "w.safetensors"),
                    Catch::StartsWith("[w.safetensors]"));
}

// ---- matrix products (cpu/matmul_bf16/) --------------------------------------------

namespace {

// A float32 matrix of values already bfloat16 (so the kernels' inputs are exact).
Tensor bf16_values(const Shape& sizes, std::uint64_t seed) {
  Generator gen(seed);
  return kernels::cast(kernels::cast(randn(sizes, {DType::f32}, gen), DType::bf16), DType::f32);
}

}  // namespace

TEST_CASE("bfloat16 products on every kernel this CPU runs, and on the scalar models, within the bound", "[bf16][matmul]") {
  for (cpu::Bf16Kernel kernel : {cpu::Bf16Kernel::amx, cpu::Bf16Kernel::avx512_bf16, cpu::Bf16Kernel::widen,
                                 cpu::Bf16Kernel::amx_model, cpu::Bf16Kernel::avx512_bf16_model}) {
    if (!cpu::bf16_kernel_runs_here(kernel)) {
      WARN("skipped: this CPU has no " << cpu::bf16_kernel_name(kernel));
      continue;
    }
    // (70, 45, 64): a row-major A read in place (K whole steps, rows 128 bytes apart) but for its last 6 rows;
    // (40, 9, 1024): K whole steps, but rows 2 KiB apart, in 2 of L1's sets: packed.
    for (auto [m, n, k] : {std::tuple{1, 1, 1}, {5, 7, 3}, {31, 33, 32}, {33, 17, 65}, {64, 64, 64}, {70, 45, 64}, {70, 45, 100},
                           {40, 9, 1024}})
      for (bool a_transposed : {false, true})
        for (bool b_transposed : {false, true})
          for (bool with_bias : {false, true}) {
            INFO(cpu::bf16_kernel_name(kernel) << " " << m << " x " << n << " x " << k << (a_transposed ? " A^T" : "")
                                              << (b_transposed ? " B^T" : "") << (with_bias ? " +bias" : ""));
            const Tensor a32 = a_transposed ? transpose(bf16_values({k, m}, 1), 0, 1) : bf16_values({m, k}, 1);
            const Tensor b32 = b_transposed ? transpose(bf16_values({n, k}, 2), 0, 1) : bf16_values({k, n}, 2);
            const Tensor bias32 = bf16_values({n}, 3);
            const Tensor a = kernels::cast(a32, DType::bf16), b = kernels::cast(b32, DType::bf16);
            const Tensor bias = kernels::cast(bias32, DType::bf16);
            Tensor c = empty({m, n}, {DType::bf16});
            cpu::gemm_bf16({{a.data<bfloat16>(), a.stride(0), a.stride(1)},
                            {b.data<bfloat16>(), b.stride(0), b.stride(1)},
                            c.data<bfloat16>(),
                            n,
                            with_bias ? bias.data<bfloat16>() : nullptr,
                            m,
                            n,
                            k},
                           kernel);
            // The bias as one more term of every dot product: a column of ones times the bias row.
            const Tensor a_ext = with_bias ? kernels::cat({a32, ones({m, 1})}, 1) : a32;
            const Tensor b_ext = with_bias ? kernels::cat({b32, view(bias32, {1, n})}, 0) : b32;
            std::string where;
            CHECK(within_product_bound(c, a_ext, b_ext, where));
            INFO(where);
          }
  }
}

// A CPU without bfloat16 instructions multiplies on a float32 kernel that
// widens the operands as it packs them, each thread's block of C's float32
// sums held in its scratch until they are rounded (matmul.cpp): C must be
// float32's whole product of the widened operands plus the bias, rounded once,
// bit for bit, however the threads cut it (ours sum K in one order wherever a
// block starts: sgemm.cpp). Shapes: row blocks (2000 x 150), column blocks
// (30 x 600), batches whole on threads, a transposed A.
TEST_CASE("bfloat16 matmul on the widening float32 kernel: the widened operands' float32 product plus the bias, "
          "rounded once, bit for bit on 1, 2 and 3 threads",
          "[bf16][matmul]") {
  const cpu::F32Kernel kernel = cpu::widening_f32_kernel();
  INFO(cpu::f32_kernel_name(kernel));
  const char* chosen = std::getenv("ATTOGRAD_F32_GEMM");
  if (!(chosen && *chosen) && cpu::f32_kernel_runs_here(cpu::F32Kernel::avx2))
    CHECK(kernel != cpu::F32Kernel::openblas);  // not OpenBLAS's widened copies of whole operands
  if (kernel == cpu::F32Kernel::openblas) {
    WARN("skipped: no kernel of ours runs here (OpenBLAS's bits depend on the blocks)");
    return;
  }
  for (auto [batches, m, n, k, a_transposed] : {std::tuple{1, 2000, 150, 70, false}, {1, 30, 600, 500, false},
                                               {5, 40, 50, 60, false}, {1, 700, 130, 90, true}})
    for (int threads : {1, 2, 3}) {
      INFO(batches << " x " << m << " x " << n << " x " << k << (a_transposed ? " A^T" : "") << ", " << threads
                   << " threads");
      set_num_threads(threads);
      const Tensor a32 = a_transposed ? transpose(bf16_values({batches, k, m}, 11), 1, 2) : bf16_values({batches, m, k}, 11);
      const Tensor b32 = bf16_values({batches, k, n}, 12), bias32 = bf16_values({n}, 13);
      const Tensor a = kernels::cast(a32, DType::bf16), b = kernels::cast(b32, DType::bf16);
      const Tensor c = cpu::matmul_widened(a, b, {batches}, kernels::cast(bias32, DType::bf16));
      const Tensor b_c = kernels::contiguous(b32);
      std::vector<float> sums(static_cast<std::size_t>(m * n));
      std::int64_t differ = 0;
      for (int i = 0; i < batches; ++i) {
        const Tensor a_batch = kernels::contiguous(a_transposed ? transpose(select(a, 0, i), 0, 1) : select(a, 0, i));
        cpu::gemm_f32({.a_transposed = a_transposed, .m = m, .n = n, .k = k, .lda = a_transposed ? m : k,
                       .b = b_c.data<float>() + i * k * n, .ldb = n, .c = sums.data(), .ldc = n,
                       .bias = bias32.data<float>(), .a_bf16 = a_batch.data<bfloat16>()},
                      kernel);
        const bfloat16* got = c.data<bfloat16>() + i * m * n;
        for (std::int64_t e = 0; e < m * n; ++e) differ += got[e].bits != bfloat16_bits(sums[e]);
      }
      CHECK(differ == 0);
    }
  set_num_threads(2);
}

// The bfloat16 kernels cut C into macro blocks by the thread count, smaller
// where few blocks would split unevenly (matmul_bf16.cpp's choose_blocking),
// but sum every element over K in chunks that depend on K alone: C must be
// the same bits on 1, 2 and 3 threads. Shapes: 768 x 768 x 600 (nine blocks
// of 256 x 256 on one thread, 18 on two; K in three chunks), 416 rows (a
// partial last block), fewer columns than one block.
TEST_CASE("bfloat16 products on every kernel this CPU runs: the same bits on 1, 2 and 3 threads, within the bound",
          "[bf16][matmul]") {
  for (cpu::Bf16Kernel kernel : {cpu::Bf16Kernel::amx, cpu::Bf16Kernel::avx512_bf16, cpu::Bf16Kernel::amx_model,
                                 cpu::Bf16Kernel::avx512_bf16_model}) {
    if (!cpu::bf16_kernel_runs_here(kernel)) {
      WARN("skipped: this CPU has no " << cpu::bf16_kernel_name(kernel));
      continue;
    }
    const bool model = kernel == cpu::Bf16Kernel::amx_model || kernel == cpu::Bf16Kernel::avx512_bf16_model;
    const auto shapes = model ? std::vector<std::tuple<int, int, int>>{{416, 300, 64}, {200, 24, 96}}
                              : std::vector<std::tuple<int, int, int>>{{768, 768, 600}, {416, 300, 64}, {200, 24, 96}};
    for (auto [m, n, k] : shapes) {
      const Tensor a32 = bf16_values({m, k}, 21), b32 = bf16_values({k, n}, 22);
      const Tensor a = kernels::cast(a32, DType::bf16), b = kernels::cast(b32, DType::bf16);
      std::vector<std::uint16_t> one_thread;
      for (int threads : {1, 2, 3}) {
        INFO(cpu::bf16_kernel_name(kernel) << " " << m << " x " << n << " x " << k << ", " << threads << " threads");
        set_num_threads(threads);
        Tensor c = empty({m, n}, {DType::bf16});
        cpu::gemm_bf16({{a.data<bfloat16>(), a.stride(0), a.stride(1)},
                        {b.data<bfloat16>(), b.stride(0), b.stride(1)},
                        c.data<bfloat16>(),
                        n,
                        nullptr,
                        m,
                        n,
                        k},
                       kernel);
        std::vector<std::uint16_t> bits(static_cast<std::size_t>(m * n));
        for (std::size_t e = 0; e < bits.size(); ++e) bits[e] = c.data<bfloat16>()[e].bits;
        if (threads == 1) {
          std::string where;
          CHECK(within_product_bound(c, a32, b32, where));
          INFO(where);
          one_thread = bits;
        } else {
          CHECK(std::mismatch(bits.begin(), bits.end(), one_thread.begin()).first == bits.end());
        }
      }
    }
  }
  set_num_threads(2);
}

TEST_CASE("the default bfloat16 kernel: AMX, else VDPBF16PS on AMD, else widened", "[bf16][matmul]") {
  using cpu::Bf16Kernel;
  CHECK(cpu::preferred_bf16_kernel({true, true, false}) == Bf16Kernel::amx);
  CHECK(cpu::preferred_bf16_kernel({true, true, true}) == Bf16Kernel::amx);
  // Intel's cores issue VDPBF16PS at half rate; AMD's at float32's FMA rate.
  CHECK(cpu::preferred_bf16_kernel({false, true, false}) == Bf16Kernel::widen);
  CHECK(cpu::preferred_bf16_kernel({false, true, true}) == Bf16Kernel::avx512_bf16);
  CHECK(cpu::preferred_bf16_kernel({false, false, true}) == Bf16Kernel::widen);
  CHECK(cpu::preferred_bf16_kernel({}) == Bf16Kernel::widen);
}

TEST_CASE("a bfloat16 product of a transposed A with more rows than columns, computed as C^T = B^T A^T, bit for bit as "
          "from a row-major A",
          "[bf16][matmul]") {
  // The weight gradient's shape (dy^T x with dy wider than x): gemm_bf16 packs
  // the smaller operand transposed and writes C transposed; each value is the
  // same sum in the same order as the product of a row-major copy of A.
  for (cpu::Bf16Kernel kernel : {cpu::Bf16Kernel::amx, cpu::Bf16Kernel::avx512_bf16, cpu::Bf16Kernel::amx_model,
                                 cpu::Bf16Kernel::avx512_bf16_model}) {
    if (!cpu::bf16_kernel_runs_here(kernel)) continue;
    for (const auto& shape : {std::tuple{70, 45, 100}, {96, 32, 64}, {33, 1, 7}}) {
      const auto [m, n, k] = shape;
      const int rows = m, cols = n, depth = k;  // clang 14's lambdas capture no structured binding
      INFO(cpu::bf16_kernel_name(kernel) << " " << m << " x " << n << " x " << k);
      const Tensor a_t = transpose(kernels::cast(bf16_values({k, m}, 7), DType::bf16), 0, 1);  // A^T row-major
      const Tensor a = kernels::contiguous(a_t);
      const Tensor b = kernels::cast(bf16_values({k, n}, 8), DType::bf16);
      const auto product = [&](const Tensor& lhs) {
        Tensor c = empty({rows, cols}, {DType::bf16});
        cpu::gemm_bf16({{lhs.data<bfloat16>(), lhs.stride(0), lhs.stride(1)},
                        {b.data<bfloat16>(), b.stride(0), b.stride(1)},
                        c.data<bfloat16>(),
                        cols,
                        nullptr,
                        rows,
                        cols,
                        depth},
                       kernel);
        return c.to_vector<float>();
      };
      const std::vector<float> from_transposed = product(a_t), from_row_major = product(a);
      REQUIRE(a_t.stride(0) == 1);
      CHECK(from_transposed == from_row_major);
    }
  }
}

TEST_CASE("a bfloat16 product's sums plus the bias round into C as bfloat16(sum + bias), bit for bit, on every kernel",
          "[bf16][matmul]") {
  // Small integers make every sum exact in float32 whatever order a kernel adds
  // in, so C is known to the bit: the float32 sum plus the bias, rounded once.
  // The biases have fractions that sum + bias cannot keep in 8 bits, ties among
  // them; the shapes leave partial blocks and strips at the edges.
  for (cpu::Bf16Kernel kernel : {cpu::Bf16Kernel::amx, cpu::Bf16Kernel::avx512_bf16, cpu::Bf16Kernel::widen,
                                 cpu::Bf16Kernel::amx_model, cpu::Bf16Kernel::avx512_bf16_model}) {
    if (!cpu::bf16_kernel_runs_here(kernel)) continue;
    for (auto [m, n, k] : {std::tuple{40, 50, 64}, {33, 70, 96}, {5, 3, 7}}) {
      INFO(cpu::bf16_kernel_name(kernel) << " " << m << " x " << n << " x " << k);
      std::vector<bfloat16> a(m * k), b(k * n), bias(n), c(m * n);
      for (int i = 0; i < m * k; ++i) a[i] = bfloat16(static_cast<float>((i * 7) % 7 - 3));
      for (int i = 0; i < k * n; ++i) b[i] = bfloat16(static_cast<float>((i * 5) % 9 - 4));
      for (int j = 0; j < n; ++j) bias[j] = bfloat16(0.5f + static_cast<float>(j % 16) * 0x1p-5f - static_cast<float>(j % 3));
      cpu::gemm_bf16({{a.data(), k, 1}, {b.data(), n, 1}, c.data(), n, bias.data(), m, n, k}, kernel);
      std::int64_t differ = 0;
      for (int r = 0; r < m; ++r)
        for (int j = 0; j < n; ++j) {
          float sum = 0;  // exact: integers far below 2^24
          for (int q = 0; q < k; ++q) sum += static_cast<float>(a[r * k + q]) * static_cast<float>(b[q * n + j]);
          differ += c[r * n + j].bits != bfloat16_bits(sum + static_cast<float>(bias[j]));
        }
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("bfloat16 matmul: batches broadcast, transposed views and a bias, as float32's", "[bf16][matmul]") {
  const Tensor a32 = bf16_values({3, 1, 20, 40}, 4), b32 = bf16_values({2, 40, 24}, 5), bias32 = bf16_values({24}, 6);
  const Tensor a = kernels::cast(a32, DType::bf16), b = kernels::cast(b32, DType::bf16);
  const Tensor b_t = transpose(kernels::contiguous(transpose(b, 1, 2)), 1, 2);  // column-major
  const Tensor c = kernels::matmul(a, b_t, kernels::cast(bias32, DType::bf16));
  REQUIRE(c.dtype() == DType::bf16);
  REQUIRE(c.sizes() == Shape{3, 2, 20, 24});
  const Tensor want = kernels::matmul(kernels::cast(a32, DType::f64), kernels::cast(b32, DType::f64),
                                      kernels::cast(bias32, DType::f64));
  const double sum_abs_bound = 40 * 0x1p-24 * 40 * 16 + 1e-6;  // |a|, |b| < 4: each product under 16
  const auto g = c.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i)
    REQUIRE(std::abs(g[i] - w[i]) <= kBf16UnitRoundoff * std::abs(w[i]) + sum_abs_bound);
  CHECK_THROWS_WITH(kernels::matmul(a, b32), Catch::Contains("dtypes differ"));
}
