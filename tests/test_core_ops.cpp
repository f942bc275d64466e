// Views, reductions and matmul: known values and float64 gradchecks on odd,
// transposed and broadcast shapes.
#include <cstring>

#include "helpers.h"
#include "cpu/gelu_rows.h"
#include "cpu/linear_heads.h"
#include "cpu/matmul_f32/sgemm.h"
#include "cpu/vec_transpose.h"
#include "cpu/parallel.h"

using namespace attograd;
using namespace attograd::test;

namespace {
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
}

TEST_CASE("gradcheck view ops", "[views][gradcheck]") {
  REQUIRE_GRADCHECK("view", Fn([](const std::vector<Tensor>& x) { return view(x[0], {7, 5}); }), {leaf({5, 7})});
  REQUIRE_GRADCHECK("reshape", Fn([](const std::vector<Tensor>& x) { return reshape(x[0], {35}) * 2.0; }),
                    {transposed_leaf({5, 7})});
  REQUIRE_GRADCHECK("transpose", Fn([](const std::vector<Tensor>& x) { return transpose(x[0], 0, 2); }),
                    {leaf({3, 5, 7})});
  REQUIRE_GRADCHECK("permute", Fn([](const std::vector<Tensor>& x) { return permute(x[0], {1, 2, 0}); }),
                    {leaf({3, 5, 7})});
  REQUIRE_GRADCHECK("narrow", Fn([](const std::vector<Tensor>& x) { return narrow(x[0], 1, 2, 3); }),
                    {transposed_leaf({5, 7})});
  REQUIRE_GRADCHECK("slice", Fn([](const std::vector<Tensor>& x) { return slice(x[0], 0, 1, 11, 3); }),
                    {leaf({11, 5})});
  REQUIRE_GRADCHECK("select", Fn([](const std::vector<Tensor>& x) { return select(x[0], 1, -2); }),
                    {leaf({5, 7})});
  REQUIRE_GRADCHECK("expand", Fn([](const std::vector<Tensor>& x) { return expand(x[0], {3, 5, 7}) * 1.5; }),
                    {leaf({5, 1})});
  REQUIRE_GRADCHECK("unsqueeze+squeeze",
                    Fn([](const std::vector<Tensor>& x) { return squeeze(unsqueeze(x[0], 1) * 2.0, 1); }),
                    {leaf({5, 7})});
  REQUIRE_GRADCHECK("flatten", Fn([](const std::vector<Tensor>& x) { return flatten(x[0], 0, 1); }),
                    {transposed_leaf({5, 7})});
  REQUIRE_GRADCHECK("contiguous", Fn([](const std::vector<Tensor>& x) { return contiguous(x[0]) * 3.0; }),
                    {transposed_leaf({5, 7})});
  REQUIRE_GRADCHECK("to_dtype",
                    Fn([](const std::vector<Tensor>& x) { return to(to(x[0], DType::f32) * 2.0, DType::f64); }),
                    {leaf({5})}, GradcheckOptions{.eps = 1e-3, .atol = 1e-4, .rtol = 1e-3});
}

TEST_CASE("sum, mean and max: known values", "[reduce]") {
  Tensor x = from({1, 5, 3, 4, 2, 6}, {2, 3});
  CHECK(sum(x).item() == 21);
  CHECK(sum(x, {0}).to_vector<float>() == std::vector<float>{5, 7, 9});
  CHECK(sum(x, {1}, true).sizes() == Shape{2, 1});
  CHECK(sum(x, {-1}).to_vector<float>() == std::vector<float>{9, 12});
  CHECK(mean(x, {1}).to_vector<float>() == std::vector<float>{3, 4});
  CHECK(max(x, 1).to_vector<float>() == std::vector<float>{5, 6});
  CHECK(max(x, 0, true).sizes() == Shape{1, 3});
  CHECK(argmax(x, 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2});
  CHECK(max(x).item() == 6);
  CHECK(sum(transpose(x, 0, 1), {0}).to_vector<float>() == std::vector<float>{9, 12});
  REQUIRE_THROWS_WITH(sum(x, {2}), Catch::Contains("[sum] dim 2 out of range"));
  REQUIRE_THROWS_WITH(sum(x, {1, -1}), Catch::Contains("given twice"));
  REQUIRE_THROWS_WITH(max(zeros({0, 3}), 0), Catch::Contains("empty"));
}

TEST_CASE("a float32 sum of many elements keeps its digits", "[reduce]") {
  // 2^24 + 1 ones: a float32 accumulator stalls at 16777216.
  const std::int64_t n = (1 << 24) + 8;
  CHECK(sum(ones({n})).item() == Approx(static_cast<double>(n)).epsilon(1e-7));
}

TEST_CASE("sums over rows and over columns match float64 and do not depend on the thread count", "[reduce]") {
  // 1003 rows: groups of 8 rows and a ragged last group; 301 columns split unevenly over threads.
  Generator gen(4);
  const Tensor x = randn({1003, 301}, {}, gen) + 0.5;
  const Tensor x64 = to(x, DType::f64);
  for (int dim : {0, 1}) {
    set_num_threads(1);
    const Tensor one = sum(x, {dim});
    set_num_threads(2);
    const Tensor two = sum(x, {dim});
    CHECK(max_abs_diff(one, two) == 0);
    const Tensor exact = sum(x64, {dim});
    INFO("dim " << dim << ": max diff from float64 " << max_abs_diff(to(one, DType::f64), exact));
    CHECK(all_close(to(one, DType::f64), exact, 1e-4, 1e-6));
  }
}

