// Batched matmul on CUDA tensors (float32, or bfloat16 with float32 sums),
// with an optional bias added to every row: each operand goes to the SGEMM of
// cuda/matmul.cu (or the bfloat16 product of cuda/matmul_bf16.cu) as it lies
// in memory when its last two dims are row-major or column-major (a transposed
// view), exactly as the CPU hands operands to BLAS; anything else is copied to
// contiguous first.
#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::gpu {
Tensor matmul(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias) {
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  Tensor out = matmul_output(a_in, b_in, batch_shape);
  if (out.numel() == 0) return out;
  const MatrixOperand a = matrix_operand(a_in), b = matrix_operand(b_in);
  const MatmulBatches batches(a.t, b.t, batch_shape);
  const auto batch = collapse<2>("matmul", batch_shape, {batches.a_strides, batches.b_strides});
  if (out.dtype() == DType::bf16) {  // the bias is added to the float32 sums, before their one rounding
    const auto gemm = [](const MatrixOperand& x) {
      return cuda::Bf16GemmOperand{x.t.data<bfloat16>(), x.ld, x.transposed};
    };
    const bfloat16* bias_data = bias.defined() ? bias.data<bfloat16>() : nullptr;
    cuda::gemm_bf16(out.data<bfloat16>(), gemm(a), gemm(b), bias_data, m, n, k, batch, stream_of(out));
    return out;
  }
  const auto gemm = [](const MatrixOperand& x) { return cuda::GemmOperand{x.t.data<float>(), x.ld, x.transposed}; };
  // The bias added to the float32 sums as C is stored (the CPU writes it into C before the product).
  const float* bias_data = bias.defined() ? bias.data<float>() : nullptr;
  cuda::sgemm(out.data<float>(), gemm(a), gemm(b), bias_data, m, n, k, batch, stream_of(out));
  return out;
}

// The GPU has no fused projection by heads or accumulating product: it
// declines them, and the dispatch composes them from matmul and the element-wise kernels.
Tensor linear_heads(const Tensor&, const Tensor&, const Tensor&, std::int64_t, std::int64_t) { return {}; }
bool matmul_add_(const Tensor&, const Tensor&, const Tensor&) { return false; }

// The MLP's GELU as C leaves the bfloat16 product (cuda/launchers.h's
// gemm_bf16_gelu*), where its pipelined kernel takes the product whole;
// declined elsewhere, and in float32, for the dispatch to compose. The operands
// come contiguous: x (N, in), weight (hidden, in) read as weight^T; g (N, out),
// weight (out, hidden), pre (N, hidden).
kernels::LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (x.dtype() != DType::bf16) return {};
  const std::int64_t n = x.size(0), in = x.size(1), hidden = weight.size(0);
  const cuda::Bf16GemmOperand a{x.data<bfloat16>(), in, false}, w_t{weight.data<bfloat16>(), in, true};
  if (!cuda::gemm_bf16_gelu_takes(a, w_t, n, hidden, in, false)) return {};  // before the outputs are made
  Tensor pre = empty({n, hidden}, {DType::bf16, x.device()}), out = empty({n, hidden}, {DType::bf16, x.device()});
  const bfloat16* bias_data = bias.defined() ? bias.data<bfloat16>() : nullptr;
  if (!cuda::gemm_bf16_gelu(pre.data<bfloat16>(), out.data<bfloat16>(), a, w_t, bias_data, n, hidden, in,
                            stream_of(out)))
    return {};
  return {pre, out};
}

Tensor matmul_gelu_grad(const Tensor& g, const Tensor& weight, const Tensor& pre) {
  if (g.dtype() != DType::bf16) return {};
  const std::int64_t n = g.size(0), out_features = g.size(1), hidden = weight.size(1);
  const cuda::Bf16GemmOperand a{g.data<bfloat16>(), out_features, false}, w{weight.data<bfloat16>(), hidden, false};
  if (!cuda::gemm_bf16_gelu_takes(a, w, n, hidden, out_features, true)) return {};
  Tensor dpre = empty({n, hidden}, {DType::bf16, g.device()});
  if (!cuda::gemm_bf16_gelu_grad(dpre.data<bfloat16>(), pre.data<bfloat16>(), a, w, n, hidden, out_features,
                                 stream_of(dpre)))
    return {};
  return dpre;
}

}  // namespace attograd::gpu
