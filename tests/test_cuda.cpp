// The CUDA backend against the CPU: every op on random inputs over a table of
// shapes (odd sizes, long rows that take the block-per-row and chunked paths),
// with contiguous, transposed, broadcast and offset inputs, forward and
// backward; the device runtime (moves, errors, the caching allocator); and a
// GPT training step on the GPU against the same step on the CPU.
//
// Without a GPU at run time (or in a build without CUDA) every test here
// reports itself skipped, by name, and passes: SKIP_WITHOUT_CUDA (helpers.h)
// is the first line of every test in this file.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "autograd/attention.h"
#include "autograd/autocast.h"
#if defined(ATTOGRAD_WITH_CUDA)
#include "cuda_mma_probe.h"
#endif
#include "helpers.h"
#include "nn/gpt.h"
#include "train/optim/optimizer.h"

using namespace attograd;
using namespace attograd::test;

namespace {

// ---- tolerances, written once per dtype ----------------------------------------------------

// The GPU adds in other orders than the CPU (trees, tiles) and uses
// CUDA's exp/tanh: float32 results agree to about 1e-6 relative, float64 ones
// in their last bits. Integers and bools must agree exactly.
struct Tolerance {
  double atol, rtol;
};
Tolerance parity(DType t) {
  switch (t) {
    case DType::f32: return {1e-4, 1e-4};
    case DType::f64: return {1e-10, 1e-9};
    default: return {0, 0};
  }
}

// ---- inputs -------------------------------------------------------------------------------------

enum class Layout { contiguous, transposed, broadcast, offset };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::broadcast: return "broadcast";
    case Layout::offset: return "offset";
  }
  return "?";
}

// A CPU tensor of `sizes` laid out as `layout`, normal values (or in [0.5, 2)
// when positive): transposed swaps its last two dims in memory, broadcast
// repeats one row along dim 0 (stride 0), offset is a slice of a wider tensor.
Tensor input(const Shape& sizes, DType dtype, Layout layout, std::uint64_t seed, bool positive = false) {
  Generator gen(seed);
  auto draw = [&](const Shape& s) { return positive ? uniform(s, 0.5, 2.0, {dtype}, gen) : randn(s, {dtype}, gen); };
  switch (layout) {
    case Layout::contiguous: return draw(sizes);
    case Layout::transposed: {
      Shape swapped = sizes;
      std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
      const Tensor base = draw(swapped);
      Shape strides = base.strides();
      std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
      return make_view(base, sizes, strides, 0);
    }
    case Layout::broadcast: {
      Shape one = sizes;
      one[0] = 1;
      const Tensor base = draw(one);
      Shape strides = base.strides();
      strides[0] = 0;
      return make_view(base, sizes, strides, 0);
    }
    case Layout::offset: {
      Shape wide = sizes;
      wide.back() += 3;
      const Tensor base = draw(wide);
      return make_view(base, sizes, base.strides(), 2);
    }
  }
  return {};
}

// The layouts a shape can take: transposed needs two dims, the others one.
std::vector<Layout> layouts_for(const Shape& sizes) {
  std::vector<Layout> all{Layout::contiguous};
  if (sizes.size() >= 1 && numel_of(sizes) > 0) all.push_back(Layout::broadcast), all.push_back(Layout::offset);
  if (sizes.size() >= 2) all.push_back(Layout::transposed);
  return all;
}

// The same view on the GPU: x's whole storage copied over, then x's sizes,
// strides and offset on it, so a transposed, broadcast or offset view stays
// exactly that on the device.
Tensor on_gpu(const Tensor& x) {
  const auto n = static_cast<std::int64_t>(x.storage()->nbytes() / dtype_size(x.dtype()));
  const Tensor flat_gpu = kernels::to_device(make_view(x, {n}, {1}, 0), Device::cuda());
  return make_view(flat_gpu, x.sizes(), x.strides(), x.offset());
}

Tensor on_cpu(const Tensor& x) { return kernels::to_device(x, Device::cpu()); }

// ---- comparisons --------------------------------------------------------------------------------

// gpu (on the device) equals cpu within the parity tolerance of their dtype.
void require_parity(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  INFO(what << ": gpu " << gpu.str() << ", cpu " << cpu.str());
  REQUIRE(gpu.defined() == cpu.defined());
  if (!cpu.defined()) return;
  REQUIRE(gpu.device().is_cuda());
  REQUIRE(gpu.sizes() == cpu.sizes());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const Tensor back = on_cpu(gpu);
  const Tolerance tol = parity(cpu.dtype());
  INFO("max |gpu - cpu| = " << max_abs_diff(back, cpu));
  REQUIRE(all_close(back, cpu, tol.atol, tol.rtol));
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// x / 2 rounded to a multiple of 1/8 and clamped to [-1, 1], in place (x's whole storage), for
// float32 x: products of such values, and sums of up to 2^17 of them, are exact in float32 (and
// every value is exact in TF32 and bfloat16), so a product's result is one number whatever the
// order of its sums and their rounding.
Tensor round_to_eighths(const Tensor& x) {
  const auto n = static_cast<std::int64_t>(x.storage()->nbytes() / sizeof(float));
  float* v = make_view(x, {n}, {1}, 0).data<float>();
  for (std::int64_t i = 0; i < n; ++i) v[i] = std::clamp(std::round(v[i] * 4.0f), -8.0f, 8.0f) / 8.0f;
  return x;
}

// gpu (on the device) holds cpu's values to the bit: the same sizes and bytes.
bool same_bits(const Tensor& gpu, const Tensor& cpu) {
  const Tensor back = on_cpu(gpu);
  return back.sizes() == cpu.sizes() &&
         std::memcmp(back.raw_data(), cpu.raw_data(), cpu.numel() * dtype_size(cpu.dtype())) == 0;
}

void require_same_bits(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  INFO(what << ": gpu " << gpu.str() << ", cpu " << cpu.str() << ", max |gpu - cpu| = " << max_abs_diff(on_cpu(gpu), cpu));
  REQUIRE(same_bits(gpu, cpu));
}

// fn on CPU inputs and on their GPU mirrors: the outputs agree, and so do the
// gradients of every floating input under one random projection of the output.
// exact_sums: the inputs are round_to_eighths's, the projection too, and fn only
// multiplies and adds them, so the results must be the CPU's to the bit.
void require_op_parity(const std::string& name, const Fn& fn, const std::vector<Tensor>& inputs,
                       bool exact_sums = false) {
  const auto require = exact_sums ? require_same_bits : require_parity;
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& x : inputs) {
    Tensor c = x.detach(), g = on_gpu(x);
    if (is_floating(x.dtype())) c.set_requires_grad(true), g.set_requires_grad(true);
    cpu.push_back(c);
    gpu.push_back(g);
  }
  const Tensor y_cpu = fn(cpu), y_gpu = fn(gpu);
  require(y_gpu, y_cpu, name + " forward");
  if (!y_cpu.requires_grad()) return;
  Generator gen(7);
  Tensor projection = kernels::cast(randn(y_cpu.sizes(), {DType::f64}, gen), y_cpu.dtype());
  if (exact_sums) projection = round_to_eighths(projection);
  backward(y_cpu, projection);
  backward(y_gpu, kernels::to_device(projection, Device::cuda()));
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (cpu[i].requires_grad()) require(gpu[i].grad(), cpu[i].grad(), name + " grad of input " + std::to_string(i));
}

std::string describe(const Shape& s, Layout l, DType t) {
  return shape_str(s) + " " + layout_name(l) + " " + std::string(dtype_name(t));
}

}  // namespace

// ---- the runtime -------------------------------------------------------------------------------

TEST_CASE("cuda: tensors move to the GPU and back with their values", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const Tensor floats = input({5, 7}, DType::f32, Layout::transposed, 1);
  const std::vector<Tensor> all{floats, kernels::cast(floats, DType::f64), arange(35, {DType::i64}),
                                kernels::binary(kernels::Binary::gt, floats, zeros({}))};
  for (const Tensor& x : all) {
    INFO(x.str());
    const Tensor g = to(x, Device::cuda(0));
    REQUIRE(g.device() == Device::cuda(0));
    REQUIRE(g.str().find("cuda:0") != std::string::npos);
    const Tensor back = to_cpu(g);
    REQUIRE(back.device().is_cpu());
    REQUIRE(max_abs_diff(back, x) == 0);
  }
  // A view built on the device reads like the CPU view it mirrors.
  REQUIRE(max_abs_diff(on_cpu(kernels::contiguous(on_gpu(floats))), floats) == 0);
}

TEST_CASE("cuda: ops on tensors from different devices name both devices", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const Tensor a = randn({3, 4}), b = to(randn({3, 4}), Device::cuda());
  REQUIRE_THROWS_WITH(add(a, b), Catch::Contains("cpu") && Catch::Contains("cuda:0"));
  REQUIRE_THROWS_WITH(matmul(b, transpose(a, 0, 1)), Catch::Contains("cuda:0") && Catch::Contains("cpu"));
  REQUIRE_THROWS_WITH(embedding(b, to(zeros({2}, {DType::i64}), Device::cpu())), Catch::Contains("cuda:0"));
  REQUIRE_THROWS_WITH(to(a, Device::cuda(cuda::device_count())), Catch::Contains("no CUDA device"));
}

TEST_CASE("cuda: float64 matmul and attention are CPU-only, and say so", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const Tensor a = to(randn({3, 4}, {DType::f64}), Device::cuda());
  REQUIRE_THROWS_WITH(matmul(a, transpose(a, 0, 1)), Catch::Contains("[matmul] float64 is CPU-only"));
  const Tensor q = to(randn({1, 1, 4, 8}, {DType::f64}), Device::cuda());
  REQUIRE_THROWS_WITH(attention(q, q, q), Catch::Contains("float64 is CPU-only"));
  const Tensor wide = to(randn({1, 1, 4, 130}), Device::cuda());
  REQUIRE_THROWS_WITH(attention(wide, wide, wide), Catch::Contains("head dim 130"));
}

TEST_CASE("cuda: the caching allocator reuses freed blocks across steps", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  if (std::getenv("ATTOGRAD_CUDA_NO_CACHE")) {
    WARN("skipped: ATTOGRAD_CUDA_NO_CACHE turns the cache off");
    return;
  }
  const cuda::MemoryStats before = cuda::memory_stats(0);
  { const Tensor t = empty({1000}, {DType::f32, Device::cuda()}); }
  const cuda::MemoryStats after_first = cuda::memory_stats(0);
  { const Tensor t = empty({1000}, {DType::f32, Device::cuda()}); }
  const cuda::MemoryStats after_second = cuda::memory_stats(0);
  REQUIRE(after_second.cuda_mallocs == after_first.cuda_mallocs);  // the second came from the cache
  REQUIRE(after_second.reuses == after_first.reuses + 1);
  REQUIRE(after_second.allocated == before.allocated);
  REQUIRE(after_second.cached >= 4000);
  REQUIRE(after_second.peak >= before.allocated + 4000);

  // A repeated "training step" allocates nothing new after its first run.
  const Tensor w = to(randn({64, 64}), Device::cuda()).set_requires_grad(true);
  const Tensor x = to(randn({32, 64}), Device::cuda());
  auto step = [&] {
    w.set_grad({});
    backward(sum(gelu(matmul(x, w))));
    return w.grad().defined();
  };
  REQUIRE(step());
  const std::uint64_t mallocs = cuda::memory_stats(0).cuda_mallocs;
  for (int i = 0; i < 3; ++i) REQUIRE(step());
  REQUIRE(cuda::memory_stats(0).cuda_mallocs == mallocs);
}

// ---- elementwise -----------------------------------------------------------------------------------