TEST_CASE("gradcheck reductions", "[reduce][gradcheck]") {
  REQUIRE_GRADCHECK("sum_all", Fn([](const std::vector<Tensor>& x) { return sum(x[0]); }), {leaf({5, 7})});
  REQUIRE_GRADCHECK("sum_dims", Fn([](const std::vector<Tensor>& x) { return sum(x[0], {0, 2}); }),
                    {leaf({3, 5, 7})});
  REQUIRE_GRADCHECK("sum_keepdim", Fn([](const std::vector<Tensor>& x) { return sum(x[0], {1}, true); }),
                    {transposed_leaf({5, 7})});
  REQUIRE_GRADCHECK("mean", Fn([](const std::vector<Tensor>& x) { return mean(x[0], {-1}); }), {leaf({11, 13})});
  REQUIRE_GRADCHECK("max_dim", Fn([](const std::vector<Tensor>& x) { return max(x[0], 1); }), {leaf({5, 7})});
  REQUIRE_GRADCHECK("max_keepdim", Fn([](const std::vector<Tensor>& x) { return max(x[0], 0, true); }),
                    {transposed_leaf({5, 7})});
  REQUIRE_GRADCHECK("max_all", Fn([](const std::vector<Tensor>& x) { return max(x[0]); }), {leaf({5, 7})});
}

TEST_CASE("matmul known values and NumPy shapes", "[matmul]") {
  Tensor a = from({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from({7, 8, 9, 10, 11, 12}, {3, 2});
  CHECK(matmul(a, b).to_vector<float>() == std::vector<float>{58, 64, 139, 154});
  CHECK(matmul(transpose(b, 0, 1), transpose(a, 0, 1)).to_vector<float>() == std::vector<float>{58, 139, 64, 154});
  CHECK(matmul(a, from({1, 1, 1}, {3})).to_vector<float>() == std::vector<float>{6, 15});  // matrix @ vector
  CHECK(matmul(from({1, 1}, {2}), a).to_vector<float>() == std::vector<float>{5, 7, 9});  // vector @ matrix
  CHECK(matmul(zeros({4, 1, 2, 3}), zeros({5, 3, 7})).sizes() == Shape{4, 5, 2, 7});     // broadcast batch
  REQUIRE_THROWS_WITH(matmul(a, a), Catch::Contains("[matmul] inner dimensions differ: a is [2,3], b is [2,3]"));
  REQUIRE_THROWS_WITH(matmul(zeros({2, 2, 3}), zeros({3, 3, 2})), Catch::Contains("cannot be broadcast"));
  REQUIRE_THROWS_WITH(matmul(a, to(b, DType::f64)), Catch::Contains("dtypes differ"));
}

TEST_CASE("matmul agrees with a naive loop on every layout", "[matmul]") {
  Generator gen(3);
  Tensor a = randn({3, 4, 5}, {DType::f64}, gen), b = randn({3, 5, 6}, {DType::f64}, gen);
  auto naive = [](const Tensor& x, const Tensor& y) {
    std::vector<double> out;
    for (std::int64_t n = 0; n < x.size(0); ++n)
      for (std::int64_t i = 0; i < x.size(1); ++i)
        for (std::int64_t j = 0; j < y.size(2); ++j) {
          double s = 0;
          for (std::int64_t k = 0; k < x.size(2); ++k) s += x.at({n, i, k}) * y.at({n, k, j});
          out.push_back(s);
        }
    return from_vector(out, {x.size(0), x.size(1), y.size(2)});
  };
  const Tensor expected = naive(a, b);
  // The same values through transposed, sliced and expanded layouts.
  Tensor at = transpose(contiguous(transpose(a, 1, 2)), 1, 2);
  Tensor bt = transpose(contiguous(transpose(b, 1, 2)), 1, 2);
  CHECK(max_abs_diff(matmul(a, b), expected) < 1e-12);
  CHECK(max_abs_diff(matmul(at, bt), expected) < 1e-12);
  Tensor wide = randn({3, 4, 9}, {DType::f64}, gen);
  Tensor a_in_wide = narrow(wide, 2, 2, 5);  // row stride 9 > cols 5
  CHECK(max_abs_diff(matmul(a_in_wide, b), naive(contiguous(a_in_wide), b)) < 1e-12);
  Tensor a_perm = permute(contiguous(permute(a, {1, 0, 2})), {1, 0, 2});  // batch stride not outermost
  CHECK(max_abs_diff(matmul(a_perm, b), expected) < 1e-12);
  Tensor b0 = select(b, 0, 0);
  Tensor b_expanded = expand(b0, {3, 5, 6});
  CHECK(max_abs_diff(matmul(a, b_expanded), matmul(a, b0)) < 1e-12);
}

TEST_CASE("matmul with a bias equals matmul + bias on every threading path", "[matmul]") {
  // Shapes for each way the CPU kernel cuts a product: one thread (small),
  // whole batches per thread, row blocks (tall) and column blocks (wide and
  // short); operands plain and transposed; K = 0 gives the bias alone.
  struct Case {
    const char* name;
    Shape a, b;
  };
  const Case cases[] = {{"small", {5, 7}, {7, 3}},
                        {"batches", {4, 64, 128}, {4, 128, 80}},
                        {"tall", {700, 96}, {96, 130}},
                        {"wide and short", {20, 300}, {300, 900}},
                        {"wider than tall, as a weight gradient", {200, 64}, {64, 600}},
                        {"K = 0", {6, 0}, {0, 4}}};
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::f64})
      for (bool transposed : {false, true})
        for (int threads : {1, 2}) {
          DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << (transposed ? " transposed" : "") << " threads "
                                 << threads) {
            set_num_threads(threads);
            Generator gen(9);
            Tensor a = randn(c.a, {dtype}, gen), b = randn(c.b, {dtype}, gen);
            const Tensor bias = randn({c.b.back()}, {dtype}, gen);
            if (transposed) {
              a = transpose(contiguous(transpose(a, -1, -2)), -1, -2);
              b = transpose(contiguous(transpose(b, -1, -2)), -1, -2);
            }
            const Tensor fused = kernels::matmul(a, b, bias);
            const Tensor composed = kernels::matmul(a, b) + bias;
            INFO("max diff " << max_abs_diff(fused, composed));
            CHECK(all_close(fused, composed, atol_for(dtype), rtol_for(dtype)));
          }
        }
  set_num_threads(2);
  REQUIRE_THROWS_WITH(kernels::matmul(zeros({2, 3}), zeros({3, 4}), zeros({3})),
                      Catch::Contains("[matmul] bias [3] does not match the 4 columns of b [3,4]"));
}

