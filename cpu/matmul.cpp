// Batched matmul: float32 on gemm_f32 (cpu/matmul_f32/sgemm.h: our
// AVX-512 kernel, else OpenBLAS), float64 on OpenBLAS, and bfloat16 operands
// on gemm_f32 too where the CPU has no bfloat16 instructions (matmul_widened).
// Each matrix operand goes to BLAS as it lies in memory when its last two dims
// are row-major (strides [ld, 1]) or column-major (strides [1, ld], i.e. a transposed view): the latter becomes
// a transpose flag, not a copy. Anything else is copied to contiguous first.
//
// Threads: OpenBLAS runs single-threaded inside our pool's workers (see
// cpu/parallel.h). Many batches are spread over threads whole; a single
// large product is cut into row blocks of C (or column blocks when it is
// wide and short), one single-threaded GEMM each.
#include <cblas.h>

#include "cpu/bf16_rounding.h"
#include "cpu/blas_setup.h"
#include "cpu/gelu_rows.h"
#include "cpu/linear_heads.h"
#include "cpu/matmul_bf16/matmul_bf16.h"
#include "cpu/matmul_f32/sgemm.h"
#include "cpu/scratch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"
#include "cpu/parallel.h"

namespace attograd::cpu {
namespace {

// How a float32 product stores C: its GELU epilogue (F32Gemm::Epilogue), the
// companion matrix laid out as C, each thread's part at the offset of its part
// of C; or its sums added to what C holds.
struct CStore {
  F32Gemm::Epilogue epilogue = F32Gemm::Epilogue::none;
  float* companion = nullptr;
  bool accumulate = false;
  float* at(std::int64_t offset) const { return companion ? companion + offset : nullptr; }
};

// C = op(A) op(B), plus bias[j] in every row when bias is given, without a
// pass over C of its own: float32's kernel adds it as it stores the first K
// chunk's sums (a copy of the bias into C first is a pass over C); for
// float64 it is written into C and the product accumulated onto it (beta = 1).
template <typename T>  // and float32's GELU epilogue, when given
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T* c, std::int64_t ldc, const T* bias, F32Gemm::Epilogue epilogue = {},
          float* companion = nullptr, bool accumulate = false) {
  const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32({.a_transposed = ta, .b_transposed = tb, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = b,
              .ldb = ldb, .c = c, .ldc = ldc, .accumulate = accumulate, .bias = bias, .epilogue = epilogue,
              .companion = companion});
  } else {
    if (bias)
      for (std::int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, c + i * ldc);
    cblas_dgemm(CblasRowMajor, tra, trb, m, n, k, 1.0, a, lda, b, ldb, bias ? 1.0 : 0.0, c, ldc);
  }
}

// bfloat16 operands and C, float32 bias: float32's product of the operands
// (widened exactly as the kernel packs them) plus the bias into this thread's
// scratch (kept between products: its pages already mapped), rounded into C
// once. A float32 tensor for the whole product and a cast after it cost an
// allocation, its pages and a second parallel pass each product. (Bands of rows
// rounded while in L2 cost more: each band packs B again.)
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, std::int64_t lda,
          const bfloat16* b, std::int64_t ldb, bfloat16* c, std::int64_t ldc, const float* bias,
          F32Gemm::Epilogue /*float32's only*/ = {}, float* = nullptr, bool /*float32's only*/ = false) {
  thread_local Scratch<float> sums;
  if (static_cast<std::int64_t>(sums.size()) < m * n) sums.resize(static_cast<std::size_t>(m * n));
  gemm_f32({.a_transposed = ta, .b_transposed = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .c = sums.data(),
            .ldc = n, .bias = bias, .a_bf16 = a, .b_bf16 = b},
           widening_f32_kernel());
  for (std::int64_t r = 0; r < m; ++r) round_to_bf16(&c[r * ldc].bits, sums.data() + r * n, n);
}

// Below this many FLOPs a product runs on one thread: waking a worker costs
// more than the split saves.
constexpr std::int64_t kMinParallelFlops = 4 << 20;

// The rows (or columns) of C each thread takes of one product cut for threads: one block a thread.
std::int64_t thread_block(std::int64_t extent, int threads) {
  return std::max<std::int64_t>(16, (extent + threads - 1) / threads);
}

