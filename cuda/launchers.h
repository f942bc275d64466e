#pragma once
// Every CUDA kernel of attograd, as the host sees it: a launcher per kernel
// family taking raw device pointers, sizes, strides and the stream to launch
// on (always given explicitly; see cuda/stream.h). Launchers check every
// launch (CUDA_CHECK) and return without waiting for the kernel. They assume
// their inputs were validated by the dispatch (tensor/dispatch*.cpp); the bridges in
// cuda/bridge/ turn Tensors into these arguments.
//
// Element types: T is float or double unless said otherwise; matmul, attention
// and AdamW are float32 only (float64 is the CPU's reference dtype).
#include <cuda_runtime.h>

#include <cstdint>

#include "base/attention_problem.h"
#include "base/bfloat16.h"
#include "base/elementwise_ops.h"
#include "cuda/strided.h"

namespace attograd::cuda {

// ---- elementwise (cuda/elementwise.cu) ---------------------------------------------
// The ops of base/elementwise_ops.h (attograd::UnaryOp and BinaryOp), as
// tensor/kernels.h names them too. T is float, double or bfloat16 here; a
// bfloat16 op computes in float32 (compute_t, base/bfloat16.h) and rounds once
// on the way out, as the CPU's bfloat16 loops do, its scalar a float32 as theirs is.
// Operand 0 of every layout is the output. `s` is the scalar of the *_scalar ops.
template <typename T>
void unary(UnaryOp op, T* out, const T* x, compute_t<T> s, const StridedLayout<2>& layout, cudaStream_t stream);
// Arithmetic ops write T; the comparisons (gt, lt, eq) write bool through `compare`.
template <typename T>
void binary(BinaryOp op, T* out, const T* a, const T* b, const StridedLayout<3>& layout, cudaStream_t stream);
// float32 with a bfloat16 operand (A, B one of each): float32's op on the
// bfloat16 operand widened as it is read, the CPU's, without a widened copy.
template <typename A, typename B>
void binary_widening(BinaryOp op, float* out, const A* a, const B* b, const StridedLayout<3>& layout,
                     cudaStream_t stream);
template <typename T>
void compare(BinaryOp op, bool* out, const T* a, const T* b, const StridedLayout<3>& layout, cudaStream_t stream);
// out = mask ? a : b; T is any of float, double, int64, bool, bfloat16.
template <typename T>
void where(T* out, const bool* mask, const T* a, const T* b, const StridedLayout<4>& layout, cudaStream_t stream);
// dst = static_cast<Out>(src), for every pair of float, double, int64, bool
// and bfloat16 (rounded to nearest even from float32, as on the CPU).
template <typename Out, typename In>
void copy(Out* dst, const In* src, const StridedLayout<2>& layout, cudaStream_t stream);
template <typename T>  // any of the five
void fill(T* dst, T value, const StridedLayout<1>& layout, cudaStream_t stream);
// y += alpha * x, in place (operand 0 is y, read and written).
template <typename T>
void add_scaled(T* y, const T* x, compute_t<T> alpha, const StridedLayout<2>& layout, cudaStream_t stream);

// ---- reductions (cuda/reduce.cu) ---------------------------------------------------------
// The input's dims split in two: `kept` (the output's dims, written
// contiguously in their order) and `reduced`; each layout has one operand:
// the input's strides over those dims.
struct ReduceLayout {
  StridedLayout<1> kept;
  StridedLayout<1> reduced;
};
// out = sum over the reduced dims, accumulated in float64 like the CPU; T is
// float, double or bfloat16 (read as it is, the sum rounded once).
template <typename T>
void sum(T* out, const T* x, const ReduceLayout& layout, cudaStream_t stream);
// out[i] = partial[0 * n + i] + partial[1 * n + i] + ... over `chunks` rows of
// float64 partial sums (a column sum's first pass), as sum's second pass adds them.
template <typename T>
void sum_column_partials(T* out, const double* partial, std::int64_t chunks, std::int64_t n, cudaStream_t stream);
// Max over one reduced dim, with the index of its first maximum (a NaN wins, as on the CPU).
template <typename T>
void max(T* values, std::int64_t* indices, const T* x, const ReduceLayout& layout, cudaStream_t stream);

// ---- matmul (cuda/matmul.cu) ---------------------------------------------------------------
// One operand of C = A B as it lies in memory: element (r, c) of the logical
// matrix is data[r * ld + c], or data[c * ld + r] when `transposed`.
template <typename T>
struct MatrixOperandOf {
  const T* data;
  std::int64_t ld;
  bool transposed;
};
using GemmOperand = MatrixOperandOf<float>;
// C (batch..., M, N), contiguous, = A (M, K) @ B (K, N) (+ bias, n values added
// to every row as C is stored) for every batch index; `batch` is the broadcast
// batch shape with A's (operand 0) and B's (operand 1) strides over it, 0 on
// broadcast dims. K may be 0 (C is then zero, or the bias).
void sgemm(float* c, GemmOperand a, GemmOperand b, const float* bias, std::int64_t m, std::int64_t n, std::int64_t k,
           const StridedLayout<2>& batch, cudaStream_t stream);

// ---- bfloat16 matmul (cuda/matmul_bf16.cu) ---------------------------------------------------
// sgemm's problem on bfloat16 operands, on the tensor cores with float32 sums:
// C = A B (+ bias, added to every row in float32), each sum rounded once to
// bfloat16, as the CPU's bfloat16 product rounds its float32 ones.
using Bf16GemmOperand = MatrixOperandOf<bfloat16>;
void gemm_bf16(bfloat16* c, Bf16GemmOperand a, Bf16GemmOperand b, const bfloat16* bias, std::int64_t m,
               std::int64_t n, std::int64_t k, const StridedLayout<2>& batch, cudaStream_t stream);
// The MLP's products with GELU applied as C leaves the pipelined kernel, for
// one m x n C whose operands that kernel takes whole (aligned, enough tiles
// for every SM, no slices of K), with C, act and pre 16-byte aligned:
// gemm_bf16_gelu gives c = a b + bias and act = gelu(c) (kernels::linear_gelu),
// gemm_bf16_gelu_grad c = (a b) gelu'(pre) (kernels::matmul_gelu_grad), each
// value the composed ops' bits. false, with nothing written, elsewhere.
// gemm_bf16_gelu_takes says which (grad: gemm_bf16_gelu_grad) would take a
// product, its outputs aligned (as fresh buffers are), before they are made.
bool gemm_bf16_gelu_takes(Bf16GemmOperand a, Bf16GemmOperand b, std::int64_t m, std::int64_t n, std::int64_t k,
                          bool grad);
bool gemm_bf16_gelu(bfloat16* c, bfloat16* act, Bf16GemmOperand a, Bf16GemmOperand b, const bfloat16* bias,
                    std::int64_t m, std::int64_t n, std::int64_t k, cudaStream_t stream);
bool gemm_bf16_gelu_grad(bfloat16* c, const bfloat16* pre, Bf16GemmOperand a, Bf16GemmOperand b, std::int64_t m,
                         std::int64_t n, std::int64_t k, cudaStream_t stream);

// ---- row ops over the last dim of contiguous (rows, n) buffers (cuda/softmax.cu) ------------
template <typename T>
void softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t n, cudaStream_t stream);
template <typename T>  // dx = y * (dy - sum(dy * y))
void softmax_backward(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t n, cudaStream_t stream);
template <typename T>
void log_softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t n, cudaStream_t stream);
template <typename T>  // dx = dy - exp(y) * sum(dy)
void log_softmax_backward(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t n, cudaStream_t stream);