TEST_CASE("matmul_add_ adds the product onto c on every threading path, in place or composed", "[matmul]") {
  // Row blocks (tall), column blocks (wide and short), one thread (small), K = 0 (c unchanged); a
  // transposed a as the classifier's d^T; c contiguous (the float32 kernel's sums added onto it) or a
  // column slice (a product and add_).
  struct Case {
    const char* name;
    Shape a, b;
  };
  const Case cases[] = {{"small", {5, 7}, {7, 3}},
                        {"tall", {700, 96}, {96, 130}},
                        {"wide and short", {20, 300}, {300, 900}},
                        {"K = 0", {6, 0}, {0, 4}}};
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::f64})
      for (bool sliced : {false, true})
        for (int threads : {1, 2}) {
          DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << (sliced ? " into a slice" : "") << " threads "
                                 << threads) {
            set_num_threads(threads);
            Generator gen(11);
            const Tensor a = transpose(randn({c.a[1], c.a[0]}, {dtype}, gen), 0, 1), b = randn(c.b, {dtype}, gen);
            const std::int64_t cols = c.b[1];
            const Tensor base = randn({c.a[0], cols + (sliced ? 3 : 0)}, {dtype}, gen);
            const Tensor target = sliced ? narrow(base, 1, 1, cols) : base;
            const Tensor want = contiguous(target) + kernels::matmul(a, b);
            kernels::matmul_add_(target, a, b);
            INFO("max diff " << max_abs_diff(target, want));
            CHECK(all_close(target, want, atol_for(dtype), rtol_for(dtype)));
          }
        }
  set_num_threads(2);
  REQUIRE_THROWS_WITH(kernels::matmul_add_(zeros({2, 5}), zeros({2, 3}), zeros({3, 4})),
                      Catch::Contains("[matmul_add_] c (M, N) += a (M, K) @ b (K, N), got [2,5], [2,3] and [3,4]"));
}

namespace {

// A float32 product's element against its float64 value: each of the K
// multiply-adds (and the addition onto C's old value) rounds once, by at most
// 2^-24 of its result, so |computed - exact| <= (K + 1) 2^-24 (sum |a_i b_i| + |c|).
double float32_product_bound(std::int64_t k, double abs_sum) { return static_cast<double>(k + 1) * 0x1p-24 * abs_sum; }

const std::vector<cpu::F32Kernel> kF32Kernels = {cpu::F32Kernel::avx512, cpu::F32Kernel::avx2,
                                                 cpu::F32Kernel::portable, cpu::F32Kernel::openblas};

struct F32Operands {
  std::int64_t m, n, k;
  bool a_transposed, b_transposed;
  std::vector<float> a, b;  // stored with 3 spare columns a row: leading dimensions wider than the matrix
  std::int64_t lda, ldb;
  float a_at(std::int64_t i, std::int64_t p) const { return a_transposed ? a[p * lda + i] : a[i * lda + p]; }
  float b_at(std::int64_t p, std::int64_t j) const { return b_transposed ? b[j * ldb + p] : b[p * ldb + j]; }
};

F32Operands f32_operands(std::int64_t m, std::int64_t n, std::int64_t k, bool a_transposed, bool b_transposed) {
  F32Operands o{m, n, k, a_transposed, b_transposed, {}, {}, (a_transposed ? m : k) + 3, (b_transposed ? k : n) + 3};
  Generator gen(static_cast<std::uint64_t>(m * 131 + n * 17 + k));
  const auto values = [&](std::int64_t count) {
    return randn({count}, {DType::f32}, gen).to_vector<float>();
  };
  o.a = values((a_transposed ? k : m) * o.lda);
  o.b = values((b_transposed ? n : k) * o.ldb);
  return o;
}

}  // namespace

// The W x W transpose in registers that packs a transposed B (sgemm.cpp) and
// the attention's k^T: lane j of vector i must end as lane i of vector j, for
// every width the kernels use (here on whatever instructions this build targets).
template <typename T, int kBytes>
std::int64_t lanes_out_of_place() {
  typedef T Vec __attribute__((vector_size(kBytes)));
  constexpr int W = kBytes / static_cast<int>(sizeof(T));
  Vec v[W];
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j) v[i][j] = static_cast<T>(i * W + j);
  cpu::transpose_in_registers(v);
  std::int64_t wrong = 0;
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j) wrong += v[i][j] != static_cast<T>(j * W + i);
  return wrong;
}

TEST_CASE("the transpose in registers moves lane j of vector i to lane i of vector j, 2 to 16 lanes", "[matmul]") {
  CHECK(lanes_out_of_place<float, 64>() == 0);
  CHECK(lanes_out_of_place<float, 32>() == 0);
  CHECK(lanes_out_of_place<float, 16>() == 0);
  CHECK(lanes_out_of_place<double, 64>() == 0);
  CHECK(lanes_out_of_place<double, 16>() == 0);
}