TEST_CASE("cuda: every unary op matches the CPU on every layout", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const std::vector<kernels::Unary> ops{
#define AG_LIST(name) kernels::Unary::name,
      AG_UNARY_OPS(AG_LIST)
#undef AG_LIST
  };
  const std::vector<Shape> shapes{{}, {1}, {7}, {5, 13}, {3, 5, 11}, {2, 3, 5, 7}, {(1 << 18) + 3}};
  for (DType dtype : {DType::f32, DType::f64})
    for (kernels::Unary op : ops) {
      const bool positive = op == kernels::Unary::log || op == kernels::Unary::sqrt ||
                            op == kernels::Unary::pow_scalar || op == kernels::Unary::rdiv_scalar;
      for (const Shape& shape : shapes)
        for (Layout layout : layouts_for(shape)) {
          const Tensor x = input(shape, dtype, layout, 3, positive);
          require_parity(kernels::unary(op, on_gpu(x), 1.7), kernels::unary(op, x, 1.7),
                         std::string(kernels::unary_name(op)) + " " + describe(shape, layout, dtype));
        }
    }
}

TEST_CASE("cuda: every binary op matches the CPU, broadcasting and strided", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const std::vector<kernels::Binary> ops{
#define AG_LIST(name) kernels::Binary::name,
      AG_BINARY_OPS(AG_LIST)
#undef AG_LIST
  };
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{5, 7}, {5, 7}}, {{5, 7}, {7}}, {{3, 1, 7}, {5, 1}}, {{1}, {11, 13}}, {{}, {4, 5}}, {{2, 3, 5, 7}, {3, 1, 7}}};
  for (DType dtype : {DType::f32, DType::f64})
    for (kernels::Binary op : ops)
      for (const auto& [sa, sb] : shapes)
        for (Layout la : layouts_for(sa)) {
          const Tensor a = input(sa, dtype, la, 4, /*positive=*/true);
          const Tensor b = input(sb, dtype, sb.size() >= 2 ? Layout::transposed : Layout::contiguous, 5, true);
          const std::string what = std::string(kernels::binary_name(op)) + " " + describe(sa, la, dtype) + " with " +
                                   shape_str(sb);
          require_parity(kernels::binary(op, on_gpu(a), on_gpu(b)), kernels::binary(op, a, b), what);
        }
  // eq on equal values (random normals are almost never equal to each other).
  const Tensor x = input({5, 7}, DType::f32, Layout::transposed, 6);
  require_parity(kernels::binary(kernels::Binary::eq, on_gpu(x), on_gpu(kernels::contiguous(x))),
                 kernels::binary(kernels::Binary::eq, x, kernels::contiguous(x)), "eq on equal values");
}

TEST_CASE("cuda: elementwise ops differentiate like the CPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor a = input({5, 7}, dtype, Layout::transposed, 8, true), b = input({7}, dtype, Layout::contiguous, 9, true);
    require_op_parity("add/mul/div/pow", [](const std::vector<Tensor>& in) {
      return pow(div(mul(add(in[0], in[1]), in[1]), in[0]), in[1]);
    }, {a, b});
    require_op_parity("exp/log/tanh/gelu/relu", [](const std::vector<Tensor>& in) {
      return relu(gelu(tanh(log(exp(in[0]) + 1.0)))) * sqrt(in[0]);
    }, {a});
    require_op_parity("where/masked_fill", [](const std::vector<Tensor>& in) {
      return masked_fill(where(gt(in[0], in[1]), in[0], in[1]), lt(in[0], full({}, 1.0, in[0].options())), -3.0);
    }, {a, b});
  }
}

TEST_CASE("cuda: where, fill_, add_, copy_ and every cast match the CPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const Tensor a = input({3, 5, 7}, DType::f32, Layout::transposed, 10), b = input({7}, DType::f32, Layout::contiguous, 11);
  const Tensor mask = kernels::binary(kernels::Binary::gt, input({5, 1}, DType::f32, Layout::contiguous, 12), zeros({}));
  require_parity(kernels::where(on_gpu(mask), on_gpu(a), on_gpu(b)), kernels::where(mask, a, b), "where");
  const Tensor a16 = kernels::cast(a, DType::bf16), b16 = kernels::cast(b, DType::bf16);
  require_parity(kernels::where(on_gpu(mask), on_gpu(a16), on_gpu(b16)), kernels::where(mask, a16, b16),
                 "where, bfloat16");

  // Every pair of dtypes, from a strided source.
  const Tensor values = kernels::unary(kernels::Unary::mul_scalar, input({5, 7}, DType::f64, Layout::transposed, 13), 3.0);
  for (DType from : {DType::f32, DType::f64, DType::i64, DType::b8, DType::bf16})
    for (DType into : {DType::f32, DType::f64, DType::i64, DType::b8, DType::bf16}) {
      const Tensor src = make_view(kernels::cast(kernels::contiguous(values), from), {7, 5}, {1, 7}, 0);
      require_parity(kernels::cast(on_gpu(src), into), kernels::cast(src, into),
                     fmt::format("cast {} -> {}", dtype_name(from), dtype_name(into)));
    }

  // fill_ and add_ write only their (strided) view; the rest of the storage is untouched.
  const Tensor base = input({6, 8}, DType::f32, Layout::contiguous, 14);
  const Tensor base_gpu = on_gpu(base);
  const Tensor view = make_view(base, {3, 4}, {16, 2}, 1), view_gpu = make_view(base_gpu, {3, 4}, {16, 2}, 1);
  kernels::fill_(view, 2.5);
  kernels::fill_(view_gpu, 2.5);
  require_parity(base_gpu, base, "fill_ through a strided view");
  const Tensor row = input({4}, DType::f32, Layout::contiguous, 15);
  kernels::add_(view, row, -0.5);
  kernels::add_(view_gpu, on_gpu(row), -0.5);
  require_parity(base_gpu, base, "add_ of a broadcast row through a strided view");

  // copy_ from the CPU into a strided GPU view, and GPU to GPU with broadcasting.
  const Tensor src = input({3, 4}, DType::f64, Layout::contiguous, 16);
  kernels::copy_(view, src);
  kernels::copy_(view_gpu, src);
  require_parity(base_gpu, base, "copy_ cpu float64 -> strided cuda float32");
  kernels::copy_(view, row);
  kernels::copy_(view_gpu, on_gpu(row));
  require_parity(base_gpu, base, "copy_ broadcast on the device");
}

// ---- reductions -------------------------------------------------------------------------------------

TEST_CASE("cuda: sum matches the CPU over every set of dims", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64})
    for (const Shape& shape : {Shape{5, 7, 11}, Shape{3, 4, 5, 6}})
      for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::offset}) {
        const Tensor x = input(shape, dtype, layout, 20);
        const int nd = static_cast<int>(shape.size());
        for (int subset = 0; subset < (1 << nd); ++subset) {
          std::vector<int> dims;
          for (int d = 0; d < nd; ++d)
            if (subset & (1 << d)) dims.push_back(d);
          for (bool keepdim : {false, true})
            require_parity(kernels::sum(on_gpu(x), dims, keepdim), kernels::sum(x, dims, keepdim),
                           fmt::format("sum over {} keepdim {} of {}", dims, keepdim, describe(shape, layout, dtype)));
        }
      }
  // Long reductions with few outputs: the chunked two-pass paths (rows and columns).
  const Tensor wide = input({3, 70001}, DType::f32, Layout::contiguous, 21);
  require_parity(kernels::sum(on_gpu(wide), {1}, false), kernels::sum(wide, {1}, false), "sum of 3 long rows");
  const Tensor tall = input({70001, 3}, DType::f32, Layout::contiguous, 22);
  require_parity(kernels::sum(on_gpu(tall), {0}, false), kernels::sum(tall, {0}, false), "sum of 3 long columns");
  const Tensor bias_grad = input({4096, 768}, DType::f32, Layout::contiguous, 23);
  require_parity(kernels::sum(on_gpu(bias_grad), {0}, false), kernels::sum(bias_grad, {0}, false), "bias gradient");
  const Tensor flat = input({(1 << 20) + 7}, DType::f32, Layout::contiguous, 24);
  require_parity(kernels::sum(on_gpu(flat), {}, false), kernels::sum(flat, {}, false), "sum of everything");
}

TEST_CASE("cuda: max matches the CPU, values and the first index of ties", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64})
    for (const Shape& shape : {Shape{5, 7, 11}, Shape{3, 5000}, Shape{5000, 3}})
      for (Layout layout : {Layout::contiguous, Layout::transposed}) {
        // Values rounded to halves, written back through the view: plenty of ties, in `layout`.
        const Tensor x = input(shape, dtype, layout, 25);
        const Tensor twice = kernels::unary(kernels::Unary::mul_scalar, x, 2.0);
        kernels::copy_(x, kernels::unary(kernels::Unary::mul_scalar, kernels::cast(kernels::cast(twice, DType::i64), dtype), 0.5));
        for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
          const auto cpu = kernels::max(x, dim, false);
          const auto gpu = kernels::max(on_gpu(x), dim, false);
          const std::string what = fmt::format("max over dim {} of {}", dim, describe(shape, layout, dtype));
          require_parity(gpu.values, cpu.values, what + " values");
          require_parity(gpu.indices, cpu.indices, what + " indices");
        }
      }
  // A NaN wins, and the first NaN is reported.
  const Tensor x = from<float>({1, NAN, 3, NAN, 2}, {1, 5});
  const auto r = kernels::max(on_gpu(x), 1, false);
  REQUIRE(std::isnan(r.values.item()));
  REQUIRE(r.indices.item() == 1);
  require_op_parity("max backward", [](const std::vector<Tensor>& in) { return max(in[0], 1); },
                    {input({6, 9}, DType::f32, Layout::transposed, 26)});
}

// ---- matmul -----------------------------------------------------------------------------------------

namespace {

// Runs body once with each set of kernels for `op` (cuda/runtime.h), restoring
// the process's choice afterwards, whatever body throws.
void for_each_kernel_set(cuda::KernelOp op, const std::function<void()>& body) {
  for (cuda::KernelSet k : {cuda::KernelSet::simt, cuda::KernelSet::tensor_core}) {
    const cuda::ScopedKernelSet kernels(op, k);
    INFO(cuda::kernel_op_name(op) << " kernels: " << cuda::kernel_set_name(k));
    body();
  }
}

struct MatmulCase {
  Shape a, b;
};

// Twice the GPU's SMs: as many 128 x 128 tiles as take the products' 128 x 128
// kernels (cuda/matmul.cu, cuda/matmul_bf16.cu); fewer take the 64 x 64 ones.
std::int64_t big_kernel_tiles() { return 2 * static_cast<std::int64_t>(cuda::multiprocessor_count(0)); }

// The side of the smallest square product of whole 128 x 128 tiles that takes
// the 128 x 128 kernels: 2176 on an H100's 132 SMs, 512 on the emulator's 8.
std::int64_t big_kernel_side() {
  std::int64_t tiles = 1;
  while (tiles * tiles < big_kernel_tiles()) ++tiles;
  return 128 * tiles;
}

// a @ b on the GPU against the CPU, each operand contiguous and transposed in memory.
// exact_sums: operands rounded by round_to_eighths, and the CPU's result wanted to the bit.
void require_matmul_parity(const Shape& a_shape, const Shape& b_shape, std::uint64_t seed, bool exact_sums = false) {
  const auto operand = [&](const Shape& sizes, bool transposed, std::uint64_t s) {
    const Tensor x = input(sizes, DType::f32, transposed ? Layout::transposed : Layout::contiguous, s);
    return exact_sums ? round_to_eighths(x) : x;
  };
  const auto require = exact_sums ? require_same_bits : require_parity;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Tensor a = operand(a_shape, ta, seed), b = operand(b_shape, tb, seed + 1);
      require(kernels::matmul(on_gpu(a), on_gpu(b)), kernels::matmul(a, b),
              fmt::format("matmul {} {} @ {} {}", shape_str(a_shape), ta ? "(transposed)" : "", shape_str(b_shape),
                          tb ? "(transposed)" : ""));
    }
}

}  // namespace

