// cross_entropy: fused log-softmax + negative log-likelihood, with its backward;
// linear_cross_entropy: a classifier and its loss, a chunk of rows at a time.
#include <algorithm>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/rows.h"
#include "tensor/kernels.h"

namespace attograd {

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets, std::int64_t ignore_index) {
  AG_CHECK(logits_in.defined() && targets.defined(), "cross_entropy", "logits and targets must be defined tensors");
  // In float32 under autocast: bfloat16 logits are widened by the kernel as it
  // reads them (no float32 copy of the (N, V) logits is kept for the backward),
  // and their gradient is rounded by it to bfloat16, as the cast's backward would.
  // Outside autocast, bfloat16 logits give a bfloat16 loss, as other ops' results.
  const Tensor& logits = logits_in;
  AG_CHECK(logits.dim() >= 1, "cross_entropy", "logits must have a class dim, got a scalar");
  const Shape lead(logits.sizes().begin(), logits.sizes().end() - 1);
  AG_CHECK(targets.sizes() == lead, "cross_entropy", "targets are {}, expected {} for logits {}",
           shape_str(targets.sizes()), shape_str(lead), shape_str(logits.sizes()));
  // The kernel sees (N, V) rows and (N) targets; a contiguous tensor views as that for free.
  const std::int64_t classes = logits.size(-1), rows = numel_of(lead);
  const Tensor flat = kernels::contiguous(logits);
  const Tensor logits2d = make_view(flat, {rows, classes}, contiguous_strides({rows, classes}), flat.offset());
  const Tensor targets_c = kernels::contiguous(targets);
  const Tensor targets1d = make_view(targets_c, {rows}, {1}, targets_c.offset());

  kernels::CrossEntropyResult r = kernels::cross_entropy_forward(logits2d, targets1d, ignore_index);
  const Tensor loss = record("cross_entropy", r.loss, {logits}, {logits2d, targets1d, r.lse},
                [ignore_index, count = r.count, sizes = logits.sizes()](
                    const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: loss = mean over counted rows of (lse - x[target]);
                  // so dx = (softmax(x) - onehot(target)) * g / count, 0 on ignored rows
                  const Tensor d = kernels::cross_entropy_backward(s[0], s[1], s[2], ignore_index, count, g.item());
                  return {make_view(d, sizes, contiguous_strides(sizes), d.offset())};
                });
  return logits.dtype() == DType::bf16 && !autocast_enabled() ? to(loss, DType::bf16) : loss;
}

namespace {
// Targets (N) other than ignore_index, counted on their device (in float32 on every device: ids and
// counts are exact in it below 2^24, and the ignore index is negative).
std::int64_t counted_rows(const Tensor& targets, std::int64_t ignore_index) {
  const Tensor ignored = kernels::binary(kernels::Binary::eq, kernels::cast(targets, DType::f32),
                                         full({}, static_cast<double>(ignore_index), {DType::f32, targets.device()}));
  const double n_ignored = kernels::sum(kernels::cast(ignored, DType::f32), {0}, false).item();
  return targets.size(0) - static_cast<std::int64_t>(std::llround(n_ignored));
}
}  // namespace

std::int64_t classifier_chunk_rows(std::int64_t classes) {
  constexpr std::int64_t kChunkBytes = std::int64_t{128} << 20, kMinRows = 64;
  const std::int64_t rows = kChunkBytes / (static_cast<std::int64_t>(sizeof(float)) * std::max<std::int64_t>(classes, 1));
  return std::max(kMinRows, rows / kMinRows * kMinRows);
}