// ---- layer norm (cuda/layer_norm.cu) -----------------------------------------------------
// weight and bias may be null. mean and rstd are (rows). y (Y) and dy (G) are
// x's type T, or bfloat16 for a float32 x (autocast: y rounded once as it is
// stored, dy widened as it is read).
template <typename T, typename Y = T>
void layer_norm_forward(Y* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias, std::int64_t rows,
                        std::int64_t n, double eps, cudaStream_t stream);
// dweight is null when there is no weight; dbias is always written.
template <typename T, typename G = T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const G* dy, const T* x, const T* weight, const T* mean,
                         const T* rstd, std::int64_t rows, std::int64_t n, cudaStream_t stream);

// ---- cross-entropy fused with log-softmax (cuda/cross_entropy.cu) --------------------------
// logits (rows, n); writes lse (rows), the scalar mean loss over rows whose
// target != ignore_index (0 when there are none) and that row count. The
// logits (L) are T, or bfloat16 with T float32 (autocast: widened as read).
template <typename T, typename L = T>
void cross_entropy_forward(T* loss, T* lse, std::int64_t* count, const L* logits, const std::int64_t* targets,
                           std::int64_t rows, std::int64_t n, std::int64_t ignore_index, cudaStream_t stream);
// dlogits = (exp(logits - lse) - onehot(target)) * scale, zero on ignored rows
// (and everywhere when count == 0), in the logits' type (rounded once when bfloat16).
template <typename T, typename L = T>
void cross_entropy_backward(L* dlogits, const L* logits, const std::int64_t* targets, const T* lse, std::int64_t rows,
                            std::int64_t n, std::int64_t ignore_index, std::int64_t count, T scale,
                            cudaStream_t stream);

// ---- embedding (cuda/embedding.cu) ---------------------------------------------------------
// out (count, channels) = weight rows picked by ids (count); ids are in range.
template <typename T>
void embedding_forward(T* out, const T* weight, const std::int64_t* ids, std::int64_t count, std::int64_t channels,
                       cudaStream_t stream);