TEST_CASE("cuda: matmul matches the CPU: odd sizes, transposes, broadcast batches", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const std::int64_t side = big_kernel_side();
  const std::vector<MatmulCase> cases{
      {{1, 1}, {1, 1}},       {{5, 7}, {7, 11}},          {{13, 1}, {1, 3}},         {{64, 64}, {64, 64}},
      {{127, 129}, {129, 131}}, {{300, 200}, {200, 150}}, {{1, 300}, {300, 1}},      {{2, 3, 5, 7}, {3, 7, 11}},
      {{4, 1, 5, 8}, {1, 6, 8, 12}}, {{2, 5, 7}, {7, 3}}, {{3, 0}, {0, 4}},          {{side, 24}, {24, side}}};
  for_each_kernel_set(cuda::KernelOp::matmul, [&] {
    for (const MatmulCase& c : cases) require_matmul_parity(c.a, c.b, 30);
    // Operands at odd offsets: no float4 loads possible.
    const Tensor a = input({33, 17}, DType::f32, Layout::offset, 32),
                 b = input({17, 9}, DType::f32, Layout::offset, 33);
    require_parity(kernels::matmul(on_gpu(a), on_gpu(b)), kernels::matmul(a, b), "matmul of offset views");
    require_op_parity(
        "matmul backward", [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
        {input({2, 5, 7}, DType::f32, Layout::transposed, 34), input({7, 3}, DType::f32, Layout::contiguous, 35)});
  });
}

// A float32 product's bias goes in as C is stored (each kernel's own store; the
// slices' sum with split-K), where it took a pass of its own over C: the same
// bits as that pass (a float32 sum, then the bias added), in each kernel set,
// on shapes that take every path: the largest tiles (the pipelined kernel on
// the tensor cores), small tiles, slices of K, an empty K (C is the bias),
// broadcast batches, edges stored value by value.
TEST_CASE("cuda: a float32 product's bias added as C is stored gives the separate pass's bits", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const std::int64_t side = big_kernel_side();
  const std::vector<MatmulCase> cases{{{side, 24}, {24, side}}, {{37, 70}, {70, 45}},     {{70, 1000}, {1000, 100}},
                                      {{3, 0}, {0, 4}},           {{2, 3, 5, 7}, {3, 7, 11}}, {{13, 9}, {9, 6}}};
  for_each_kernel_set(cuda::KernelOp::matmul, [&] {
    for (const MatmulCase& c : cases) {
      INFO(shape_str(c.a) << " @ " << shape_str(c.b));
      const Tensor a = on_gpu(input(c.a, DType::f32, Layout::contiguous, 80));
      const Tensor b = on_gpu(input(c.b, DType::f32, Layout::transposed, 81));
      const Tensor bias = on_gpu(input({c.b.back()}, DType::f32, Layout::contiguous, 82));
      const Tensor separate = kernels::binary(kernels::Binary::add, kernels::matmul(a, b), bias);
      require_same_bits(kernels::matmul(a, b, bias), on_cpu(separate), "matmul with a bias");
    }
  });
}

// Few output tiles over a long K (a Linear's weight gradient X^T dY: K = batch x tokens): K is cut into
// slices summed afterwards. K not a multiple of the slice, nor of 8; batches; both operand layouts.
// The operands are round_to_eighths's, so every product and every partial sum is exact in float32
// (and each operand in TF32): the GPU must give the CPU's result to the bit, whatever its order
// of sums and their rounding, and a slice lost or added twice shows. On random operands the
// tensor cores' truncated sums (the probe above) part from OpenBLAS's by more than the float32
// parity bound over such K (3.2e-4 at K = 2048 in the first GPU window, and as much on the
// emulator, which models the truncation); their accuracy on random data is the shorter products'
// tests' to check.
TEST_CASE("cuda: matmul over a long K with few output tiles (split-K) matches the CPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const std::vector<MatmulCase> cases{{{70, 1000}, {1000, 100}}, {{7, 1001}, {1001, 5}}, {{3, 9, 1500}, {1500, 6}}};
  for_each_kernel_set(cuda::KernelOp::matmul, [&] {
    for (const MatmulCase& c : cases) require_matmul_parity(c.a, c.b, 36, /*exact_sums=*/true);
    require_op_parity(
        "Linear-shaped matmul backward", [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
        {round_to_eighths(input({4, 250, 70}, DType::f32, Layout::contiguous, 38)),
         round_to_eighths(input({70, 33}, DType::f32, Layout::contiguous, 39))},
        /*exact_sums=*/true);
  });
}

// The pipelined float32 kernel (cuda/matmul_tf32_pipelined.cu) takes the tensor
// cores' products of at least as many 128 x 256 tiles as the GPU has SMs (8 on
// the emulator) whose operands allow 16-byte copies of whole chunks of four (M,
// N and K multiples of 4 here, so all four layouts take it): partial tiles on
// both edges, K of one ragged tile (k below 0 zero-filled), of a few and of more
// tiles than its stages, exact and ragged, broadcast batches. Random operands
// within the float32 parity bound, which one TF32 product alone (no small
// parts, 2^-11 off) exceeds at these K. Too few tiles over a long K take it over
// slices of K, on operands whose sums are exact, so that a slice lost, added
// twice or read below its start shows: 1000 in slices of 336, the last ragged;
// batches of one tile each.
TEST_CASE("cuda: the pipelined float32 product on the tensor cores matches the CPU: edges, ragged K, batches, split-K",
          "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const cuda::ScopedKernelSet tensor_cores(cuda::KernelOp::matmul, cuda::KernelSet::tensor_core);
  const std::vector<MatmulCase> cases{{{296, 4}, {4, 600}},       {{296, 36}, {36, 600}},
                                      {{296, 100}, {100, 600}},   {{136, 256}, {256, 1032}},
                                      {{2, 1, 160, 48}, {3, 48, 520}}};
  for (const MatmulCase& c : cases) require_matmul_parity(c.a, c.b, 40);
  for (const MatmulCase& c : {MatmulCase{{200, 1000}, {1000, 296}}, MatmulCase{{3, 64, 800}, {800, 64}}})
    require_matmul_parity(c.a, c.b, 42, /*exact_sums=*/true);
}

// ---- bfloat16 ---------------------------------------------------------------------------------------

// The bfloat16 product stands on cuda/mma_bf16.cuh's reading of the PTX ISA's
// m16n8k16 fragment layout: one warp's product on operands whose every product
// and sum is exact in float32 (small multiples of 1/8), so the result must be
// A B to the bit, and any value read from the wrong place shows.
TEST_CASE("cuda: the bfloat16 tensor-core product follows cuda/mma_bf16.cuh's fragment layout", "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
#if defined(ATTOGRAD_WITH_CUDA)
  std::vector<float> a(16 * 16), b(16 * 8);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i * 7 % 23) - 11) / 8;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i * 5 % 19) - 9) / 8;
  const std::vector<float> got = test::warp_product_bf16_on_gpu(a, b);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double want = 0;
      for (int k = 0; k < 16; ++k) want += static_cast<double>(a[i * 16 + k]) * b[k * 8 + j];
      INFO("C[" << i << "][" << j << "]");
      REQUIRE(got[i * 8 + j] == want);
    }
#endif
}

// The bfloat16 product reads its fragments with ldmatrix (load_matrices), as
// the PTX ISA describes it: lanes 8i to 8i + 7 give the rows of matrix i; lane
// l gets, in register i, values 2(l % 4) and 2(l % 4) + 1 of matrix i's row
// l / 4, or with .trans those of its column l / 4. Every value here is
// distinct and the lanes' rows are permuted, so a value from the wrong row,
// column, lane or half shows.
TEST_CASE("cuda: ldmatrix, plain and transposing, gives each lane the values the PTX ISA says", "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
#if defined(ATTOGRAD_WITH_CUDA)
  for (bool transposed : {false, true}) {
    const std::vector<std::uint32_t> got = test::load_matrices_on_gpu(transposed);
    // Value c of the row that lane `giver` pointed at: row (13 giver) mod 32 holds r * 8 + c.
    const auto value = [](int giver, int c) { return static_cast<std::uint32_t>((13 * giver) % 32 * 8 + c); };
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int g = lane / 4, t = lane % 4;
        const std::uint32_t lo = transposed ? value(8 * i + 2 * t, g) : value(8 * i + g, 2 * t);
        const std::uint32_t hi = transposed ? value(8 * i + 2 * t + 1, g) : value(8 * i + g, 2 * t + 1);
        INFO((transposed ? "transposing" : "plain") << ", lane " << lane << ", register " << i);
        REQUIRE(got[static_cast<std::size_t>(4 * lane + i)] == (lo | hi << 16));
      }
  }
#endif
}

namespace {
// Whether this build and GPU lack the sm_90a kernels (an sm_90a build on an
// sm_90 GPU, or the emulator, have them), saying so.
bool wgmma_missing() {
  if (cuda::wgmma_kernels_run(0)) return false;
  WARN("skipped: wgmma needs an sm_90a build (CMAKE_CUDA_ARCHITECTURES=90a) on an sm_90 GPU");
  return true;
}
}  // namespace

// The sm_90a product stands on cuda/wgmma.cuh's reading of the PTX ISA: the
// 128-byte swizzle of its K-major and MN-major tiles, the descriptors (which
// offset is which), each K step's start and the accumulators' layout. One
// warpgroup's 64 x 256 x 64 product, in each pair of operand layouts, on
// values whose every product and sum is exact in float32, so C must be A B to
// the bit. The emulator decodes descriptors by the same reading; on a GPU
// (an sm_90a build on an H100 or H200) this is the check of it.
#if defined(ATTOGRAD_WITH_CUDA)
namespace {
// Where one product's single 1 lands: A[r][k] = 1 and B^T[c][k] = 1 make C[r][c] = 1, and a
// misread layout puts it elsewhere (or nowhere): the line a failed probe prints, to say which
// part of the reading is wrong in one GPU window.
std::string one_hot_landing(bool a_mn_major, bool b_mn_major, int r, int k, int c) {
  std::vector<float> a(64 * 64), bt(256 * 64);
  a[static_cast<std::size_t>(r * 64 + k)] = 1.0f;
  bt[static_cast<std::size_t>(c * 64 + k)] = 1.0f;
  const std::vector<float> got = test::warpgroup_product_bf16_on_gpu(a, bt, a_mn_major, b_mn_major);
  std::string at;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != 0.0f) at += fmt::format(" C[{}][{}] = {}", i / 256, i % 256, got[i]);
  return fmt::format("A[{}][{}] = B^T[{}][{}] = 1 (C[{}][{}] = 1 expected):{}", r, k, c, k, r, c,
                     at.empty() ? " all zero" : at);
}
}  // namespace
#endif

TEST_CASE("cuda: the warpgroup product (wgmma) follows cuda/wgmma.cuh's tiles and accumulator layout",
          "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
#if defined(ATTOGRAD_WITH_CUDA)
  if (wgmma_missing()) return;
  constexpr int n = 256, k = 64;
  std::vector<float> a(64 * k), bt(n * k);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i * 7 % 23) - 11) / 8;
  for (std::size_t i = 0; i < bt.size(); ++i) bt[i] = static_cast<float>(static_cast<int>(i * 5 % 19) - 9) / 8;
  for (bool a_mn_major : {false, true})
    for (bool b_mn_major : {false, true}) {
      INFO("A " << (a_mn_major ? "MN" : "K") << "-major, B " << (b_mn_major ? "MN" : "K") << "-major");
      const std::vector<float> got = test::warpgroup_product_bf16_on_gpu(a, bt, a_mn_major, b_mn_major);
      int wrong = 0;
      std::string first;
      for (int i = 0; i < 64; ++i)
        for (int j = 0; j < n; ++j) {
          double want = 0;
          for (int kk = 0; kk < k; ++kk) want += static_cast<double>(a[i * k + kk]) * bt[j * k + kk];
          const float value = got[static_cast<std::size_t>(i * n + j)];
          if (value != want && wrong++ == 0) first = fmt::format("C[{}][{}] = {}, A B = {}", i, j, value, want);
        }
      if (wrong > 0) {  // where single values land: rows, k within and across steps, columns within and across 8
        for (const auto [r, kk, c] : {std::array{0, 0, 0}, {1, 0, 0}, {8, 0, 0}, {16, 0, 0}, {0, 1, 0}, {0, 8, 0},
                                      {0, 16, 0}, {0, 0, 1}, {0, 0, 8}, {0, 0, 64}, {0, 0, 128}, {37, 45, 201}})
          WARN(one_hot_landing(a_mn_major, b_mn_major, r, kk, c));
      }
      INFO(wrong << " of C's values wrong, the first " << first);
      REQUIRE(wrong == 0);
    }
