// Batched matmul on CUDA tensors (float32), with an optional bias added to
// every row: each operand goes to the SGEMM of
// cuda/matmul.cu as it lies in memory when its last two dims are row-major or
// column-major (a transposed view), exactly as the CPU hands operands to BLAS;
// anything else is copied to contiguous first.
#include "tensor/cuda/launch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::gpu {
namespace {

// Element strides of t's batch dims over the broadcast batch shape (0 where broadcast).
Shape batch_strides(const Tensor& t, const Shape& batch_shape) {
  const Shape sizes(t.sizes().begin(), t.sizes().end() - 2), strides(t.strides().begin(), t.strides().end() - 2);
  return broadcast_strides(sizes, strides, batch_shape);
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias) {
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  Tensor out = matmul_output(a_in, b_in, batch_shape);
  if (out.numel() == 0) return out;
  const MatrixOperand a = matrix_operand(a_in), b = matrix_operand(b_in);
  const auto gemm = [](const MatrixOperand& x) { return cuda::GemmOperand{x.t.data<float>(), x.ld, x.transposed}; };
  const auto batch = collapse<2>("matmul", batch_shape, {batch_strides(a.t, batch_shape), batch_strides(b.t, batch_shape)});
  cuda::sgemm(out.data<float>(), gemm(a), gemm(b), m, n, k, batch, stream_of(out));
  // The bias in a second pass over C (the CPU writes it into C before the product).
  if (bias.defined()) add_(out, bias, 1.0);
  return out;
}

}  // namespace attograd::gpu