Tensor linear_cross_entropy(const Tensor& x_in, const Tensor& weight_in, const Tensor& targets_in,
                            std::int64_t ignore_index, std::int64_t classes, std::int64_t chunk_rows) {
  const char* op = "linear_cross_entropy";
  AG_CHECK(x_in.defined() && weight_in.defined() && targets_in.defined(), op,
           "input, weight and targets must be defined tensors");
  // The product in bfloat16 under autocast, as linear's; the loss in float32, as cross_entropy's.
  const Tensor x = autocast_low(x_in), weight = autocast_low(weight_in);
  AG_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), op,
           "input {} does not match weight {} (classes, in)", shape_str(x.sizes()), shape_str(weight.sizes()));
  const Shape lead(x.sizes().begin(), x.sizes().end() - 1);
  AG_CHECK(targets_in.sizes() == lead, op, "targets are {}, expected {} for input {}", shape_str(targets_in.sizes()),
           shape_str(lead), shape_str(x.sizes()));
  if (classes == 0) classes = weight.size(0);
  AG_CHECK(classes >= 1 && classes <= weight.size(0), op, "classes {} is not in [1, the weight's {} rows]", classes,
           weight.size(0));
  if (chunk_rows == 0) chunk_rows = classifier_chunk_rows(classes);
  AG_CHECK(chunk_rows >= 1, op, "chunk_rows must be >= 1, got {}", chunk_rows);

  const Tensor x2 = rows::as_rows(x, x.size(-1));  // (N, in)
  const std::int64_t n = x2.size(0);
  const Tensor targets_c = kernels::contiguous(targets_in);
  const Tensor targets = make_view(targets_c, {n}, {1}, targets_c.offset());
  // The rows of the weight that are classes (a padded vocabulary's first rows).
  const Tensor w = make_view(weight, {classes, weight.size(1)}, weight.strides(), weight.offset());
  // As llm.c's classifier: the gradients are made in the forward, a chunk of logits at a time, so
  // that the logits are never whole and never made twice; the backward only scales them by g.
  const bool grads = grad_enabled() && (x.requires_grad() || weight.requires_grad());
  // The loss's divisor, the rows whose targets count: the chunks' own counts added up, except that a
  // gradient made chunk by chunk needs it before the first chunk, so then it is counted first.
  const std::int64_t count = grads ? counted_rows(targets, ignore_index) : -1;

  double loss_sum = 0;
  std::int64_t counted = 0;
  DType loss_dtype = DType::f32;
  Tensor loss;
  std::vector<Tensor> dx;
  // The weight's gradient, padded rows too (no loss reads them: zero), each chunk's product added onto
  // the classes' rows in place: one (classes, in) matrix for all the chunks, not one per chunk besides.
  const Tensor dw = grads ? zeros(weight.sizes(), {w.dtype(), w.device()}) : Tensor();
  const Tensor dw_classes = grads ? rows::row_range(dw, 0, classes) : Tensor();
  for (std::int64_t first = 0; first == 0 || first < n; first += chunk_rows) {  // once when n == 0
    const std::int64_t m = std::min(chunk_rows, n - first);
    const bool whole = m == n;
    const Tensor xc = rows::row_range(x2, first, m), tc = make_view(targets, {m}, {1}, targets.offset() + first);
    const Tensor logits = kernels::matmul(xc, rows::mT(w));
    const kernels::CrossEntropyResult r = kernels::cross_entropy_forward(logits, tc, ignore_index);
    loss_sum += r.loss.item() * static_cast<double>(r.count);
    counted += r.count;
    loss_dtype = r.loss.dtype();
    if (whole) loss = r.loss;  // one chunk: cross_entropy's own result, bit for bit
    if (!grads) continue;
    // d = (softmax(logits) - onehot(target)) / count, 0 on ignored rows: the kernel divides by a
    // count of its own rows, so a chunk of several passes 1 / count itself (one chunk passes
    // cross_entropy's arguments, for its bits).
    // Written over the logits: the chunk's memory is one such matrix.
    kernels::cross_entropy_backward_(logits, tc, r.lse, ignore_index, whole ? count : 1,
                                     whole || count == 0 ? 1.0 : 1.0 / static_cast<double>(count));
    const Tensor& d = logits;
    dx.push_back(kernels::matmul(d, w));
    kernels::matmul_add_(dw_classes, rows::mT(d), xc);
  }
  if (!loss.defined())  // several chunks: their sums added in order
    loss = to(full({}, counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0, {loss_dtype}), x.device());
  if (x.dtype() == DType::bf16 && !autocast_enabled()) loss = to(loss, DType::bf16);  // as cross_entropy's
  if (!grads) return loss;

  Tensor dx_all = n == 0 ? zeros(x.sizes(), {x.dtype(), x.device()}) : dx.size() == 1 ? dx[0] : kernels::cat(dx, 0);
  dx_all = make_view(dx_all, x.sizes(), contiguous_strides(x.sizes()), dx_all.offset());
  return record(op, loss, {x, weight}, {dx_all, dw},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: loss = mean over counted rows of (lse - logits[target]), logits = x W^T;
                  // so dx = d W and dW = d^T x with d = (softmax(logits) - onehot(target)) g / count,
                  // made in the forward with g = 1.
                  const double scale = g.item();
                  if (scale == 1.0) return {s[0], s[1]};
                  return {kernels::unary(kernels::Unary::mul_scalar, s[0], scale),
                          kernels::unary(kernels::Unary::mul_scalar, s[1], scale)};
                });
}

}  // namespace attograd
