#pragma once
// Raw compute on tensors: no autograd, no graph. Every function here checks its
// inputs (dtype, device, shapes) and dispatches to the CPU or CUDA
// implementation in tensor/dispatch*.cpp, the one place where that choice is
// made. autograd/ops wraps these into differentiable ops.
#include <cstdint>
#include <optional>
#include <vector>

#include "base/elementwise_ops.h"
#include "tensor/tensor.h"

namespace attograd::kernels {

// ---- elementwise -----------------------------------------------------------
// The ops are listed once, in base/elementwise_ops.h, for every device.
using Unary = UnaryOp;
using Binary = BinaryOp;
const char* unary_name(Unary op);
Tensor unary(Unary op, const Tensor& x, double s = 0.0);

// Binary ops broadcast (NumPy rules); both operands must share dtype and device.
const char* binary_name(Binary op);
Tensor binary(Binary op, const Tensor& a, const Tensor& b);

// mask ? a : b, all three broadcast together; mask is bool.
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b);

// ---- copies, casts, fills ----------------------------------------------------
// dst = src, with src broadcast to dst's shape and cast to dst's dtype; any devices.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
// y += alpha * x (x broadcast to y), in place.
void add_(const Tensor& y, const Tensor& x, double alpha = 1.0);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
Tensor cast(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

// ---- reductions --------------------------------------------------------------
// Sum over `dims` (all dims when empty), keeping them as size 1 when keepdim.
Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim);
struct MaxResult {
  Tensor values;   // x's shape with `dim` reduced
  Tensor indices;  // int64, same shape: position of the first maximum along dim
};
MaxResult max(const Tensor& x, int dim, bool keepdim);
// Reduces a broadcast gradient back to `shape` (sums the broadcast dims).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ------------------------------------------------------------
// a (..., M, K) @ b (..., K, N) -> (..., M, N); batch dims broadcast; both >= 2-D.
// Transposed views go to BLAS as transpose flags, not copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// a @ b + bias, bias (N) added to every row, in one pass over the output (linear's forward).
Tensor matmul(const Tensor& a, const Tensor& b, const Tensor& bias);
// A projection laid out head by head: y (B, parts, heads, T, D) = x (B, T, in)
// @ weight^T + bias, weight (parts * heads * D, in), bias (parts * heads * D)
// or undefined; y[b, p, h] holds columns (p * heads + h) * D on of batch b's
// product, a (T, D) matrix with contiguous rows, as the fused attention reads
// q, k and v (MultiHeadAttention's packed projection). Where a device's kernel
// writes heads in place (the CPU's float32 kernel, when its blocks of columns
// do not straddle two heads: cpu/linear_heads.h), y is contiguous, each head's
// rows back to back; elsewhere y is the (B T, parts * heads * D) product seen
// head by head through strides, with no copy.
Tensor linear_heads(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts,
                    std::int64_t heads);
// The MLP's products with its GELU (autograd mlp, nn::MLP): linear_gelu gives
// pre = x @ weight^T + bias and out = gelu(pre), x (N, in), weight (hidden,
// in); matmul_gelu_grad gives (g @ weight) * gelu'(pre), GELU's backward made
// with the product that makes its incoming gradient, g (N, out), weight (out,
// hidden). On the CPU in float32 the product's kernel applies GELU to C's rows
// as it stores them (cpu/matmul.cpp), on the GPU in bfloat16 the pipelined
// product's epilogue as C leaves it (where that kernel takes the product:
// cuda/launchers.h's gemm_bf16_gelu); elsewhere matmul and the element-wise
// kernels. The same values either way, to the bit.
struct LinearGelu {
  Tensor pre, out;  // (N, hidden)
};
LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor matmul_gelu_grad(const Tensor& g, const Tensor& weight, const Tensor& pre);
// c += a @ b, c (M, N), a (M, K), b (K, N), all of one dtype and device: the
// product's sums added onto c where the device's kernel can (the CPU's float32
// kernel, into a contiguous c), else a product and add_.
void matmul_add_(const Tensor& c, const Tensor& a, const Tensor& b);