// Every shape class the blocking meets: rows not a multiple of the register
// block's (6 on AVX-512), columns not of its 64, K past one chunk (384) and
// unevenly split, columns past one block (512), one row or column alone; a
// transposed A's rows in whole groups of 8 panels (48 rows) and a group's rest
// (61, 300; 55 with two column blocks and two K chunks, each packing the group again).
TEST_CASE("float32 products on every kernel this CPU runs (avx512, avx2, portable, openblas), every layout, within float32's bound",
          "[matmul]") {
  for (const cpu::F32Kernel kernel : kF32Kernels) {
    if (!cpu::f32_kernel_runs_here(kernel)) {
      WARN("skipped: this CPU has no " << cpu::f32_kernel_name(kernel));
      continue;
    }
    for (auto [m, n, k] : {std::tuple{1, 1, 1}, {5, 7, 3}, {6, 64, 8}, {7, 65, 13}, {13, 130, 385}, {25, 600, 40},
                           {61, 33, 700}, {8, 104, 20}, {1, 300, 50}, {300, 1, 50}, {55, 520, 390}})
      for (bool a_transposed : {false, true})
        for (bool b_transposed : {false, true})
          for (auto [accumulate, with_bias] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
            INFO(cpu::f32_kernel_name(kernel) << " " << m << " x " << n << " x " << k << (a_transposed ? " A^T" : "")
                                             << (b_transposed ? " B^T" : "") << (accumulate ? " C +=" : "")
                                             << (with_bias ? " +bias" : ""));
            const F32Operands o = f32_operands(m, n, k, a_transposed, b_transposed);
            const std::int64_t ldc = n + 2;
            std::vector<float> c(static_cast<std::size_t>(m * ldc)), bias(static_cast<std::size_t>(n));
            for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 7) - 3.0f;
            for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = static_cast<float>(j % 5) * 0.75f - 1.5f;
            const std::vector<float> c_before = c;
            cpu::gemm_f32({.a_transposed = a_transposed, .b_transposed = b_transposed, .m = m, .n = n, .k = k,
                           .a = o.a.data(), .lda = o.lda, .b = o.b.data(), .ldb = o.ldb, .c = c.data(), .ldc = ldc,
                           .accumulate = accumulate, .bias = with_bias ? bias.data() : nullptr},
                          kernel);
            std::int64_t outside_bound = 0, columns_touched = 0;
            for (std::int64_t i = 0; i < m; ++i) {
              for (std::int64_t j = 0; j < n; ++j) {
                const double c_old = accumulate ? c_before[i * ldc + j] : 0.0, b = with_bias ? bias[j] : 0.0;
                double exact = c_old + b, abs_sum = std::fabs(c_old) + std::fabs(b);
                for (std::int64_t p = 0; p < k; ++p) {
                  const double term = static_cast<double>(o.a_at(i, p)) * o.b_at(p, j);
                  exact += term;
                  abs_sum += std::fabs(term);
                }
                if (std::fabs(c[i * ldc + j] - exact) > float32_product_bound(k, abs_sum)) ++outside_bound;
              }
              for (std::int64_t j = n; j < ldc; ++j) columns_touched += c[i * ldc + j] != c_before[i * ldc + j];
            }
            CHECK(outside_bound == 0);
            CHECK(columns_touched == 0);  // nothing written past C's n columns
            if (with_bias && !accumulate && kernel != cpu::F32Kernel::openblas) {
              // The header's promise: the bits of C = bias, then C += op(A) op(B).
              std::vector<float> c_then(static_cast<std::size_t>(m * ldc));
              for (std::int64_t i = 0; i < m; ++i) std::copy(bias.begin(), bias.end(), c_then.begin() + i * ldc);
              cpu::gemm_f32({.a_transposed = a_transposed, .b_transposed = b_transposed, .m = m, .n = n, .k = k,
                             .a = o.a.data(), .lda = o.lda, .b = o.b.data(), .ldb = o.ldb, .c = c_then.data(),
                             .ldc = ldc, .accumulate = true},
                            kernel);
              std::int64_t differ = 0;
              for (std::int64_t i = 0; i < m; ++i)
                for (std::int64_t j = 0; j < n; ++j) differ += c[i * ldc + j] != c_then[i * ldc + j];
              CHECK(differ == 0);
            }
          }
  }
}

// A CPU without bfloat16 instructions multiplies bfloat16 operands on the
// float32 kernel, which widens them as it packs (sgemm.h): that must be the
// product of the widened operands to the bit, on every layout and shape class
// above, either operand or both in bfloat16, the leading dimensions wider than
// the matrices (the spare columns hold values a wrong stride would read).
TEST_CASE("bfloat16 operands on every float32 kernel give the bits of their widened values' product", "[matmul][bf16]") {
  for (const cpu::F32Kernel kernel : kF32Kernels) {
    if (!cpu::f32_kernel_runs_here(kernel)) continue;
    for (auto [m, n, k] : {std::tuple{1, 1, 1}, {7, 65, 13}, {13, 130, 385}, {25, 600, 40}, {300, 1, 50}})
      for (bool a_transposed : {false, true})
        for (bool b_transposed : {false, true})
          for (auto [a_in_bf16, b_in_bf16] : {std::pair{true, false}, {false, true}, {true, true}})
            for (bool with_bias : {false, true}) {
              INFO(cpu::f32_kernel_name(kernel) << " " << m << " x " << n << " x " << k << (a_transposed ? " A^T" : "")
                                               << (b_transposed ? " B^T" : "") << (a_in_bf16 ? " A bf16" : "")
                                               << (b_in_bf16 ? " B bf16" : "") << (with_bias ? " +bias" : ""));
              F32Operands o = f32_operands(m, n, k, a_transposed, b_transposed);
              std::vector<bfloat16> a16(o.a.begin(), o.a.end()), b16(o.b.begin(), o.b.end());
              for (std::size_t i = 0; i < a16.size(); ++i)
                if (a_in_bf16) o.a[i] = static_cast<float>(a16[i]);  // the widened values
              for (std::size_t i = 0; i < b16.size(); ++i)
                if (b_in_bf16) o.b[i] = static_cast<float>(b16[i]);
              std::vector<float> bias(static_cast<std::size_t>(n));
              for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = static_cast<float>(j % 5) * 0.75f - 1.5f;
              cpu::F32Gemm g{.a_transposed = a_transposed, .b_transposed = b_transposed, .m = m, .n = n, .k = k,
                             .a = o.a.data(), .lda = o.lda, .b = o.b.data(), .ldb = o.ldb, .ldc = n,
                             .bias = with_bias ? bias.data() : nullptr};
              std::vector<float> want(static_cast<std::size_t>(m * n)), got(want.size());
              g.c = want.data();
              cpu::gemm_f32(g, kernel);
              if (a_in_bf16) g.a = nullptr, g.a_bf16 = a16.data();
              if (b_in_bf16) g.b = nullptr, g.b_bf16 = b16.data();
              g.c = got.data();
              cpu::gemm_f32(g, kernel);
              CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
            }
  }
}