#endif
}

// The sm_90a product's TMA copies stand on cuda/tma.cuh's reading of the
// ISA: a box of 64 x 16 lands line after line, each line's 16-byte chunk c at
// chunk c ^ line % 8 (the 128-byte swizzle, as gemm_tiles::WgmmaTile lays
// tiles out), zeros where the box leaves the tensor on any side, negative
// coordinates included, in the plane its third coordinate names. The emulator
// copies by the same reading; on a GPU this is the check of it.
TEST_CASE("cuda: a TMA copy lands in the 128-byte swizzle, zeros outside the tensor", "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
#if defined(ATTOGRAD_WITH_CUDA)
  if (wgmma_missing()) return;
  constexpr std::int64_t width = 60, lines = 40, ld = 64, plane = ld * 48;
  std::vector<std::uint16_t> tensor(static_cast<std::size_t>(2 * plane));
  for (std::size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<std::uint16_t>(i + 1);
  for (const auto [x, y, z] : {std::array{0, 0, 0}, {-8, 30, 1}, {8, -3, 1}}) {
    INFO("the box at (" << x << ", " << y << ", " << z << ")");
    const std::vector<std::uint16_t> got = test::tma_box_on_gpu(tensor, {width, lines, 2}, ld, plane, x, y, z);
    int wrong = 0;
    std::string first;
    for (int line = 0; line < 16; ++line)
      for (int i = 0; i < 64; ++i) {
        const std::int64_t tx = x + i, ty = y + line;
        const std::uint16_t want =
            tx >= 0 && tx < width && ty >= 0 && ty < lines ? tensor[static_cast<std::size_t>(z * plane + ty * ld + tx)] : 0;
        const std::uint16_t value = got[static_cast<std::size_t>(line * 64 + ((i / 8) ^ line % 8) * 8 + i % 8)];
        if (value != want && wrong++ == 0)
          first = fmt::format("line {} value {}: {} where {} was expected", line, i, value, want);
      }
    INFO(wrong << " of the box's values wrong, the first " << first);
    REQUIRE(wrong == 0);
  }
#endif
}

namespace {

// A bfloat16 operand of `sizes`, normal values rounded, laid out row-major or
// transposed (its last two dims swapped in memory).
Tensor bf16_operand(const Shape& sizes, bool transposed, std::uint64_t seed) {
  Shape stored = sizes;
  if (transposed) std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
  const Tensor base = kernels::cast(input(stored, DType::f32, Layout::contiguous, seed), DType::bf16);
  if (!transposed) return base;
  Shape strides = base.strides();
  std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  return make_view(base, sizes, strides, 0);
}

void require_bf16_product(const Tensor& got_gpu, const Tensor& a, const Tensor& b, const Tensor& bias,
                          const std::string& what) {
  INFO(what);
  REQUIRE(got_gpu.device().is_cuda());
  REQUIRE(got_gpu.dtype() == DType::bf16);
  std::string where;
  const bool within = within_product_bound(on_cpu(got_gpu), a, b, where, bias);
  INFO(where);
  REQUIRE(within);
}

// Each case's product on the GPU, with A and B each as they are and transposed in memory.
void require_bf16_products_in_every_layout(const std::vector<MatmulCase>& cases, std::uint64_t seed) {
  for (const MatmulCase& c : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = bf16_operand(c.a, ta, seed), b = bf16_operand(c.b, tb, seed + 1);
        require_bf16_product(kernels::matmul(on_gpu(a), on_gpu(b)), a, b, Tensor(),
                             fmt::format("bfloat16 matmul {} {} @ {} {}", shape_str(c.a), ta ? "(transposed)" : "",
                                         shape_str(c.b), tb ? "(transposed)" : ""));
      }
}

}  // namespace

// Against float64 within bfloat16's bound (tests/helpers.h), as the CPU's
// bfloat16 kernels are: the sums' order on the tensor cores is theirs.
// Partial tiles on every edge, K below, at and past the 32 of a tile, both
// tile sizes (batches of one partial 128 x 128 tile, twice as many as the SMs;
// big_kernel_side()'s square from K = 36, which leaves the pipelined kernel
// all but the layout with neither operand's k fastest, has 128 x 128 tiles
// wholly inside, whose first 32 of K take TileFetcher's loads without bounds), broadcast batches,
// K = 0, offset operands that cannot take 16-byte loads, and a bias added
// before the one rounding.
TEST_CASE("cuda: bfloat16 matmul is within bfloat16's bound of float64: odd sizes, transposes, batches, bias",
          "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  const std::int64_t side = big_kernel_side(), batches = big_kernel_tiles();
  const std::vector<MatmulCase> cases{
      {{1, 1}, {1, 1}},         {{5, 7}, {7, 11}},          {{13, 1}, {1, 3}},        {{64, 64}, {64, 64}},
      {{37, 70}, {70, 45}},     {{127, 129}, {129, 131}},   {{300, 200}, {200, 150}}, {{2, 3, 5, 7}, {3, 7, 11}},
      {{4, 1, 5, 8}, {1, 6, 8, 12}}, {{3, 0}, {0, 4}},  {{batches, 20, 33}, {33, 40}}, {{side, 36}, {36, side}}};
  require_bf16_products_in_every_layout(cases, 50);
  const Tensor wide = bf16_operand({33, 20}, false, 52);
  const Tensor a = make_view(wide, {33, 17}, wide.strides(), 1);  // 2 bytes past a 16-byte boundary
  const Tensor b = bf16_operand({17, 9}, false, 53), bias = kernels::cast(input({9}, DType::f32, Layout::contiguous, 54), DType::bf16);
  require_bf16_product(kernels::matmul(on_gpu(a), on_gpu(b), on_gpu(bias)), a, b, bias,
                       "bfloat16 matmul of an offset view, with a bias");
}

namespace {

// The shapes of the products the pipelined kernels take, in every layout, then
// with a bias (A as it is, B transposed) at K = bias_k (whole) and 1000 (in slices).
void require_pipelined_products(std::uint64_t seed, std::int64_t bias_k, const char* kernel) {
  const std::vector<MatmulCase> cases{{{296, 8}, {8, 600}},       {{296, 40}, {40, 600}},    {{296, 64}, {64, 600}},
                                      {{296, 200}, {200, 600}},   {{136, 256}, {256, 1032}}, {{296, 24}, {24, 601}},
                                      {{2, 1, 160, 48}, {3, 48, 520}}, {{200, 1000}, {1000, 296}},
                                      {{3, 64, 800}, {800, 64}}};
  require_bf16_products_in_every_layout(cases, seed);
  for (const auto [m, k] : {std::pair<std::int64_t, std::int64_t>{296, bias_k}, {200, 1000}}) {  // 9 tiles; 6, sliced
    const Tensor a = bf16_operand({m, k}, false, seed + 1), b = bf16_operand({k, 600}, true, seed + 2);
    const Tensor bias = kernels::cast(input({600}, DType::f32, Layout::contiguous, seed + 3), DType::bf16);
    require_bf16_product(kernels::matmul(on_gpu(a), on_gpu(b), on_gpu(bias)), a, b, bias,
                         fmt::format("{} bfloat16 matmul, K = {}, with a bias", kernel, k));
  }
}

}  // namespace

// The pipelined kernel (cuda/matmul_bf16_pipelined.cu) takes products of at
// least as many 128 x 256 tiles as the GPU has SMs (8 on the emulator) whose
// operands allow 16-byte copies of whole chunks of eight. Here: partial tiles
// on both edges; K of one tile, of a ragged first tile (k below 0 zero-filled)
// and more tiles than the pipeline's stages, exact and ragged; N not a multiple of 8 (C stored value by value; the layouts with B
// as it is go to the other kernels); batches broadcast; a bias. Too few tiles over a long K take
// it over slices of K (float32 partial products, summed in slice order): 1000 in slices of 352,
// the last ragged below its slice's start; batches of one tile each.
TEST_CASE("cuda: the pipelined bfloat16 product is within bfloat16's bound: edges, ragged K, batches, bias",
          "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  require_pipelined_products(60, 72, "pipelined");
}

// The sm_90a product (cuda/matmul_bf16_wgmma.cu) takes what the pipelined
// kernel takes where it is chosen (off by default: set here): the same
// shapes, in tiles of 64 along K (one whole, one ragged tile), its tiles
// copied by cp.async.
TEST_CASE("cuda: the sm_90a bfloat16 product (wgmma, cp.async) is within bfloat16's bound in every layout: edges, "
          "ragged K, batches, split-K, bias",
          "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  if (wgmma_missing()) return;
  const cuda::ScopedWgmmaProducts wgmma(cuda::WgmmaProducts::cp_async);
  const std::int64_t before = cuda::wgmma_tma_launches();
  require_pipelined_products(64, 136, "wgmma (cp.async)");
  CHECK(cuda::wgmma_tma_launches() == before);
}

// The same with its tiles copied by TMA (cuda/matmul_bf16_wgmma_tma.cu: a
// producer warp, mbarriers, K past its end and edge rows zero-filled by the
// copies), which takes all of those shapes but the broadcast batches (those
// go to the cp.async kernel); and batches of their own A and B, in every
// layout (the copies' third dim), split-K in slices of whole tiles.
TEST_CASE("cuda: the sm_90a bfloat16 product (wgmma, TMA) is within bfloat16's bound in every layout: edges, "
          "ragged K, batches, split-K, bias",
          "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  if (wgmma_missing()) return;
  const cuda::ScopedWgmmaProducts wgmma(cuda::WgmmaProducts::tma);
  const std::int64_t before = cuda::wgmma_tma_launches();
  require_pipelined_products(66, 136, "wgmma (TMA)");
  const std::int64_t after_shared_shapes = cuda::wgmma_tma_launches();
  CHECK(after_shared_shapes > before);
  require_bf16_products_in_every_layout({{{3, 136, 72}, {3, 72, 520}}, {{2, 296, 200}, {2, 200, 264}}}, 67);
  CHECK(cuda::wgmma_tma_launches() >= after_shared_shapes + 8);  // each of the 8 products on it
}

// The MLP's products with GELU applied as C leaves the pipelined bfloat16
// kernel (its epilogues, cuda/matmul_bf16_pipelined.cu): the composed ops'
// bits on the GPU (the product, then the element-wise kernel), forward
// (linear_gelu's pre and out) and backward (matmul_gelu_grad). Shapes the
// kernel takes whole (edges on both sides, a ragged K, with a bias and
// without, N not a multiple of 8 stored value by value) and shapes it declines
// (too few tiles; K not a multiple of 8), which the dispatch composes. Where
// the sm_90a kernel runs, all again on it (its epilogues).
TEST_CASE("cuda: linear_gelu and matmul_gelu_grad in bfloat16 give the composed ops' bits", "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  struct Case {
    std::int64_t n, in, hidden;
    bool bias;
  };
  using cuda::WgmmaProducts;
  for (WgmmaProducts wgmma : {WgmmaProducts::off, WgmmaProducts::tma, WgmmaProducts::cp_async}) {
    if (wgmma != WgmmaProducts::off && !cuda::wgmma_kernels_run(0)) break;
    const cuda::ScopedWgmmaProducts chosen(wgmma);
    for (const Case& c : {Case{296, 72, 600, true}, Case{300, 40, 520, false}, Case{136, 64, 1032, true},
                          Case{296, 56, 596, true}, Case{40, 64, 96, true}, Case{296, 70, 600, true}}) {
      INFO((wgmma == WgmmaProducts::off ? "" : wgmma == WgmmaProducts::tma ? "sm_90a kernel, TMA: " : "sm_90a kernel, cp.async: ")
           << "x (" << c.n << ", " << c.in << "), weight (" << c.hidden << ", "
                                             << c.in << ")" << (c.bias ? ", a bias" : ""));
      const Tensor x = on_gpu(bf16_operand({c.n, c.in}, false, 70));
      const Tensor w = on_gpu(bf16_operand({c.hidden, c.in}, false, 71));
      const Tensor b =
          c.bias ? on_gpu(kernels::cast(input({c.hidden}, DType::f32, Layout::contiguous, 72), DType::bf16)) : Tensor();
      const kernels::LinearGelu fused = kernels::linear_gelu(x, w, b);
      const Tensor w_t = make_view(w, {c.in, c.hidden}, {1, c.in}, w.offset());
      const Tensor pre = kernels::matmul(x, w_t, b);
      require_same_bits(fused.pre, on_cpu(pre), "linear_gelu's pre");
      require_same_bits(fused.out, on_cpu(kernels::unary(kernels::Unary::gelu, pre)), "linear_gelu's out");

      // Backward through the MLP's second product: g (N, out) @ proj (out, hidden), times gelu'(pre).
      const std::int64_t out_features = c.in;
      const Tensor g = on_gpu(bf16_operand({c.n, out_features}, false, 73));
      const Tensor proj = on_gpu(bf16_operand({out_features, c.hidden}, false, 74));
      require_same_bits(kernels::matmul_gelu_grad(g, proj, fused.pre),
                        on_cpu(kernels::binary(kernels::Binary::gelu_backward, kernels::matmul(g, proj), fused.pre)),
                        "matmul_gelu_grad");
    }
  }
}