// out (batch_shape x m x n, contiguous, element type T) = a b (+ bias), a and b
// of element type T, the bias float32 for bfloat16 (its sums are), else T, on
// the pool's threads.
template <typename T>
void batched_products(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias,
                      const Tensor& out, const CStore& pass = {}) {
  if constexpr (!std::is_same_v<T, float>)
    AG_CHECK(!pass.companion && !pass.accumulate, "matmul", "a float32 store on {}", out.str());
  using Bias = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  const MatrixOperand a = matrix_operand(a_in), b = matrix_operand(b_in);
  const MatmulBatches batch(a.t, b.t, batch_shape);
  const std::int64_t batches = batch.count();
  prepare_blas();
  const auto* pa = a.t.data<T>();
  const auto* pb = b.t.data<T>();
  auto* pc = out.data<T>();
  const Bias* pbias = bias.defined() ? bias.data<Bias>() : nullptr;
  auto batch_offsets = [&](std::int64_t i, std::int64_t& oa, std::int64_t& ob) { batch.offsets(i, oa, ob); };
  // Row r of op(A) starts at r * lda (or r when A is read transposed); column j of op(B) likewise.
  const std::int64_t a_row_step = a.transposed ? 1 : a.ld, b_col_step = b.transposed ? b.ld : 1;
  const std::int64_t flops_per_batch = 2 * m * n * k;
  const int threads = get_num_threads();
  if (threads == 1 || batches * flops_per_batch < kMinParallelFlops) {
    for (std::int64_t i = 0; i < batches; ++i) {
      std::int64_t oa, ob;
      batch_offsets(i, oa, ob);
      gemm(a.transposed, b.transposed, m, n, k, pa + oa, a.ld, pb + ob, b.ld, pc + i * m * n, n, pbias,
           pass.epilogue, pass.at(i * m * n), pass.accumulate);
    }
  } else if (batches >= threads) {
    parallel_for(0, batches, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        std::int64_t oa, ob;
        batch_offsets(i, oa, ob);
        gemm(a.transposed, b.transposed, m, n, k, pa + oa, a.ld, pb + ob, b.ld, pc + i * m * n, n, pbias,
             pass.epilogue, pass.at(i * m * n), pass.accumulate);
      }
    });
  } else {
    // Few batches: split each product into row (or column) blocks of C. Each
    // thread packs the whole of the operand the blocks share, B (k x n) for
    // row blocks and A (m x k) for column blocks, so cut the dimension whose
    // shared operand is the smaller, m >= n for rows. Column blocks narrower
    // than 64 waste the GEMM's micro-tiles: then rows anyway. (A weight
    // gradient x^T dy, 128 x 384 x 4096, cut into rows would pack all of dy
    // once per thread.)
    const bool split_rows = m >= n || n < 64 * threads;
    const std::int64_t extent = split_rows ? m : n;
    const std::int64_t block = thread_block(extent, threads);
    for (std::int64_t i = 0; i < batches; ++i) {
      std::int64_t oa, ob;
      batch_offsets(i, oa, ob);
      parallel_for(0, extent, block, [&](std::int64_t lo, std::int64_t hi) {
        if (split_rows)
          gemm(a.transposed, b.transposed, hi - lo, n, k, pa + oa + lo * a_row_step, a.ld, pb + ob, b.ld,
               pc + i * m * n + lo * n, n, pbias, pass.epilogue, pass.at(i * m * n + lo * n), pass.accumulate);
        else
          gemm(a.transposed, b.transposed, m, hi - lo, k, pa + oa, a.ld, pb + ob + lo * b_col_step, b.ld,
               pc + i * m * n + lo, n, pbias ? pbias + lo : nullptr, pass.epilogue, pass.at(i * m * n + lo),
               pass.accumulate);
      });
    }
  }
}

// What a product of no K values makes: zeros, or the bias in every row.
void fill_empty_product(const Tensor& out, const Tensor& bias) {
  fill_(out, 0);
  if (bias.defined()) add_(out, bias, 1.0);
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias) {
  if (a_in.dtype() == DType::bf16) return matmul_bf16(a_in, b_in, batch_shape, bias);
  Tensor out = matmul_output(a_in, b_in, batch_shape);
  if (out.numel() == 0) return out;
  if (a_in.size(-1) == 0) {
    fill_empty_product(out, bias);
    return out;
  }
  AG_DISPATCH_FLOAT(out.dtype(), "matmul",
                    [&] { batched_products<scalar_t>(a_in, b_in, batch_shape, bias, out); });
  return out;
}

bool linear_heads_direct(std::int64_t head_dim) {
  const std::int64_t block_cols = f32_block_cols(f32_kernel());
  return block_cols > 0 && head_dim > 0 && head_dim % block_cols == 0;
}