// The header's promise, which a fixed split's equal bits on 1, 2 and 4 processes
// rest on: an element's sum runs over K in the same order wherever the block
// boundaries fall, so a product cut into row or column blocks (as the threads cut
// it) is the whole product, bit for bit.
TEST_CASE("a float32 product cut into row or column blocks gives the whole product's bits", "[matmul]") {
  for (const cpu::F32Kernel kernel : kF32Kernels) {
    if (!cpu::f32_kernel_runs_here(kernel) || kernel == cpu::F32Kernel::openblas) continue;
    INFO(cpu::f32_kernel_name(kernel));
    const std::int64_t m = 50, n = 150, k = 500;
    const F32Operands o = f32_operands(m, n, k, false, true);
    const auto product = [&](std::int64_t row0, std::int64_t rows, std::int64_t col0, std::int64_t cols,
                             std::vector<float>& c) {
      cpu::gemm_f32({.b_transposed = true, .m = rows, .n = cols, .k = k, .a = o.a.data() + row0 * o.lda,
                     .lda = o.lda, .b = o.b.data() + col0 * o.ldb, .ldb = o.ldb, .c = c.data() + row0 * n + col0,
                     .ldc = n},
                    kernel);
    };
    std::vector<float> whole(m * n), by_rows(m * n), by_columns(m * n);
    product(0, m, 0, n, whole);
    product(0, 17, 0, n, by_rows);
    product(17, m - 17, 0, n, by_rows);
    product(0, m, 0, 70, by_columns);
    product(0, m, 70, n - 70, by_columns);
    CHECK(std::memcmp(whole.data(), by_rows.data(), whole.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(whole.data(), by_columns.data(), whole.size() * sizeof(float)) == 0);
  }
}

// C in panels (F32Gemm::c_panel_cols, as linear_heads writes a projection
// head by head): every value where C whole has it, to the bit, and nothing
// written in the gaps between panels or past a row's panel columns.
TEST_CASE("a float32 product written in panels of columns gives C's bits where the panels put them", "[matmul]") {
  for (const cpu::F32Kernel kernel : kF32Kernels) {
    if (!cpu::f32_kernel_runs_here(kernel) || cpu::f32_block_cols(kernel) == 0) continue;
    const std::int64_t block = cpu::f32_block_cols(kernel);
    for (const std::int64_t panel : {block, 2 * block})
      for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 3 * panel, 5},
                             {13, 2 * panel + block, 400}, {7, panel, 1}})
        for (auto [accumulate, with_bias] : {std::pair{false, false}, {true, true}, {false, true}}) {
          INFO(cpu::f32_kernel_name(kernel) << " panels of " << panel << ", " << m << " x " << n << " x " << k
                                           << (accumulate ? " C +=" : "") << (with_bias ? " +bias" : ""));
          const F32Operands o = f32_operands(m, n, k, false, true);
          std::vector<float> bias(static_cast<std::size_t>(n));
          for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = static_cast<float>(j % 5) * 0.75f - 1.5f;
          const std::int64_t panels = (n + panel - 1) / panel, ldc = panel + 3, stride = m * ldc + 11;
          std::vector<float> whole(static_cast<std::size_t>(m * n)), in_panels(static_cast<std::size_t>(panels * stride));
          for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i % 7) - 3.0f;
          for (std::size_t i = 0; i < in_panels.size(); ++i) in_panels[i] = -7.0f;  // the gaps keep this
          const auto at = [&](std::int64_t i, std::int64_t j) -> float& {
            return in_panels[static_cast<std::size_t>(j / panel * stride + i * ldc + j % panel)];
          };
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) at(i, j) = whole[i * n + j];
          cpu::F32Gemm g{.b_transposed = true, .m = m, .n = n, .k = k, .a = o.a.data(), .lda = o.lda, .b = o.b.data(),
                         .ldb = o.ldb, .c = whole.data(), .ldc = n, .accumulate = accumulate,
                         .bias = with_bias ? bias.data() : nullptr};
          cpu::gemm_f32(g, kernel);
          g.c = in_panels.data(), g.ldc = ldc, g.c_panel_cols = panel, g.c_panel_stride = stride;
          cpu::gemm_f32(g, kernel);
          std::int64_t differ = 0, gaps_written = 0, gap_values = 0;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) differ += std::memcmp(&at(i, j), &whole[i * n + j], sizeof(float)) != 0;
          for (std::size_t i = 0; i < in_panels.size(); ++i) gap_values += in_panels[i] == -7.0f;
          gaps_written = static_cast<std::int64_t>(in_panels.size()) - m * n - gap_values;
          CHECK(differ == 0);
          CHECK(gaps_written == 0);
        }
  }
  // OpenBLAS cannot: refused by name, not written wrong.
  std::vector<float> a(4, 1.0f), c(64, 0.0f);
  CHECK_THROWS_WITH(cpu::gemm_f32({.m = 1, .n = 4, .k = 1, .a = a.data(), .lda = 1, .b = a.data(), .ldb = 4,
                                   .c = c.data(), .ldc = 2, .c_panel_cols = 2, .c_panel_stride = 8},
                                  cpu::F32Kernel::openblas),
                    Catch::Contains("[matmul]") && Catch::Contains("panels of 2"));
}