// Few output tiles over a long K (a Linear's weight gradient X^T dY): slices
// of K in float32 partial products, summed in slice order, then the bias and
// one rounding. K not a multiple of the slice, nor of 32; batches; every layout.
TEST_CASE("cuda: bfloat16 matmul over a long K with few output tiles (split-K) is within bfloat16's bound",
          "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  const std::vector<MatmulCase> cases{{{70, 1000}, {1000, 100}}, {{7, 1001}, {1001, 5}}, {{3, 9, 1500}, {1500, 6}}};
  require_bf16_products_in_every_layout(cases, 55);
  const Tensor a = bf16_operand({40, 1300}, false, 57), b = bf16_operand({1300, 70}, true, 58);
  const Tensor bias = kernels::cast(input({70}, DType::f32, Layout::contiguous, 59), DType::bf16);
  require_bf16_product(kernels::matmul(on_gpu(a), on_gpu(b), on_gpu(bias)), a, b, bias,
                       "bfloat16 matmul over slices of K, with a bias");
}

// Element-wise ops on bfloat16 CUDA tensors compute in float32 and round
// once (cuda/elementwise.cu), as the CPU's bfloat16 loops do; float32 with
// bfloat16 operands reads the bfloat16 one widened, as sums read theirs
// (cuda/reduce.cu). Correctly rounded ops (add, mul, div, a scalar's
// multiple, add_, and float32 with bfloat16 in add, sub, mul, div) give the CPU's bits; GELU, whose
// exp is CUDA's, one unit of bfloat16 at most; a sum adds in another order
// and is within bfloat16's bound of the exact one.
TEST_CASE("cuda: bfloat16 element-wise ops and sums match the CPU", "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  const Tensor a = bf16_operand({6, 9}, true, 56), b = bf16_operand({9}, false, 57);
  const Tensor wide = input({6, 9}, DType::f32, Layout::contiguous, 58);
  for (kernels::Binary op : {kernels::Binary::add, kernels::Binary::mul, kernels::Binary::div}) {
    const Tensor cpu = kernels::binary(op, a, b), gpu = kernels::binary(op, on_gpu(a), on_gpu(b));
    REQUIRE(gpu.dtype() == DType::bf16);
    CHECK(max_abs_diff(on_cpu(gpu), cpu) == 0);
  }
  // float32 with a bfloat16 operand, either side, broadcast too: the bfloat16 widened as it is read.
  for (kernels::Binary op : {kernels::Binary::add, kernels::Binary::sub, kernels::Binary::mul, kernels::Binary::div})
    for (const auto& [x, y] : {std::pair{wide, a}, std::pair{a, wide}, std::pair{wide, b}, std::pair{b, wide}}) {
      const Tensor mixed = kernels::binary(op, on_gpu(x), on_gpu(y));
      REQUIRE(mixed.dtype() == DType::f32);
      CHECK(max_abs_diff(on_cpu(mixed), kernels::binary(op, x, y)) == 0);
    }
  const Tensor scaled = kernels::unary(kernels::Unary::mul_scalar, on_gpu(a), 0.3);
  REQUIRE(scaled.dtype() == DType::bf16);
  CHECK(max_abs_diff(on_cpu(scaled), kernels::unary(kernels::Unary::mul_scalar, a, 0.3)) == 0);
  const Tensor gelu_cpu = kernels::unary(kernels::Unary::gelu, a);
  CHECK(all_close(on_cpu(kernels::unary(kernels::Unary::gelu, on_gpu(a))), gelu_cpu, 0, 2 * kBf16UnitRoundoff));
  const Tensor y = kernels::contiguous(a), y_gpu = on_gpu(y);
  kernels::add_(y, b, -0.5);
  kernels::add_(y_gpu, on_gpu(b), -0.5);
  CHECK(max_abs_diff(on_cpu(y_gpu), y) == 0);

  // Sums read bfloat16 as it is: along rows and columns, short and long (cut into
  // chunks whose float64 partials a second pass adds), each within one rounding.
  const std::pair<Tensor, int> sums[] = {{a, 0}, {a, 1}, {bf16_operand({5, 5000}, false, 59), 1},
                                         {bf16_operand({5000, 5}, false, 59), 0}};
  for (const auto& [x, dim] : sums) {
    INFO("sum over dim " << dim << " of " << x.str());
    const Tensor sum = on_cpu(kernels::sum(on_gpu(x), {dim}, false));
    REQUIRE(sum.dtype() == DType::bf16);
    const auto got = sum.to_vector<double>();
    const auto want = kernels::sum(kernels::cast(x, DType::f64), {dim}, false).to_vector<double>();
    const auto scale =
        kernels::sum(kernels::unary(kernels::Unary::abs, kernels::cast(x, DType::f64)), {dim}, false).to_vector<double>();
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= kBf16UnitRoundoff * scale[i]);
  }
}

TEST_CASE("cuda: layer_norm's bfloat16 y and dy under autocast are the float32 kernel's, rounded or widened in it",
          "[cuda][bf16]") {
  // A float32 x gives a bfloat16 y rounded as the kernel stores it, and takes
  // the bfloat16 gradient of that y widened as it reads it: the same bits as
  // the float32 kernel's y rounded afterwards, and as its dx, dw, db of the
  // widened gradient (rows of 3, 64 and 1500 values: a warp, a block per row).
  SKIP_WITHOUT_CUDA();
  for (std::int64_t n : {3, 64, 1500}) {
    INFO("rows of " << n);
    const Tensor x = on_gpu(input({5, 7, n}, DType::f32, Layout::contiguous, 60));
    const Tensor w = on_gpu(input({n}, DType::f32, Layout::contiguous, 61));
    const Tensor b = on_gpu(input({n}, DType::f32, Layout::contiguous, 62));
    const kernels::LayerNormResult rounded = kernels::layer_norm_forward(x, w, b, 1e-5, DType::bf16);
    const kernels::LayerNormResult wide = kernels::layer_norm_forward(x, w, b, 1e-5);
    REQUIRE(rounded.y.dtype() == DType::bf16);
    REQUIRE(rounded.mean.dtype() == DType::f32);
    CHECK(max_abs_diff(on_cpu(rounded.y), on_cpu(kernels::cast(wide.y, DType::bf16))) == 0);
    CHECK(max_abs_diff(on_cpu(rounded.rstd), on_cpu(wide.rstd)) == 0);

    const Tensor dy = on_gpu(kernels::cast(input({5, 7, n}, DType::f32, Layout::contiguous, 63), DType::bf16));
    for (const Tensor& weight : {w, Tensor()}) {
      const kernels::LayerNormGrads got = kernels::layer_norm_backward(dy, x, weight, wide.mean, wide.rstd);
      const kernels::LayerNormGrads want =
          kernels::layer_norm_backward(kernels::cast(dy, DType::f32), x, weight, wide.mean, wide.rstd);
      REQUIRE(got.dx.dtype() == DType::f32);
      CHECK(max_abs_diff(on_cpu(got.dx), on_cpu(want.dx)) == 0);
      CHECK(max_abs_diff(on_cpu(got.dbias), on_cpu(want.dbias)) == 0);
      CHECK(got.dweight.defined() == weight.defined());
      if (weight.defined()) CHECK(max_abs_diff(on_cpu(got.dweight), on_cpu(want.dweight)) == 0);
    }
  }
}

TEST_CASE("cuda: cross_entropy reads bfloat16 logits as the float32 kernels read the widened ones, to the bit",
          "[cuda][bf16]") {
  // The GPU's bfloat16 kernels against its float32 ones on the widened logits:
  // lse and the loss float32 and equal, the gradient the float32 one rounded.
  // Rows of 3, 65 and 1500 classes (a warp, a block per row), ignored rows.
  SKIP_WITHOUT_CUDA();
  for (std::int64_t n : {3, 65, 1500}) {
    INFO(n << " classes");
    const Tensor logits = on_gpu(kernels::cast(input({9, n}, DType::f32, Layout::contiguous, 64), DType::bf16));
    const Tensor wide = kernels::cast(logits, DType::f32);
    const Tensor targets = on_gpu(from_vector(std::vector<std::int64_t>{0, 1, n - 1, -100, 2 % n, 0, 1, -100, 0}, {9}));
    const kernels::CrossEntropyResult got = kernels::cross_entropy_forward(logits, targets, -100);
    const kernels::CrossEntropyResult want = kernels::cross_entropy_forward(wide, targets, -100);
    REQUIRE(got.lse.dtype() == DType::f32);
    REQUIRE(got.loss.dtype() == DType::f32);
    CHECK(got.count == want.count);
    CHECK(max_abs_diff(on_cpu(got.lse), on_cpu(want.lse)) == 0);
    CHECK(max_abs_diff(on_cpu(got.loss), on_cpu(want.loss)) == 0);
    const Tensor dgot = kernels::cross_entropy_backward(logits, targets, got.lse, -100, got.count, 0.75);
    const Tensor dwant = kernels::cross_entropy_backward(wide, targets, want.lse, -100, want.count, 0.75);
    REQUIRE(dgot.dtype() == DType::bf16);
    CHECK(max_abs_diff(on_cpu(dgot), on_cpu(kernels::cast(dwant, DType::bf16))) == 0);
    // Written over the logits (linear_cross_entropy's chunks), in either dtype: the same bits.
    for (const auto& [x, lse, d] : {std::tuple{logits, got.lse, dgot}, std::tuple{wide, want.lse, dwant}}) {
      const Tensor over = kernels::clone(x);
      kernels::cross_entropy_backward_(over, targets, lse, -100, got.count, 0.75);
      CHECK(max_abs_diff(on_cpu(over), on_cpu(d)) == 0);
    }
  }
}

// ---- fused row ops ------------------------------------------------------------------------------------

TEST_CASE("cuda: softmax and log_softmax match the CPU, forward and backward", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64})
    for (const Shape& shape : {Shape{7}, Shape{5, 13}, Shape{3, 4, 1500}, Shape{2, 33, 33}})
      for (Layout layout : layouts_for(shape)) {
        const Tensor x = input(shape, dtype, layout, 40);
        require_op_parity("softmax " + describe(shape, layout, dtype),
                          [](const std::vector<Tensor>& in) { return softmax(in[0], -1); }, {x});
        require_op_parity("log_softmax " + describe(shape, layout, dtype),
                          [](const std::vector<Tensor>& in) { return log_softmax(in[0], -1); }, {x});
      }
  // Masked (-inf) entries, as attention's composed path makes them.
  const Tensor x = input({4, 9}, DType::f32, Layout::contiguous, 41);
  const Tensor hidden = kernels::binary(kernels::Binary::gt, input({4, 9}, DType::f32, Layout::contiguous, 42), ones({}));
  require_op_parity("softmax with -inf entries", [hidden](const std::vector<Tensor>& in) {
    const Tensor h = in[0].device().is_cuda() ? on_gpu(hidden) : hidden;
    return softmax(masked_fill(in[0], h, -INFINITY), -1);
  }, {x});
}