// Declines what the float32 kernel cannot write head by head: other dtypes,
// heads its column blocks straddle, and an empty inner dim (no product to
// store). Threads take blocks of rows, as batched_products cuts one large
// product (the projections are tall: B T rows against parts * heads * D
// columns), each block within one batch, whose rows are T * D apart from the
// next batch's.
Tensor linear_heads(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts,
                    std::int64_t heads) {
  const std::int64_t B = x.size(0), T = x.size(1), in = x.size(2), out = weight.size(0);
  const std::int64_t D = out / (parts * heads);
  if (x.dtype() != DType::f32 || in == 0 || !linear_heads_direct(D)) return {};
  Tensor y = empty({B, parts, heads, T, D}, x.options());
  if (y.numel() == 0) return y;
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pbias = bias.defined() ? bias.data<float>() : nullptr;
  float* py = y.data<float>();
  const F32Kernel kernel = f32_kernel();
  const auto rows = [&](std::int64_t lo, std::int64_t hi) {  // rows [lo, hi) of the B T, each batch's apart
    for (std::int64_t r = lo; r < hi;) {
      const std::int64_t b = r / T, t = r % T, n = std::min(hi - r, T - t);
      gemm_f32({.b_transposed = true, .m = n, .n = out, .k = in, .a = px + r * in, .lda = in, .b = pw, .ldb = in,
                .c = py + b * out * T + t * D, .ldc = D, .bias = pbias, .c_panel_cols = D, .c_panel_stride = T * D},
               kernel);
      r += n;
    }
  };
  const int threads = get_num_threads();
  if (threads == 1 || 2 * B * T * out * in < kMinParallelFlops) {
    rows(0, B * T);
  } else {
    parallel_for(0, B * T, thread_block(B * T, threads), rows);
  }
  return y;
}

// The MLP's products in float32: the product's kernel makes GELU's pass over
// C as it stores each band of C's rows (F32Gemm::Epilogue), so the
// activations are not read back from memory by a separate element-wise pass.
// Equal to the composed ops to the bit. Other dtypes decline.
kernels::LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (x.dtype() != DType::f32) return {};
  const Tensor w_t = make_view(weight, {weight.size(1), weight.size(0)}, {1, weight.size(1)}, weight.offset());
  Tensor pre = matmul_output(x, w_t, {});
  Tensor out = empty(pre.sizes(), pre.options());
  if (pre.numel() == 0) return {pre, out};
  if (x.size(1) == 0) {
    fill_empty_product(pre, bias);
    gelu_f32(out.data<float>(), pre.data<float>(), pre.numel());
    return {pre, out};
  }
  batched_products<float>(x, w_t, {}, bias, pre, {.epilogue = F32Gemm::Epilogue::gelu, .companion = out.data<float>()});
  return {pre, out};
}

// GELU's backward made by the product that makes the gradient of its output.
Tensor matmul_gelu_grad(const Tensor& g, const Tensor& weight, const Tensor& pre) {
  if (g.dtype() != DType::f32) return {};
  Tensor out = matmul_output(g, weight, {});
  if (out.numel() == 0) return out;
  if (g.size(1) == 0) {  // zeros times gelu'(pre), NaN where pre is, as the composed ops give
    fill_(out, 0);
    scale_by_gelu_grad_f32(out.data<float>(), pre.data<float>(), out.numel());
    return out;
  }
  batched_products<float>(g, weight, {}, Tensor(), out,
                          {.epilogue = F32Gemm::Epilogue::gelu_grad, .companion = pre.data<float>()});
  return out;
}

// C += A B in float32, with no product of its own: a gradient summed over
// chunks of rows (autograd's linear_cross_entropy). Other dtypes decline.
bool matmul_add_(const Tensor& c, const Tensor& a, const Tensor& b) {
  if (c.dtype() != DType::f32) return false;
  if (c.numel() == 0 || a.size(1) == 0) return true;
  batched_products<float>(a, b, {}, Tensor(), c, {.accumulate = true});
  return true;
}

Tensor matmul_widened(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias) {
  Tensor out = matmul_output(a_in, b_in, batch_shape);
  if (out.numel() == 0) return out;
  if (a_in.size(-1) == 0) {
    fill_empty_product(out, bias);
    return out;
  }
  const Tensor wide_bias = bias.defined() ? kernels::cast(bias, DType::f32) : Tensor();
  batched_products<bfloat16>(a_in, b_in, batch_shape, wide_bias, out);
  return out;
}

}  // namespace attograd::cpu

// The CPU's answers to which kernels its products run on (tensor/kernels.h).
namespace attograd::kernels {

const char* bf16_matmul_kernel() { return cpu::bf16_kernel_name(cpu::bf16_kernel()); }
const char* f32_matmul_kernel() { return cpu::f32_kernel_name(cpu::f32_kernel()); }
const char* widening_matmul_kernel() { return cpu::f32_kernel_name(cpu::widening_f32_kernel()); }

}  // namespace attograd::kernels