// The MLP's GELU made by the product as it stores C (F32Gemm::Epilogue) is
// the element-wise kernels' GELU of the plain product, to the bit: on every
// kernel, across K chunks (K > 384), row and column edges, with and without a
// bias and K = 0; nothing written past C's n columns in either matrix.
TEST_CASE("the GELU epilogue on every float32 kernel gives the element-wise kernels' bits", "[matmul]") {
  using Epilogue = cpu::F32Gemm::Epilogue;
  for (const cpu::F32Kernel kernel : kF32Kernels) {
    if (!cpu::f32_kernel_runs_here(kernel)) continue;
    for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{7, 65, 13}, {13, 130, 800},
                           {1, 300, 50}, {25, 600, 40}, {9, 20, 0}})
      for (bool a_transposed : {false, true})
        for (bool with_bias : {false, true})
          for (Epilogue epilogue : {Epilogue::gelu, Epilogue::gelu_grad}) {
            INFO(cpu::f32_kernel_name(kernel) << " " << m << " x " << n << " x " << k << (a_transposed ? " A^T" : "")
                                             << (with_bias ? " +bias" : "")
                                             << (epilogue == Epilogue::gelu ? " gelu" : " gelu_grad"));
            const F32Operands o = f32_operands(m, n, k, a_transposed, true);
            const std::int64_t ldc = n + 2;
            Generator gen(5);
            const std::vector<float> bias = randn({n}, {DType::f32}, gen).to_vector<float>();
            // gelu_grad's companion: pre-activations, some far out in both tails.
            std::vector<float> pre = randn({m * ldc}, {DType::f32}, gen).to_vector<float>();
            for (std::size_t i = 0; i < pre.size(); i += 7) pre[i] *= 8.0f;
            cpu::F32Gemm g{.a_transposed = a_transposed, .b_transposed = true, .m = m, .n = n, .k = k,
                           .a = o.a.data(), .lda = o.lda, .b = o.b.data(), .ldb = o.ldb, .ldc = ldc,
                           .bias = with_bias ? bias.data() : nullptr};
            std::vector<float> plain(static_cast<std::size_t>(m * ldc), -7.0f);
            g.c = plain.data();
            cpu::gemm_f32(g, kernel);
            const std::vector<float> untouched(plain.size(), -7.0f);
            std::vector<float> want_c = plain, want_companion = epilogue == Epilogue::gelu ? untouched : pre;
            for (std::int64_t i = 0; i < m; ++i)
              if (epilogue == Epilogue::gelu)
                cpu::gelu_f32(&want_companion[i * ldc], &plain[i * ldc], n);
              else
                cpu::gelu_backward_f32(&want_c[i * ldc], &plain[i * ldc], &pre[i * ldc], n);
            std::vector<float> c = untouched, companion = epilogue == Epilogue::gelu ? untouched : pre;
            g.c = c.data(), g.epilogue = epilogue, g.companion = companion.data();
            cpu::gemm_f32(g, kernel);
            CHECK(std::memcmp(c.data(), want_c.data(), c.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(companion.data(), want_companion.data(), c.size() * sizeof(float)) == 0);
          }
  }
  // Onto an old C, or into panels, it would make a GELU of a partial sum: refused.
  std::vector<float> a(4, 1.0f), c(8, 0.0f), companion(8, 0.0f);
  CHECK_THROWS_WITH(cpu::gemm_f32({.m = 1, .n = 4, .k = 1, .a = a.data(), .lda = 1, .b = a.data(), .ldb = 4,
                                   .c = c.data(), .ldc = 4, .accumulate = true, .epilogue = cpu::F32Gemm::Epilogue::gelu,
                                   .companion = companion.data()}),
                    Catch::Contains("[matmul]") && Catch::Contains("GELU epilogue"));
}

TEST_CASE("gradcheck matmul and linear", "[matmul][gradcheck]") {
  Fn mm = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };
  REQUIRE_GRADCHECK("matmul", mm, {leaf({5, 7}, 1), leaf({7, 11}, 2)});
  REQUIRE_GRADCHECK("matmul", mm, {transposed_leaf({5, 7}, 3), transposed_leaf({7, 11}, 4)});
  REQUIRE_GRADCHECK("matmul_batched_broadcast", mm, {leaf({3, 1, 5, 7}, 5), leaf({2, 7, 4}, 6)});
  REQUIRE_GRADCHECK("matmul_vec", mm, {leaf({7}, 7), leaf({3, 7, 5}, 8)});
  REQUIRE_GRADCHECK("matmul_mat_vec", mm, {leaf({5, 7}, 9), leaf({7}, 10)});
  Fn lin = [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); };
  REQUIRE_GRADCHECK("linear", lin, {leaf({3, 5, 7}, 11), leaf({4, 7}, 12), leaf({4}, 13)});
  REQUIRE_GRADCHECK("linear", lin, {transposed_leaf({5, 7}, 14), transposed_leaf({4, 7}, 15), leaf({4}, 16)});
  Fn nobias = [](const std::vector<Tensor>& x) { return linear(x[0], x[1]); };
  REQUIRE_GRADCHECK("linear_nobias", nobias, {leaf({5, 7}, 17), leaf({4, 7}, 18)});
}

TEST_CASE("linear equals its composition matmul + add", "[matmul]") {
  Tensor x = leaf({2, 5, 7}, 1), w = leaf({4, 7}, 2), b = leaf({4}, 3);
  Tensor fused = linear(x, w, b);
  Tensor composed = matmul(x, transpose(w, 0, 1)) + b;
  CHECK(max_abs_diff(fused, composed) < 1e-12);
  backward(sum(fused * fused));
  const Tensor gx = kernels::clone(x.grad()), gw = kernels::clone(w.grad()), gb = kernels::clone(b.grad());
  x.set_grad({}), w.set_grad({}), b.set_grad({});
  backward(sum(composed * composed));
  CHECK(max_abs_diff(gx, x.grad()) < 1e-10);
  CHECK(max_abs_diff(gw, w.grad()) < 1e-10);
  CHECK(max_abs_diff(gb, b.grad()) < 1e-10);
  REQUIRE_THROWS_WITH(linear(zeros({2, 5}), zeros({4, 6})), Catch::Contains("[linear]"));
}