TEST_CASE("cuda: layer_norm matches the CPU, forward and backward", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64})
    for (const Shape& shape : {Shape{5, 13}, Shape{2, 3, 1100}, Shape{4000, 7}})
      for (Layout layout : {Layout::contiguous, Layout::transposed}) {
        const Tensor x = input(shape, dtype, layout, 50);
        const Tensor w = input({shape.back()}, dtype, Layout::contiguous, 51);
        const Tensor b = input({shape.back()}, dtype, Layout::contiguous, 52);
        require_op_parity("layer_norm " + describe(shape, layout, dtype),
                          [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b});
        require_op_parity("layer_norm without parameters " + describe(shape, layout, dtype),
                          [](const std::vector<Tensor>& in) { return layer_norm(in[0], {}, {}); }, {x});
      }
}

TEST_CASE("cuda: cross_entropy matches the CPU, with ignored targets", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64})
    for (const auto& [rows, classes] : {std::pair<std::int64_t, std::int64_t>{37, 11}, {64, 1500}, {3, 65}}) {
      const Tensor logits = input({rows, classes}, dtype, Layout::contiguous, 60);
      std::vector<std::int64_t> t(rows);
      for (std::int64_t r = 0; r < rows; ++r) t[r] = r % 5 == 2 ? -100 : (r * 7919) % classes;
      const Tensor targets = ids_tensor(t, {rows});
      require_op_parity(fmt::format("cross_entropy ({}, {}) {}", rows, classes, dtype_name(dtype)),
                        [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); }, {logits, targets});
    }
  // Every target ignored: loss 0 and zero gradients, on both devices.
  const Tensor logits = input({4, 6}, DType::f32, Layout::contiguous, 61);
  require_op_parity("cross_entropy, all ignored", [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); },
                    {logits, ids_tensor({-100, -100, -100, -100}, {4})});
}

TEST_CASE("cuda: embedding matches the CPU, repeated ids scatter-adding", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::f64}) {
    std::vector<std::int64_t> ids(35);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * i) % 11);  // repeats
    require_op_parity(std::string("embedding ") + std::string(dtype_name(dtype)),
                      [](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); },
                      {input({11, 13}, dtype, Layout::contiguous, 70), ids_tensor(ids, {5, 7})});
  }
}

// The backward sums each row's gradients in the CPU's order from +0
// (cuda/embedding.cu): the same bits, compared as bytes (so -0 and +0 differ),
// across the one-block sort's chunks of 1024 ids and its scan's passes of 1024
// rows, with ids spread out, piled on a few rows, and absent; and one case past
// the summing kernel's grid, where its threads loop.
TEST_CASE("cuda: the embedding backward is the CPU's to the bit, and deterministic", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  struct Case {
    std::int64_t count, rows, channels;
    bool spread;  // over every row, or piled on the first 3
  };
  const Case cases[] = {{1, 1, 37, true},        {35, 11, 37, true},      {1024, 65, 37, false},
                        {1025, 1024, 37, true},  {1025, 2, 37, false},    {2048, 1023, 37, true},
                        {2500, 1500, 37, true},  {2500, 1500, 37, false}, {3000, 3, 37, true},
                        {600, 36000, 256, true}};  // 9.2M (row, channel) threads: past the grid
  for (DType dtype : {DType::f32, DType::f64})
    for (const Case& c : cases) {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(c.count));
      std::uniform_int_distribution<std::int64_t> pick(0, (c.spread ? c.rows : std::min<std::int64_t>(c.rows, 3)) - 1);
      for (auto& id : ids) id = pick(rng);
      Tensor dy = input({c.count, c.channels}, dtype, Layout::contiguous, 72);
      // A row whose only gradients are -0: +0 + -0 is +0 on the CPU, and must be on the GPU.
      ids[0] = c.rows - 1;
      for (std::size_t i = 1; i < ids.size(); ++i)
        if (ids[i] == c.rows - 1) ids[i] = 0;
      kernels::fill_(narrow(dy, 0, 0, 1), -0.0);
      const Tensor id_cpu = ids_tensor(ids, {c.count});
      const Tensor expected = kernels::embedding_backward(dy, id_cpu, c.rows);
      INFO(c.count << " ids into " << c.rows << " rows of " << c.channels << ", "
                   << (c.spread ? "spread" : "on 3 rows") << ", " << dtype_name(dtype));
      REQUIRE(same_bits(kernels::embedding_backward(on_gpu(dy), on_gpu(id_cpu), c.rows), expected));
      REQUIRE(same_bits(kernels::embedding_backward(on_gpu(dy), on_gpu(id_cpu), c.rows), expected));  // again
    }
  // No ids at all: a zero table.
  const Tensor none = kernels::embedding_backward(on_gpu(zeros({0, 4})), on_gpu(ids_tensor({}, {0})), 3);
  REQUIRE(on_cpu(none).to_vector<float>() == std::vector<float>(12, 0.0f));
}

TEST_CASE("cuda: dropout masks are the CPU's, bit for bit, in float32 and bfloat16", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (const Shape& sizes : {Shape{1}, Shape{3}, Shape{5, 7}, Shape{1001}, Shape{4, 3, 33}})
    for (double p : {0.0, 0.1, 0.5, 0.9})
      for (std::uint64_t offset : {0ull, 5ull, 123456789ull}) {
        for (DType dtype : {DType::f32, DType::bf16}) {
          const Tensor cpu = kernels::dropout_mask(sizes, p, 42, offset, {dtype});
          const Tensor gpu = kernels::dropout_mask(sizes, p, 42, offset, {dtype, Device::cuda()});
          INFO(shape_str(sizes) << " p " << p << " offset " << offset << " " << dtype_name(dtype));
          REQUIRE(gpu.dtype() == dtype);
          REQUIRE(on_cpu(gpu).to_vector<double>() == cpu.to_vector<double>());
        }
      }
  // The op: the same generator state drops the same elements on both devices.
  Generator cpu_gen(9), gpu_gen(9);
  const Tensor x = input({6, 50}, DType::f32, Layout::transposed, 71);
  const Tensor y_cpu = dropout(x, 0.3, true, cpu_gen), y_gpu = dropout(on_gpu(x), 0.3, true, gpu_gen);
  require_parity(y_gpu, y_cpu, "dropout op");
}

TEST_CASE("cuda: cat matches the CPU, forward and backward", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (int dim : {0, 1, 2}) {
    Shape s0{3, 4, 5}, s1{3, 4, 5};
    s1[dim] = 2;
    require_op_parity(fmt::format("cat along {}", dim),
                      [dim](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[0]}, dim); },
                      {input(s0, DType::f32, Layout::transposed, 80), input(s1, DType::f32, Layout::offset, 81)});
  }
}

// ---- attention ---------------------------------------------------------------------------------------

// The tensor-core attention kernels stand on cuda/mma.cuh's reading of the PTX
// ISA's m16n8k8 fragment layout: here one warp's product on known operands, so a
// wrong reading shows as itself and not as attention gone wrong. 3xTF32 must be
// float32-accurate, one TF32 product must not be.
TEST_CASE("cuda: the tensor-core product follows cuda/mma.cuh's fragment layout, in TF32 and 3xTF32", "[cuda]") {
  SKIP_WITHOUT_CUDA();
#if defined(ATTOGRAD_WITH_CUDA)
  std::vector<float> a(16 * 8), b(8 * 8);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(1.7f * static_cast<float>(i) + 0.3f);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(2.3f * static_cast<float>(i));
  const test::WarpProduct got = test::warp_product_on_gpu(a, b);
  double worst_one = 0, worst_three = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double want = 0, size = 0;  // size: the sum of |a b| over k
      for (int k = 0; k < 8; ++k) {
        want += static_cast<double>(a[i * 8 + k]) * b[k * 8 + j];
        size += std::abs(static_cast<double>(a[i * 8 + k]) * b[k * 8 + j]);
      }
      INFO("C[" << i << "][" << j << "] = " << want << ": TF32 " << got.tf32[i * 8 + j] << ", 3xTF32 "
                << got.three_tf32[i * 8 + j]);
      worst_one = std::max(worst_one, std::abs(got.tf32[i * 8 + j] - want));
      worst_three = std::max(worst_three, std::abs(got.three_tf32[i * 8 + j] - want));
      // Truncated to TF32, each operand loses up to 2^-10 of itself.
      REQUIRE(std::abs(got.tf32[i * 8 + j] - want) < 2 * 0x1p-10 * size);
      // 3xTF32 drops a_small b_small (up to 2^-20 |a b|) and rounds the small
      // parts (2^-21 each): about 2^-19 |a b| a product. The three products add
      // in float32 on the tensor core, truncated (the probe below; the emulator
      // rounds its exact sum toward zero): a few ulps more. Here that gives up to
      // 6.5e-7 (the bound is 1e-5 or more), against 1.5e-3 for one TF32 product.
      REQUIRE(std::abs(got.three_tf32[i * 8 + j] - want) < 4e-6 * size);
    }
  INFO("worst error: TF32 " << worst_one << ", 3xTF32 " << worst_three);
  CHECK(worst_one > 1e-4);
#endif
}

// How the tensor cores round a float32 sum, which the error of a long product on them rests on:
// the first GPU window's split-K product over K = 2048 on the tensor cores differed from OpenBLAS's
// by 3.2e-4 (7e-6 of the output's size), where the SIMT kernels stay within 1e-4, as truncated sums
// would do. Row 0 sums to 1 + 3/4 of float32's last place at 1 (2^-23): 1 + 2^-23 to nearest,
// 1 toward zero; row 1 is its negative; row 2 sums to 1 + 2^-23 exactly, which either keeps.
// Every operand is exact in TF32 and in bfloat16, so only the sum's rounding is seen.
TEST_CASE("cuda: the tensor cores' float32 sums round toward zero", "[cuda]") {
  SKIP_WITHOUT_CUDA();
#if defined(ATTOGRAD_WITH_CUDA)
  const float last_place = 0x1p-23f, three_quarters = 0.75f * last_place;
  const std::vector<std::pair<float, float>> rows{{1.0f, three_quarters}, {-1.0f, -three_quarters}, {1.0f, last_place}};
  const std::vector<float> truncated{1.0f, -1.0f, 1.0f + last_place};
  // A's row i holds rows[i] in columns 0 and 1 (zeros elsewhere), B is all ones: C[i][j] = the pair's sum.
  const auto operands = [&](int k) {
    std::vector<float> a(16 * k, 0.0f), b(k * 8, 1.0f);
    for (std::size_t i = 0; i < rows.size(); ++i) a[i * k] = rows[i].first, a[i * k + 1] = rows[i].second;
    return std::pair{a, b};
  };
  const auto [a8, b8] = operands(8);
  const test::WarpProduct tf32 = test::warp_product_on_gpu(a8, b8);
  const auto [a16, b16] = operands(16);
  const std::vector<float> bf16 = test::warp_product_bf16_on_gpu(a16, b16);
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (int j = 0; j < 8; ++j) {
      INFO("row " << i << ", column " << j << ": TF32 " << tf32.tf32[i * 8 + j] << ", 3xTF32 " << tf32.three_tf32[i * 8 + j]
                  << ", bfloat16 " << bf16[i * 8 + j] << ", want " << truncated[i]);
      CHECK(tf32.tf32[i * 8 + j] == truncated[i]);
      CHECK(tf32.three_tf32[i * 8 + j] == truncated[i]);
      CHECK(bf16[i * 8 + j] == truncated[i]);
    }
#endif
}

namespace {

// An attention mask (B, 1, 1, Tk) by which batch b hides its first b keys and its last 2b.
Tensor ends_hidden(std::int64_t B, std::int64_t Tk) {
  Tensor mask = empty({B, 1, 1, Tk}, {DType::b8});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < Tk; ++j) mask.data<bool>()[b * Tk + j] = j < b || j >= Tk - 2 * b;
  return mask;
}