// dweight (num_rows, channels): row v sums the dy rows i with ids[i] == v, in increasing i from
// zero, as the CPU does (deterministic, and the same bits).
template <typename T>
void embedding_backward(T* dweight, const T* dy, const std::int64_t* ids, std::int64_t count, std::int64_t channels,
                        std::int64_t num_rows, cudaStream_t stream);

// ---- dropout (cuda/dropout.cu) -------------------------------------------------------------
// mask[i] = philox_uniform(seed, offset, i) < threshold ? 0 : keep, bit for bit
// what cpu/dropout.cpp draws (base/philox.h).
template <typename T>
void dropout_mask(T* mask, std::int64_t n, float threshold, T keep, std::uint64_t seed, std::uint64_t offset,
                  cudaStream_t stream);

// ---- AdamW (cuda/adamw.cu) -------------------------------------------------------------------
// The scalars of one step, folded on the host in float64 exactly as
// cpu/adamw.cpp folds them.
struct AdamWScalars {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
};
// One parameter's n contiguous elements, its gradient and moments.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  std::int64_t n;
  float decay;  // 1 - lr * weight_decay
};
// One fused pass over each tensor, up to 32 tensors a launch:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p = p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps)
void adamw_step(const AdamWTensor* tensors, int count, const AdamWScalars& s, cudaStream_t stream);

// ---- gradient clipping (cuda/grad_clip.cu) -------------------------------------------------
// n contiguous float32 values.
struct FloatSpan {
  float* data;
  std::int64_t n;
};
// Scratch for sum_of_squares: a float64 partial sum for each of its blocks.
std::int64_t sum_of_squares_blocks(const FloatSpan* tensors, int count);
// *result (device memory) = the sum of every value's square, in float64, in
// an order fixed by the tensors' sizes; partials holds sum_of_squares_blocks values.
void sum_of_squares(const FloatSpan* tensors, int count, double* partials, double* result, cudaStream_t stream);
// Each value times scale, as mul_scalar: up to 32 tensors a launch.
void scale(const FloatSpan* tensors, int count, float scale, cudaStream_t stream);

// ---- fused causal attention (cuda/attention.cu) ------------------------------------------
// The problem both devices compute (base/attention_problem.h: operands,
// sizes, masking and dropout), in float32; kernels::attention_forward builds
// it (tensor/attention_call.h). D <= kAttentionMaxHeadDim (cuda/runtime.h).
using AttentionProblem = ::attograd::AttentionProblem<float>;
using AttentionRows = ::attograd::AttentionRows<const float>;
// out rows at out + b*out_sb + h*out_sh + i*out_st; lse (B, H, Tq) contiguous,
// -inf on rows whose keys are all hidden (their out row is zero); weights
// (B, H, Tq, Tk) contiguous when not null: the softmax before dropout.
void attention_forward(const AttentionProblem& p, float* out, std::int64_t out_sb, std::int64_t out_sh,
                       std::int64_t out_st, float* lse, float* weights, cudaStream_t stream);
// dq (B, H, Tq, D), dk and dv (B, H, Tk, D), contiguous, from the saved out and lse.
void attention_backward(const AttentionProblem& p, AttentionRows dout, AttentionRows out, const float* lse, float* dq,
                        float* dk, float* dv, cudaStream_t stream);

// ---- bfloat16 fused attention (cuda/attention_bf16.cu) ----------------------------------
// The same problem on bfloat16 rows (`settings` gives sizes, scale, masking
// and dropout; its own rows are unused): the products on the tensor cores with
// float32 sums, the softmax's statistics and lse in float32, and the
// probabilities and dS rounded to bfloat16 as the operands of their products,
// as the CPU's bfloat16 attention computes it (cpu/attention/).
struct Bf16AttentionOperands {
  ::attograd::AttentionRows<const bfloat16> q, k, v;  // (B, H, T, D), rows contiguous
  // Every row of every operand and output (dout and the gradients in the
  // backward) starts 16 bytes aligned, and D is a multiple of 8: the kernels
  // then move 8 values at a time.
  bool vec = false;
};
using Bf16AttentionOutput = ::attograd::AttentionRows<bfloat16>;  // rows contiguous
void attention_forward_bf16(const AttentionProblem& settings, const Bf16AttentionOperands& x, Bf16AttentionOutput out,
                            float* lse, cudaStream_t stream);
void attention_backward_bf16(const AttentionProblem& settings, const Bf16AttentionOperands& x,
                             ::attograd::AttentionRows<const bfloat16> dout, ::attograd::AttentionRows<const bfloat16> out,
                             const float* lse, Bf16AttentionOutput dq, Bf16AttentionOutput dk, Bf16AttentionOutput dv,
                             cudaStream_t stream);

}  // namespace attograd::cuda