// ---- fused row ops (over the last dim of a tensor) -------------------------------
Tensor softmax_forward(const Tensor& x);                        // y
Tensor softmax_backward(const Tensor& y, const Tensor& dy);     // dx = y * (dy - sum(dy * y))
Tensor log_softmax_forward(const Tensor& x);                    // y
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy); // dx = dy - exp(y) * sum(dy)

struct LayerNormResult {
  Tensor y;     // x's shape
  Tensor mean;  // x's shape without the last dim
  Tensor rstd;  // 1 / sqrt(var + eps), same shape as mean
};
// y in y_dtype: x's, or bfloat16 for a float32 x (y rounded once, as the cast
// of the float32 y would round it, without that y in memory: a LayerNorm that
// feeds products under autocast; mean and rstd stay float32).
LayerNormResult layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                   std::optional<DType> y_dtype = std::nullopt);
struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};
// dy in x's dtype, or bfloat16 for a float32 x (the gradient of a bfloat16 y,
// read as it is: the widened dy's grads, bit for bit).
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd);

// Rows of `weight` (V, C) picked by int64 `ids` of any shape: ids.shape + (C).
Tensor embedding_forward(const Tensor& weight, const Tensor& ids);
// Scatter-adds dy rows into a zero (V, C) gradient.
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, std::int64_t num_rows);

struct CrossEntropyResult {
  Tensor loss;   // scalar: mean over targets != ignore_index (0 when none)
  Tensor lse;    // (N) log-sum-exp of each row
  std::int64_t count = 0;  // rows that counted
};
// logits (N, V), targets int64 (N); fused log-softmax + NLL. bfloat16 logits
// (autocast's) are read as they are, the loss and lse float32: the float32
// result of the widened logits, bit for bit, without widening a copy.
CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index);
// dlogits = (softmax(logits) - onehot(target)) * dloss / count, zero on ignored
// rows, in the logits' dtype (bfloat16: the float32 gradient rounded once; lse
// float32, the forward's).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              std::int64_t ignore_index, std::int64_t count, double dloss);
// The same written over the (contiguous) logits: a classifier's chunk of them
// and their gradient are never in memory side by side.
void cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             std::int64_t ignore_index, std::int64_t count, double dloss);

// Inverted-dropout scale mask: 0 with probability p, else 1/(1-p); element i of
// the (contiguous) mask is decided by philox(seed, offset + i), identically on every device.
Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, TensorOptions options);

// Concatenation along dim; all other dims must agree.
Tensor cat(const std::vector<Tensor>& xs, int dim);

// ---- attention (fused: cpu/attention/, cuda/attention.cu) ----------------------------------
// softmax(scale * q k^T, hiding masked keys) @ v over (B, H, T, D) tensors,
// blocked with an online softmax: no (Tq, Tk) buffer unless weights are asked for.
struct AttentionKernelOptions {
  bool causal = false;       // key j visible to query i only when j <= i (top-left aligned)
  double scale = 1.0;        // usually 1 / sqrt(D)
  double dropout_p = 0.0;    // weight (b,h,i,j) dropped when philox_uniform(seed, offset, flat index) < p
  std::uint64_t seed = 0, offset = 0;
  bool return_weights = false;  // also write the (B, H, Tq, Tk) softmax, before dropout
  // Up to this many bytes, the CPU forward keeps probability tiles for the
  // backward, whole heads of them, which it then need not recompute (see
  // cpu/attention/saved_probs.h).
  std::int64_t probs_budget = 0;
};
struct AttentionForwardResult {
  Tensor out;      // (B, H, Tq, D); zeros on rows whose keys are all hidden
  Tensor lse;      // (B, H, Tq) log-sum-exp of each scaled, masked score row; -inf when all hidden
  Tensor weights;  // (B, H, Tq, Tk) when asked for
  Tensor probs;    // the probability tiles kept within probs_budget (the first heads'), for attention_backward
};
// The check of attention's operands every entry makes (these two, and the
// attention op of autograd/attention.h before it reserves dropout draws): q,
// k, v floating (B, H, T, D) tensors of one dtype and device sharing B, H and
// D, k and v of one shape; a mask, when given, bool on q's device and
// broadcasting to the scores (B, H, Tq, Tk). Throws "[op] ..." naming them.
void check_attention_operands(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);
// The bytes the CPU forward keeps of its probability tiles within `budget`
// (probs_budget), for `heads` (B * H) heads of Tq queries and Tk keys of
// element_bytes each: the tiles of as many whole heads as fit. Answered by the
// CPU backend (cpu/attention/attention.cpp); the GPU keeps none.
std::int64_t attention_probs_bytes(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal,
                                   std::int64_t element_bytes, std::int64_t budget);