// The fused attention's options for a training run on like's device: the mask
// (on the CPU, or undefined for none) moved there, dropout drawn from gen.
AttentionOptions fused_options(bool causal, double dropout, const Tensor& mask, const Tensor& like, Generator& gen) {
  const bool gpu = like.device().is_cuda();
  return {.causal = causal,
          .mask = mask.defined() && gpu ? on_gpu(mask) : mask,
          .dropout_p = dropout,
          .training = true,
          .generator = &gen,
          .impl = AttentionImpl::fused};
}

}  // namespace

TEST_CASE("cuda: fused attention matches the CPU, forward and backward", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  struct Case {
    std::int64_t B, H, Tq, Tk, D;
    bool causal;
    double dropout;
    bool mask;
  };
  const std::vector<Case> cases{
      {1, 1, 1, 1, 1, false, 0, false},
      {2, 3, 5, 5, 7, true, 0, false},
      {2, 2, 37, 37, 32, true, 0, false},
      {1, 2, 64, 64, 64, true, 0, false},
      {2, 1, 33, 70, 13, false, 0, true},
      {1, 1, 130, 130, 128, true, 0, false},
      {1, 2, 17, 17, 100, true, 0.2, false},
      {2, 2, 40, 24, 16, true, 0.1, true},
      // Head dim 64 over several query blocks and key tiles of both kernel sets, with every option on.
      {2, 2, 150, 150, 64, true, 0.1, true}};
  for_each_kernel_set(cuda::KernelOp::attention, [&] {
    for (const Case& c : cases) {
      const std::string what = fmt::format("attention ({}) B={} H={} Tq={} Tk={} D={} causal={} dropout={} mask={}",
                                           cuda::kernel_set_name(cuda::kernel_set(cuda::KernelOp::attention)), c.B, c.H,
                                           c.Tq, c.Tk, c.D, c.causal, c.dropout, c.mask);
      // q as multi-head attention makes it: a (B, T, H, D) tensor seen as (B, H, T, D).
      const Tensor q_bthd = input({c.B, c.Tq, c.H, c.D}, DType::f32, Layout::contiguous, 90);
      const Tensor q = make_view(q_bthd, {c.B, c.H, c.Tq, c.D}, {c.Tq * c.H * c.D, c.D, c.H * c.D, 1}, 0);
      const Tensor k = input({c.B, c.H, c.Tk, c.D}, DType::f32, Layout::contiguous, 91);
      const Tensor v = input({c.B, c.H, c.Tk, c.D}, DType::f32, Layout::offset, 92);
      // With causal on, query 0 of batch 1 sees no key at all (a zero row, zero gradients).
      const Tensor mask = c.mask ? ends_hidden(c.B, c.Tk) : Tensor();
      for (bool weights : {false, true}) {
        std::vector<Tensor> returned_weights;  // cpu's, then gpu's
        require_op_parity(what + (weights ? " with weights" : ""),
                          [&](const std::vector<Tensor>& in) {
                            Generator gen(1234);  // the same dropout stream on each device
                            AttentionOptions o = fused_options(c.causal, c.dropout, mask, in[0], gen);
                            o.return_weights = weights;
                            const AttentionOutput r = attention(in[0], in[1], in[2], o);
                            returned_weights.push_back(r.weights);
                            return r.out;
                          },
                          {q, k, v});
        if (weights) require_parity(returned_weights[1], returned_weights[0], what + " weights");
      }
    }
  });
}

// The float32 forward and backward in FlashAttention-2's shape (3xTF32,
// cuda/attention_tf32_flash.cu and attention_tf32_flash_backward.cu) take the
// tensor-core set's problems at head sizes 32 and 64 whose rows are 16-byte
// aligned (contiguous ones here; the test above's offset v goes to the general
// kernels); the backward reads the forward's log-sum-exp, so a wrong lse shows
// in the gradients, and its key blocks add their parts of dQ in turn (a wrong
// turn stops the emulator). Cases: several query
// blocks (128) and key tiles (64), ragged; Tq != Tk both ways, causal or not;
// causal with Tk > Tq (key tiles no query sees); a mask with a row of hidden
// keys; dropout (Tk a multiple of 4: a Philox draw for four weights), with
// the mask; heads interleaved in memory (a (B, T, H, D) tensor seen as (B, H,
// T, D)). Within float32's parity bound, which one TF32 product alone exceeds.
TEST_CASE("cuda: the float32 flash attention (3xTF32) matches the CPU, forward and backward: blocks, ragged tiles, mask, dropout",
          "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const cuda::ScopedKernelSet tensor_cores(cuda::KernelOp::attention, cuda::KernelSet::tensor_core);
  struct Case {
    std::int64_t B, H, Tq, Tk, D;
    bool causal;
    double dropout;
    bool mask, interleaved;
  };
  const std::vector<Case> cases{
      {1, 2, 300, 300, 64, true, 0, false, false},  {1, 1, 200, 330, 64, false, 0, false, false},
      {2, 1, 150, 70, 64, true, 0, false, false},   {1, 1, 70, 200, 64, true, 0, false, false},
      {1, 1, 1, 1, 64, false, 0, false, false},     {1, 2, 150, 152, 64, true, 0.1, true, false},
      {2, 2, 130, 130, 64, true, 0, false, true},   {1, 2, 300, 300, 32, true, 0, false, false},
      {2, 1, 130, 76, 32, false, 0.2, true, false}, {2, 1, 100, 100, 64, false, 0.2, false, false},
      {1, 1, 40, 77, 32, true, 0.3, false, false},  // odd Tk: dropout in the general kernel
  };
  for (const Case& c : cases) {
    const std::string what = fmt::format("float32 flash attention B={} H={} Tq={} Tk={} D={} causal={} dropout={} "
                                         "mask={} interleaved={}",
                                         c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.dropout, c.mask, c.interleaved);
    Tensor q = input({c.B, c.H, c.Tq, c.D}, DType::f32, Layout::contiguous, 96);
    if (c.interleaved) {
      const Tensor q_bthd = input({c.B, c.Tq, c.H, c.D}, DType::f32, Layout::contiguous, 96);
      q = make_view(q_bthd, {c.B, c.H, c.Tq, c.D}, {c.Tq * c.H * c.D, c.D, c.H * c.D, 1}, 0);
    }
    const Tensor k = input({c.B, c.H, c.Tk, c.D}, DType::f32, Layout::contiguous, 97);
    const Tensor v = input({c.B, c.H, c.Tk, c.D}, DType::f32, Layout::contiguous, 98);
    const Tensor mask = c.mask ? ends_hidden(c.B, c.Tk) : Tensor();
    require_op_parity(what,
                      [&](const std::vector<Tensor>& in) {
                        Generator gen(4321);  // the same dropout stream on each device
                        return attention(in[0], in[1], in[2], fused_options(c.causal, c.dropout, mask, in[0], gen)).out;
                      },
                      {q, k, v});
  }
}

// The float32 flash backward sums each query tile's dQ over its key blocks in
// their order, not by atomics: two runs give the same bits (on a GPU, where
// blocks run at once; the emulator runs them in turn).
TEST_CASE("cuda: the float32 flash attention backward gives the same bits on every run", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const cuda::ScopedKernelSet tensor_cores(cuda::KernelOp::attention, cuda::KernelSet::tensor_core);
  Tensor q = on_gpu(input({2, 2, 200, 64}, DType::f32, Layout::contiguous, 99));
  Tensor k = on_gpu(input({2, 2, 260, 64}, DType::f32, Layout::contiguous, 100));
  Tensor v = on_gpu(input({2, 2, 260, 64}, DType::f32, Layout::contiguous, 101));
  const Tensor projection = on_gpu(input({2, 2, 200, 64}, DType::f32, Layout::contiguous, 102));
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    for (Tensor* x : {&q, &k, &v}) x->set_requires_grad(true), x->set_grad({});
    backward(attention(q, k, v, {.impl = AttentionImpl::fused}).out, projection);
    std::vector<double> bits;
    for (const Tensor* x : {&q, &k, &v}) {
      const std::vector<double> grad = on_cpu(x->grad()).to_vector<double>();
      bits.insert(bits.end(), grad.begin(), grad.end());
    }
    runs.push_back(bits);
  }
  REQUIRE(runs[0] == runs[1]);
}

// MultiHeadAttention's packed self-attention as the CPU runs it where its
// float32 kernel writes the heads (linear_heads, then attention_packed on a
// (B, 3, H, T, D) qkv): on the GPU linear_heads is the product and a copy into
// place, and the attention reads the same views; both must match the CPU.
TEST_CASE("cuda: linear_heads and attention_packed on its (B, 3, H, T, D) layout match the CPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const std::int64_t B = 2, T = 37, C = 128, H = 2;
  // Weights scaled as nn::Linear's are (by 1/sqrt(C)): with N(0, 1) ones q.k runs to the hundreds, the
  // softmax saturates, and the devices' float32 sums part by 1e-3 on (B, T, 3C) and (B, 3, H, T, D) alike.
  const Tensor x = input({B, T, C}, DType::f32, Layout::contiguous, 93);
  const Tensor w = mul(input({3 * C, C}, DType::f32, Layout::contiguous, 94), 1.0 / std::sqrt(double(C))).detach();
  const Tensor b = input({3 * C}, DType::f32, Layout::contiguous, 95);
  require_op_parity(
      "linear_heads", [&](const std::vector<Tensor>& in) { return linear_heads(in[0], in[1], in[2], 3, H); },
      {x, w, b});
  for_each_kernel_set(cuda::KernelOp::attention, [&] {
    require_op_parity(
        "linear_heads then attention_packed",
        [&](const std::vector<Tensor>& in) {
          return attention_packed(linear_heads(in[0], in[1], in[2], 3, H), H,
                                  {.causal = true, .impl = AttentionImpl::fused})
              .out;
        },
        {x, w, b});
  });
}

TEST_CASE("cuda: fused attention equals the composed reference on the GPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  const Tensor q = to(randn({2, 3, 29, 24}), Device::cuda()).set_requires_grad(true);
  const Tensor k = to(randn({2, 3, 29, 24}), Device::cuda()).set_requires_grad(true);
  const Tensor v = to(randn({2, 3, 29, 24}), Device::cuda()).set_requires_grad(true);
  for_each_kernel_set(cuda::KernelOp::attention, [&] {
    std::vector<Tensor> outs, grads;
    for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
      Generator gen(5);
      const Tensor out = attention(q, k, v, {.causal = true, .dropout_p = 0.25, .generator = &gen, .impl = impl}).out;
      for (const Tensor* t : {&q, &k, &v}) t->set_grad({});
      backward(sum(mul(out, out)));
      outs.push_back(on_cpu(out));
      for (const Tensor* t : {&q, &k, &v}) grads.push_back(on_cpu(t->grad()));
    }
    const Tolerance tol = parity(DType::f32);
    REQUIRE(all_close(outs[0], outs[1], tol.atol, tol.rtol));
    for (int i = 0; i < 3; ++i) {
      INFO("grad " << i << ": max diff " << max_abs_diff(grads[i], grads[3 + i]));
      REQUIRE(all_close(grads[i], grads[3 + i], tol.atol, tol.rtol));
    }
  });
}

// A NaN score once made the lanes of a warp disagree on a row's max (a NaN-skipping max answers by
// order), so some lanes skipped the row's shuffles while others made them. Now a NaN wins the max:
// the GPU's NaN pattern must be the CPU's, a NaN key poisoning the queries that see it and a NaN
// query its own row, and nothing else.
TEST_CASE("cuda: fused attention with NaN inputs gives the CPU's NaNs", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for_each_kernel_set(cuda::KernelOp::attention, [] {
    for (bool causal : {true, false}) {
      Tensor q = kernels::clone(randn({1, 2, 70, 32})), k = kernels::clone(randn({1, 2, 70, 32}));
      const Tensor v = randn({1, 2, 70, 32});
      k.data<float>()[5 * 32 + 3] = std::nanf("");          // head 0, key 5
      q.data<float>()[(70 + 40) * 32 + 7] = std::nanf("");  // head 1, query 40
      const AttentionOptions o{.causal = causal, .impl = AttentionImpl::fused};
      const Tensor cpu = attention(q, k, v, o).out;
      const Tensor gpu = on_cpu(attention(on_gpu(q), on_gpu(k), on_gpu(v), o).out);
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 70; ++i) {
          INFO("causal " << causal << " head " << h << " query " << i);
          const bool expected = h == 0 ? (!causal || i >= 5) : i == 40;
          REQUIRE(std::isnan(cpu.at({0, h, i, 0})) == expected);
          REQUIRE(std::isnan(gpu.at({0, h, i, 0})) == expected);
          REQUIRE(std::isnan(gpu.at({0, h, i, 31})) == expected);
        }
    }
  });
}