namespace {
// linear's result as linear_heads lays it out: (B, T, parts, heads, D) permuted
// to (B, parts, heads, T, D), made contiguous.
Tensor linear_permuted(const Tensor& x, const Tensor& w, const Tensor& b, std::int64_t parts, std::int64_t heads) {
  const Tensor y = linear(x, w, b);
  const Tensor split = view(y, {x.size(0), x.size(1), parts, heads, w.size(0) / (parts * heads)});
  return contiguous(permute(split, {0, 2, 3, 1, 4}));
}
}  // namespace

// Where the float32 kernel writes the heads itself (D a multiple of its
// blocks' 64 columns on AVX-512), contiguous, and where the product is seen
// head by head through strides, linear_heads is linear permuted, to the bit,
// forward and backward.
TEST_CASE("linear_heads gives linear's bits laid out head by head, forward and backward", "[matmul]") {
  struct Case {
    std::int64_t B, T, in, parts, heads, D;
    bool transposed_x, with_bias;
  };
  for (const Case c : {Case{2, 13, 24, 3, 2, 64, false, true}, Case{1, 70, 40, 3, 1, 128, true, true},
                       Case{2, 7, 5, 3, 3, 8, false, false}, Case{1, 9, 16, 2, 2, 64, false, false},
                       Case{3, 50, 64, 3, 2, 64, false, true}})  // threads' row blocks across batches
    for (DType dtype : {DType::f32, DType::f64}) {
      const bool direct = dtype == DType::f32 && cpu::linear_heads_direct(c.D);
      INFO("B " << c.B << " T " << c.T << " in " << c.in << " parts " << c.parts << " heads " << c.heads << " D "
                << c.D << " " << dtype_name(dtype) << (c.transposed_x ? " x transposed" : "")
                << " direct: " << direct);
      const std::int64_t out = c.parts * c.heads * c.D;
      const auto make_leaf = [&](const Tensor& values) {
        Tensor t = kernels::cast(values, dtype);
        t.set_requires_grad(true);
        return t;
      };
      const Tensor x = make_leaf(c.transposed_x ? transposed_leaf({c.B, c.T, c.in}, 1).detach() : leaf({c.B, c.T, c.in}, 1).detach());
      const Tensor w = make_leaf(leaf({out, c.in}, 2).detach()), b = c.with_bias ? make_leaf(leaf({out}, 3).detach()) : Tensor();
      Tensor x_ref = x.detach(), w_ref = w.detach(), b_ref = c.with_bias ? b.detach() : Tensor();
      for (Tensor* t : {&x_ref, &w_ref, &b_ref})
        if (t->defined()) t->set_requires_grad(true);
      const Tensor y = linear_heads(x, w, b, c.parts, c.heads);
      const Tensor want = linear_permuted(x_ref, w_ref, b_ref, c.parts, c.heads);
      REQUIRE(y.sizes() == Shape{c.B, c.parts, c.heads, c.T, c.D});
      CHECK(y.is_contiguous() == direct);
      CHECK(y.stride(-1) == 1);
      CHECK(max_abs_diff(y, want) == 0);
      Generator gen(4);
      const Tensor g = kernels::cast(randn(y.sizes(), {}, gen), dtype);
      backward(y, g);
      backward(want, g);
      CHECK(max_abs_diff(x.grad(), x_ref.grad()) == 0);
      CHECK(max_abs_diff(w.grad(), w_ref.grad()) == 0);
      if (c.with_bias) CHECK(max_abs_diff(b.grad(), b_ref.grad()) == 0);
      CHECK(max_abs_diff(w.grad(), zeros(w.sizes(), w.options())) > 1e-3);
    }
}

TEST_CASE("gradcheck linear_heads", "[matmul][gradcheck]") {
  Fn with_bias = [](const std::vector<Tensor>& x) { return linear_heads(x[0], x[1], x[2], 3, 2); };
  Fn no_bias = [](const std::vector<Tensor>& x) { return linear_heads(x[0], x[1], {}, 2, 1); };
  REQUIRE_GRADCHECK("linear_heads", with_bias, {leaf({2, 5, 4}, 1), leaf({12, 4}, 2), leaf({12}, 3)});
  REQUIRE_GRADCHECK("linear_heads_transposed", with_bias, {transposed_leaf({2, 5, 4}, 4), leaf({12, 4}, 5), leaf({12}, 6)});
  REQUIRE_GRADCHECK("linear_heads_nobias", no_bias, {leaf({1, 3, 6}, 7), transposed_leaf({6, 6}, 8)});
}