// mask: undefined or bool broadcastable to (B, H, Tq, Tk), true = hidden.
AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                         const AttentionKernelOptions& options);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
// The gradients are written into `into`'s tensors where defined (each shaped as
// its input, last dim contiguous: e.g. views of one packed (B, T, 3, H, D)
// gradient, see autograd's attention_packed), else into new contiguous ones.
// probs: the forward's, or undefined (the kernel recomputes the probabilities).
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& probs,
                                  const AttentionKernelOptions& options, const AttentionGrads& into = {});

// Which CPU kernels the products run on, answered by the CPU backend (cpu/matmul.cpp).
// The kernel bfloat16 matrix products run on here: "amx", "avx512_bf16" or
// "widen" (a float32 kernel, widening_matmul_kernel()), or the one
// ATTOGRAD_BF16_ISA names.
const char* bf16_matmul_kernel();

// The kernel float32 matrix products run on here: "avx512" (ours), "openblas",
// or "portable" (ours on 16-byte vectors), or the one ATTOGRAD_F32_GEMM names.
const char* f32_matmul_kernel();

// The float32 kernel that bfloat16 products widened to float32 run on: ours
// ("avx512", "avx2"), which widens the operands as it packs them, where it runs.
const char* widening_matmul_kernel();

// ---- optimizer updates (cpu/adamw.cpp) -------------------------------------
struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  std::int64_t step;  // 1 for the first update (bias corrections use it)
};
// One AdamW update in place, as torch.optim.AdamW: p *= 1 - lr wd;
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// param, m, v contiguous; grad any layout of the same shape; one dtype and device.
void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& step);
// One parameter of a multi-parameter AdamW update.
struct AdamWParameter {
  Tensor param, grad, m, v;
  bool decay = true;  // step.weight_decay applies; else none (AdamW keeps it off biases and gains)
};
// The update of several parameters at once, each exactly as adamw_step_ (with
// weight_decay 0 where !decay) would make it. On the GPU one launch updates up
// to 32 of them, where a small model's step would otherwise be a launch per parameter.
void adamw_step_(const std::vector<AdamWParameter>& params, const AdamWStep& step);

// ---- gradient clipping over many tensors at once (cpu/grad_clip.cpp) -------------
// The sum of every element's square over all of `tensors` (float32, or float64
// on the CPU; contiguous; one device), each square and the sums in float64,
// in an order fixed by the tensors' sizes alone: the same bits whatever the
// number of threads. On the GPU a launch reads up to 32 tensors and the host
// waits once, for the result, where a sum a tensor would wait once a tensor.
double sum_of_squares(const std::vector<Tensor>& tensors);
// Each tensor's elements times `scale`, in place, the bits mul_scalar would
// give (the scale rounded to the tensor's dtype): one launch for up to 32
// tensors on the GPU.
void scale_(const std::vector<Tensor>& tensors, double scale);

}  // namespace attograd::kernels