// ---- optimizer and a training step -------------------------------------------------------------------

TEST_CASE("cuda: fused AdamW steps match the CPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (const Shape& shape : {Shape{1000}, Shape{13, 7}}) {
    const Tensor p = input(shape, DType::f32, Layout::contiguous, 100);
    const Tensor m = zeros(shape), v = zeros(shape);
    const Tensor pg = on_gpu(p), mg = on_gpu(m), vg = on_gpu(v);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = input(shape, DType::f32, Layout::contiguous, 100 + step);
      const kernels::AdamWStep s{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .step = step};
      kernels::adamw_step_(p, grad, m, v, s);
      kernels::adamw_step_(pg, on_gpu(grad), mg, vg, s);
    }
    require_parity(pg, p, "adamw param " + shape_str(shape));
    require_parity(mg, m, "adamw exp_avg " + shape_str(shape));
    require_parity(vg, v, "adamw exp_avg_sq " + shape_str(shape));
  }
}

// Clipping's passes over many gradients: 40 tensors (two launches of up to 32),
// empty ones, one past the 256 blocks a tensor's sum takes; the sum within
// float64's rounding of the CPU's (another order), the same bits each call;
// the scale the CPU's bits.
TEST_CASE("cuda: sum_of_squares and scale_ over many tensors match the CPU", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  std::vector<Tensor> cpu, gpu;
  for (int k = 0; k < 40; ++k) {
    const std::int64_t n = k % 9 == 0 ? 0 : k == 5 ? 70001 : 1 + k * 37;
    cpu.push_back(input({n}, DType::f32, Layout::contiguous, 300 + static_cast<std::uint64_t>(k)));
    gpu.push_back(on_gpu(cpu.back()));
  }
  const double want = kernels::sum_of_squares(cpu), got = kernels::sum_of_squares(gpu);
  CHECK(std::abs(got - want) <= 1e-13 * want);
  const double again = kernels::sum_of_squares(gpu);
  CHECK(std::memcmp(&got, &again, sizeof got) == 0);
  kernels::scale_(cpu, 0.37);
  kernels::scale_(gpu, 0.37);
  for (std::size_t k = 0; k < cpu.size(); ++k) require_same_bits(gpu[k], cpu[k], fmt::format("scale_ of tensor {}", k));
}

// 40 parameters take two launches of up to 32; empty ones get no blocks, and
// some go without weight decay. Each must come out as its own one-parameter
// update on the GPU makes it (to the bit: the same arithmetic), and as the CPU's.
TEST_CASE("cuda: AdamW over many parameters in one call equals each updated alone", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  struct Param {
    Tensor p, m, v;
  };
  std::vector<Param> cpu, together, alone;
  std::vector<bool> decay;
  for (int i = 0; i < 40; ++i) {
    const Shape shape = i % 13 == 5 ? Shape{0} : Shape{1 + (i * 37) % 300, 1 + i % 3};
    const Tensor p = input(shape, DType::f32, Layout::contiguous, 200 + i);
    cpu.push_back({p, zeros(shape), zeros(shape)});
    together.push_back({on_gpu(p), on_gpu(zeros(shape)), on_gpu(zeros(shape))});
    alone.push_back({on_gpu(p), on_gpu(zeros(shape)), on_gpu(zeros(shape))});
    decay.push_back(i % 4 != 1);
  }
  const kernels::AdamWStep base{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  for (std::int64_t step = 1; step <= 3; ++step) {
    kernels::AdamWStep s = base;
    s.step = step;
    std::vector<kernels::AdamWParameter> on_cpu_list, on_gpu_list;
    for (int i = 0; i < 40; ++i) {
      const Tensor grad = input(cpu[i].p.sizes(), DType::f32, Layout::contiguous, 300 + 40 * step + i);
      on_cpu_list.push_back({cpu[i].p, grad, cpu[i].m, cpu[i].v, decay[i]});
      on_gpu_list.push_back({together[i].p, on_gpu(grad), together[i].m, together[i].v, decay[i]});
      kernels::AdamWStep own = s;
      if (!decay[i]) own.weight_decay = 0;
      kernels::adamw_step_(alone[i].p, on_gpu(grad), alone[i].m, alone[i].v, own);
    }
    kernels::adamw_step_(on_cpu_list, s);
    kernels::adamw_step_(on_gpu_list, s);
  }
  for (int i = 0; i < 40; ++i) {
    INFO("parameter " << i << " " << shape_str(cpu[i].p.sizes()) << (decay[i] ? "" : ", no weight decay"));
    CHECK(max_abs_diff(on_cpu(together[i].p), on_cpu(alone[i].p)) == 0);
    CHECK(max_abs_diff(on_cpu(together[i].m), on_cpu(alone[i].m)) == 0);
    CHECK(max_abs_diff(on_cpu(together[i].v), on_cpu(alone[i].v)) == 0);
    require_parity(together[i].p, cpu[i].p, "adamw param");
    require_parity(together[i].v, cpu[i].v, "adamw exp_avg_sq");
  }
}

// Once on the CUDA cores, once with attention and matmul on the tensor cores.
TEST_CASE("cuda: a GPT training step on the GPU equals the CPU step", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  for (cuda::KernelSet k : {cuda::KernelSet::simt, cuda::KernelSet::tensor_core})
    for (double dropout : {0.0, 0.1}) {
      const cuda::ScopedKernelSet attention(cuda::KernelOp::attention, k), matmul(cuda::KernelOp::matmul, k);
      INFO("attention and matmul kernels: " << cuda::kernel_set_name(k));
      nn::GPTConfig config;
      config.vocab_size = 65, config.block_size = 32, config.n_layer = 2, config.n_head = 4, config.n_embd = 64;
      config.dropout = dropout;
      nn::GPT cpu_model(config), gpu_model(config);  // same seed: same weights
      gpu_model.to(Device::cuda());
      Generator gen(77);
      const Tensor tokens = kernels::cast(
          kernels::unary(kernels::Unary::mul_scalar, rand({8, 32}, {DType::f64}, gen), 64.99), DType::i64);
      const Tensor targets = kernels::cast(
          kernels::unary(kernels::Unary::mul_scalar, rand({8, 32}, {DType::f64}, gen), 64.99), DType::i64);
      // eps well above float32's rounding of near-zero gradients: a gradient of
      // 1e-9 on one device and -1e-9 on the other must not move a weight by 2 lr.
      const train::optim::AdamWOptions adamw{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-4, .weight_decay = 0.1};
      train::optim::AdamW cpu_opt(cpu_model.named_parameters(), adamw), gpu_opt(gpu_model.named_parameters(), adamw);

      const Tensor cpu_loss = cpu_model.loss(tokens, targets);
      const Tensor gpu_loss = gpu_model.loss(to(tokens, Device::cuda()), to(targets, Device::cuda()));
      require_parity(gpu_loss, cpu_loss, fmt::format("loss (dropout {})", dropout));
      backward(cpu_loss);
      backward(gpu_loss);
      const auto cpu_params = cpu_model.named_parameters(), gpu_params = gpu_model.named_parameters();
      REQUIRE(cpu_params.size() == gpu_params.size());
      for (std::size_t i = 0; i < cpu_params.size(); ++i)
        require_parity(gpu_params[i].tensor.grad(), cpu_params[i].tensor.grad(), "grad of " + cpu_params[i].name);
      cpu_opt.step();
      gpu_opt.step();
      for (std::size_t i = 0; i < cpu_params.size(); ++i)
        require_parity(gpu_params[i].tensor, cpu_params[i].tensor, "after the step: " + cpu_params[i].name);
    }
}

// Under autocast the GPU's step is the CPU's but for the order of the
// products' float32 sums, which moves a bfloat16 result by one unit where a
// sum sits near a rounding boundary. So the two agree to about bfloat16's
// precision, not float32's: the loss within 2^-8 of itself, each gradient
// within 2^-6 (four units of roundoff) of its norm.
TEST_CASE("cuda: a bfloat16 autocast GPT step on the GPU matches the CPU's", "[cuda][bf16]") {
  SKIP_WITHOUT_CUDA();
  nn::GPTConfig config;
  config.vocab_size = 65, config.block_size = 32, config.n_layer = 2, config.n_head = 4, config.n_embd = 64;
  nn::GPT cpu_model(config), gpu_model(config);  // same seed: same weights
  gpu_model.to(Device::cuda());
  Generator gen(78);
  const auto ids = [&gen] {
    return kernels::cast(kernels::unary(kernels::Unary::mul_scalar, rand({8, 32}, {DType::f64}, gen), 64.99),
                         DType::i64);
  };
  const Tensor tokens = ids(), targets = ids();
  Tensor cpu_loss, gpu_loss;
  {
    const AutocastGuard autocast(DType::bf16);
    cpu_loss = cpu_model.loss(tokens, targets);
    gpu_loss = gpu_model.loss(to(tokens, Device::cuda()), to(targets, Device::cuda()));
  }
  REQUIRE(gpu_loss.dtype() == DType::f32);
  const double cpu_value = cpu_loss.item(), gpu_value = on_cpu(gpu_loss).item();
  INFO("loss: cpu " << cpu_value << ", gpu " << gpu_value);
  REQUIRE(std::abs(gpu_value - cpu_value) <= kBf16UnitRoundoff * std::abs(cpu_value));
  backward(cpu_loss);
  backward(gpu_loss);
  const auto cpu_params = cpu_model.named_parameters(), gpu_params = gpu_model.named_parameters();
  for (std::size_t i = 0; i < cpu_params.size(); ++i) {
    const Tensor want = cpu_params[i].tensor.grad(), got = on_cpu(gpu_params[i].tensor.grad());
    REQUIRE(got.dtype() == DType::f32);  // float32 master gradients
    const auto w = want.to_vector<double>(), g = got.to_vector<double>();
    double diff = 0, norm = 0;
    for (std::size_t j = 0; j < w.size(); ++j) diff += (g[j] - w[j]) * (g[j] - w[j]), norm += w[j] * w[j];
    INFO("grad of " << cpu_params[i].name << ": |gpu - cpu| " << std::sqrt(diff) << ", |cpu| " << std::sqrt(norm));
    CHECK(std::sqrt(diff) <= 4 * kBf16UnitRoundoff * std::sqrt(norm));
  }
}

// No kernel adds floats in an order that depends on timing (the embedding
// backward was the last to use atomics): a GPU run repeats itself to the bit.
TEST_CASE("cuda: two GPU training runs of one seed give the same bits, dropout on", "[cuda]") {
  SKIP_WITHOUT_CUDA();
  nn::GPTConfig config;
  config.vocab_size = 65, config.block_size = 32, config.n_layer = 2, config.n_head = 4, config.n_embd = 64;
  config.dropout = 0.1;
  const auto train_three_steps = [&config] {
    nn::GPT model(config);
    model.to(Device::cuda());
    train::optim::AdamW opt(model.named_parameters(), {.lr = 1e-3});
    Generator gen(78);
    for (int step = 0; step < 3; ++step) {
      const Tensor tokens = kernels::cast(
          kernels::unary(kernels::Unary::mul_scalar, rand({8, 32}, {DType::f64}, gen), 64.99), DType::i64);
      opt.zero_grad();
      backward(model.loss(to(tokens, Device::cuda()), to(tokens, Device::cuda())));
      opt.step();
    }
    std::vector<std::vector<float>> values;
    for (const auto& p : model.named_parameters()) values.push_back(on_cpu(p.tensor).to_vector<float>());
    return values;
  };
  const auto first = train_three_steps(), second = train_three_steps();
  REQUIRE(first.size() == second.size());
  for (std::size_t i = 0; i < first.size(); ++i) REQUIRE(first[i] == second[i]);
}