// mlp is linear(gelu(linear(...))) to the bit, forward and every gradient: in
// float32, where the products make GELU's passes, on each way a product is cut
// for threads (one thread, row blocks, column blocks) and across K chunks;
// and in float64, where it runs the composed kernels.
TEST_CASE("mlp gives the composed ops' bits, forward and backward, on every threading path", "[matmul]") {
  struct Case {
    const char* name;
    Shape x;
    std::int64_t hidden, out;
    bool transposed_x, with_bias;
  };
  const Case cases[] = {{"small", {2, 5, 7}, 12, 7, false, true},
                        {"tall", {2, 150, 48}, 130, 48, true, true},
                        {"wide and short, no bias", {20, 256}, 1024, 64, false, false},
                        {"K chunks", {70, 400}, 96, 500, false, true}};
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::f64})
      for (int threads : {1, 2}) {
        DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << " threads " << threads) {
          set_num_threads(threads);
          const std::int64_t in = c.x.back();
          const auto make_leaf = [&](const Tensor& values) {
            Tensor t = kernels::cast(values.detach(), dtype);
            t.set_requires_grad(true);
            return t;
          };
          const Tensor x = make_leaf(c.transposed_x ? transposed_leaf(c.x, 1) : leaf(c.x, 1));
          const Tensor w1 = make_leaf(leaf({c.hidden, in}, 2)), w2 = make_leaf(leaf({c.out, c.hidden}, 4));
          const Tensor b1 = c.with_bias ? make_leaf(leaf({c.hidden}, 3)) : Tensor();
          const Tensor b2 = c.with_bias ? make_leaf(leaf({c.out}, 5)) : Tensor();
          std::vector<Tensor> mine = {x, w1, b1, w2, b2}, ref;
          for (const Tensor& t : mine) ref.push_back(t.defined() ? make_leaf(t) : Tensor());
          const Tensor y = mlp(x, w1, b1, w2, b2);
          const Tensor want = linear(gelu(linear(ref[0], ref[1], ref[2])), ref[3], ref[4]);
          REQUIRE(y.sizes() == want.sizes());
          CHECK(max_abs_diff(y, want) == 0);
          Generator gen(7);
          const Tensor g = kernels::cast(randn(y.sizes(), {}, gen), dtype);
          backward(y, g);
          backward(want, g);
          for (std::size_t i = 0; i < mine.size(); ++i) {
            if (!mine[i].defined()) continue;
            INFO("gradient of input " << i);
            CHECK(max_abs_diff(mine[i].grad(), ref[i].grad()) == 0);
            CHECK(max_abs_diff(mine[i].grad(), zeros(mine[i].sizes(), mine[i].options())) > 1e-3);
          }
        }
      }
  set_num_threads(2);
}

// No input features: every output row is the bias (through GELU for mlp's
// hidden layer), as a product over K = 0 gives; the weights' gradients are empty.
TEST_CASE("linear and mlp of no input features give their biases", "[matmul]") {
  for (DType dtype : {DType::f32, DType::f64}) {
    INFO(dtype_name(dtype));
    Generator gen(1);
    const Tensor x = zeros({2, 3, 0}, {dtype}), w1 = zeros({5, 0}, {dtype}), b1 = randn({5}, {dtype}, gen);
    const Tensor w2 = randn({4, 5}, {dtype}, gen), b2 = randn({4}, {dtype}, gen);
    const Tensor y = linear(x, w1, b1);
    REQUIRE(y.sizes() == Shape{2, 3, 5});
    CHECK(max_abs_diff(y, expand(b1, {2, 3, 5})) == 0);
    const Tensor z = mlp(x, w1, b1, w2, b2), want = linear(gelu(expand(b1, {2, 3, 5})), w2, b2);
    REQUIRE(z.sizes() == Shape{2, 3, 4});
    CHECK(max_abs_diff(z, want) == 0);
    CHECK(max_abs_diff(z, zeros(z.sizes(), z.options())) > 1e-3);
  }
}

TEST_CASE("gradcheck mlp", "[matmul][gradcheck]") {
  Fn with_bias = [](const std::vector<Tensor>& x) { return mlp(x[0], x[1], x[2], x[3], x[4]); };
  Fn no_bias = [](const std::vector<Tensor>& x) { return mlp(x[0], x[1], {}, x[2], {}); };
  REQUIRE_GRADCHECK("mlp", with_bias, {leaf({2, 3, 5}, 1), leaf({8, 5}, 2), leaf({8}, 3), leaf({4, 8}, 4), leaf({4}, 5)});
  REQUIRE_GRADCHECK("mlp_transposed", with_bias,
                    {transposed_leaf({3, 5}, 6), transposed_leaf({8, 5}, 7), leaf({8}, 8), transposed_leaf({4, 8}, 9),
                     leaf({4}, 10)});
  REQUIRE_GRADCHECK("mlp_nobias", no_bias, {leaf({6}, 11), leaf({7, 6}, 12), leaf({3, 7}, 13)});
}

TEST_CASE("mlp names weights that do not chain", "[matmul][errors]") {
  CHECK_THROWS_WITH(mlp(zeros({2, 4}), zeros({8, 4}), {}, zeros({4, 7}), {}),
                    Catch::Contains("[mlp]") && Catch::Contains("[8,4]") && Catch::Contains("[4,7]"));
  CHECK_THROWS_WITH(mlp(zeros({2, 5}), zeros({8, 4}), {}, zeros({4, 8}), {}),
                    Catch::Contains("[mlp]") && Catch::Contains("input [2,5]"));
  CHECK_THROWS_WITH(mlp(zeros({2, 4}), zeros({8, 4}), zeros({7}), zeros({4, 8}), {}),
                    Catch::Contains("[mlp]") && Catch::Contains("bias [7]"));
  CHECK_THROWS_WITH(mlp(zeros({2, 4}), zeros({8, 4}), {}, zeros({4, 8}), zeros({8})),
                    Catch::Contains("[mlp]") && Catch::Contains("bias [8] does not match weight [4,8]"));
}

TEST_CASE("linear_heads names shapes that do not split into heads", "[matmul][errors]") {
  CHECK_THROWS_WITH(linear_heads(zeros({2, 3, 4}), zeros({10, 4}), {}, 3, 2),
                    Catch::Contains("[linear_heads]") && Catch::Contains("[10,4]") && Catch::Contains("3 parts of 2 heads"));
  CHECK_THROWS_WITH(linear_heads(zeros({6, 4}), zeros({12, 4}), {}, 3, 2),
                    Catch::Contains("[linear_heads]") && Catch::Contains("(B, T, in)"));
  CHECK_THROWS_WITH(linear_heads(zeros({2, 3, 4}), zeros({12, 5}), {}, 3, 2), Catch::Contains("[linear_heads]"));
  CHECK_THROWS_WITH(linear_heads(zeros({2, 3, 4}), zeros({12, 4}), zeros({11}), 3, 2),
                    Catch::Contains("[linear_heads]") && Catch::Contains("bias [11]"));
  CHECK_THROWS_WITH(linear_heads(zeros({2, 3, 4}), zeros({12, 4}, {DType::f64}), {}, 3, 2),
                    Catch::Contains("[linear_heads]"));
}
