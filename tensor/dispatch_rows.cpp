// Checks and routing of the fused row ops (softmax, log-softmax, layer norm,
// cross-entropy), the gathers (embedding), joins (cat) and dropout masks: the
// part of the dispatch (tensor/dispatch.cpp) for ops over rows.
#include <algorithm>
#include <cmath>
#include <optional>

#include "tensor/dispatch_checks.h"

namespace attograd::kernels {
namespace {

// A floating tensor with at least one dim: the rows of a fused row op.
void check_rows(const char* op, const Tensor& x, const char* what) {
  check_defined(op, x, what);
  check_floating(op, x);
  AG_CHECK(x.dim() >= 1, op, "{} must have at least one dim, got a scalar", what);
}

// b must have a's shape and device, whatever its dtype.
void check_shaped_like(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  check_defined(op, b, b_name);
  check_same_device(op, a, b);
  AG_CHECK(a.sizes() == b.sizes(), op, "{} is {}, expected the shape of {} {}", b_name, shape_str(b.sizes()),
           a_name, shape_str(a.sizes()));
}

// b must look exactly like a (shape, dtype, device): a gradient beside its forward value.
void check_like(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  check_shaped_like(op, a, a_name, b, b_name);
  check_same_dtype(op, a, b);
}

// A row op's backward: its output y and the gradient dy that comes back for it.
void check_row_grad(const char* op, const Tensor& y, const Tensor& dy) {
  check_rows(op, y, "output");
  check_like(op, y, "output", dy, "grad");
}

void check_int64(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  AG_CHECK(t.dtype() == DType::i64, op, "{} must be int64, got {} {}", what, dtype_name(t.dtype()),
           shape_str(t.sizes()));
}

// Every index in `t` lies in [0, n), or equals `exempt` (the ignore_index of a loss).
// "[cross_entropy] target 70 out of range for 65 classes at position 3".
void check_indices(const char* op, const Tensor& t, std::int64_t n, const char* what, const char* of,
                   std::optional<std::int64_t> exempt = std::nullopt) {
  const Tensor packed = contiguous(to_device(t, Device::cpu()));  // read on the host
  const std::int64_t* v = packed.data<std::int64_t>();
  for (std::int64_t i = 0; i < packed.numel(); ++i)
    if ((v[i] < 0 || v[i] >= n) && v[i] != exempt)
      fail(op, "{} {} out of range for {} {} at position {}", what, v[i], n, of, i);
}

// An optional per-channel parameter of layer_norm: undefined, or shape (C) like x.
void check_channel_param(const Tensor& x, const Tensor& p, const char* what) {
  if (!p.defined()) return;
  check_same_device("layer_norm", x, p);
  check_same_dtype("layer_norm", x, p);
  AG_CHECK(p.sizes() == Shape{x.size(-1)}, "layer_norm", "{} is {}, expected [{}] (the last dim of the input {})",
           what, shape_str(p.sizes()), x.size(-1), shape_str(x.sizes()));
}

}  // namespace

Tensor softmax_forward(const Tensor& x) {
  check_rows("softmax", x, "input");
  if (is_bf16(x)) return to_bf16(softmax_forward(widen(x)));
  return AG_DEVICE_KERNEL(x, softmax_forward)(dense(x));
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  check_row_grad("softmax backward", y, dy);
  if (is_bf16(y)) return to_bf16(softmax_backward(widen(y), widen(dy)));
  return AG_DEVICE_KERNEL(y, softmax_backward)(dense(y), dense(dy));
}

Tensor log_softmax_forward(const Tensor& x) {
  check_rows("log_softmax", x, "input");
  if (is_bf16(x)) return to_bf16(log_softmax_forward(widen(x)));
  return AG_DEVICE_KERNEL(x, log_softmax_forward)(dense(x));
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  check_row_grad("log_softmax backward", y, dy);
  if (is_bf16(y)) return to_bf16(log_softmax_backward(widen(y), widen(dy)));
  return AG_DEVICE_KERNEL(y, log_softmax_backward)(dense(y), dense(dy));
}

LayerNormResult layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                   std::optional<DType> y_dtype) {
  check_rows("layer_norm", x, "input");
  check_channel_param(x, weight, "weight");
  check_channel_param(x, bias, "bias");
  AG_CHECK(eps >= 0 && std::isfinite(eps), "layer_norm", "eps must be finite and >= 0, got {}", eps);
  AG_CHECK(x.size(-1) > 0, "layer_norm", "cannot normalise an empty last dim of {}", shape_str(x.sizes()));
  const DType y_type = y_dtype.value_or(x.dtype());
  AG_CHECK(y_type == x.dtype() || (y_type == DType::bf16 && x.dtype() == DType::f32), "layer_norm",
           "a {} result of a {} input: the result is the input's dtype, or bfloat16 from float32", dtype_name(y_type),
           dtype_name(x.dtype()));
  if (is_bf16(x)) {
    const LayerNormResult r = layer_norm_forward(widen(x), widen(weight), widen(bias), eps);
    return {to_bf16(r.y), to_bf16(r.mean), to_bf16(r.rstd)};
  }
  return AG_DEVICE_KERNEL(x, layer_norm_forward)(dense(x), dense(weight), dense(bias), eps, y_type);
}

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd) {
  const char* op = "layer_norm backward";
  check_rows(op, x, "input");
  const bool bf16_grad = is_bf16(dy) && x.dtype() == DType::f32;  // of a bfloat16 y (layer_norm_forward's y_dtype)
  if (bf16_grad)
    check_shaped_like(op, x, "input", dy, "grad");
  else
    check_like(op, x, "input", dy, "grad");
  check_channel_param(x, weight, "weight");
  const Shape rows(x.sizes().begin(), x.sizes().end() - 1);
  for (const Tensor* stat : {&mean, &rstd}) {
    check_defined(op, *stat, "saved statistic");
    check_same_dtype(op, x, *stat);
    check_same_device(op, x, *stat);
    AG_CHECK(stat->sizes() == rows, op, "saved statistic is {}, expected {}", shape_str(stat->sizes()),
             shape_str(rows));
  }
  if (is_bf16(x)) {
    const LayerNormGrads g = layer_norm_backward(widen(dy), widen(x), widen(weight), widen(mean), widen(rstd));
    return {to_bf16(g.dx), to_bf16(g.dweight), to_bf16(g.dbias)};
  }
  return AG_DEVICE_KERNEL(x, layer_norm_backward)(dense(dy), dense(x), dense(weight), dense(mean), dense(rstd));
}

Tensor embedding_forward(const Tensor& weight, const Tensor& ids) {
  check_defined("embedding", weight, "weight");
  AG_CHECK(weight.dim() == 2, "embedding", "weight must be 2-d (rows, channels), got {}", shape_str(weight.sizes()));
  check_int64("embedding", ids, "ids");
  check_same_device("embedding", weight, ids);
  check_indices("embedding", ids, weight.size(0), "id", "rows");
  if (is_bf16(weight)) return to_bf16(embedding_forward(widen(weight), ids));
  return AG_DEVICE_KERNEL(weight, embedding_forward)(dense(weight), dense(ids));
}

Tensor embedding_backward(const Tensor& dy, const Tensor& ids, std::int64_t num_rows) {
  const char* op = "embedding backward";
  check_rows(op, dy, "grad");
  check_int64(op, ids, "ids");
  check_same_device(op, dy, ids);
  Shape expected = ids.sizes();
  expected.push_back(dy.size(-1));
  AG_CHECK(dy.sizes() == expected, op, "grad is {}, expected {} (the ids' shape plus channels)",
           shape_str(dy.sizes()), shape_str(expected));
  AG_CHECK(num_rows > 0, op, "num_rows must be positive, got {}", num_rows);
  check_indices(op, ids, num_rows, "id", "rows");
  if (is_bf16(dy)) return to_bf16(embedding_backward(widen(dy), ids, num_rows));
  return AG_DEVICE_KERNEL(dy, embedding_backward)(dense(dy), dense(ids), num_rows);
}

CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index) {
  check_rows("cross_entropy", logits, "logits");
  AG_CHECK(logits.dim() == 2, "cross_entropy", "logits must be 2-d (N, V), got {}", shape_str(logits.sizes()));
  AG_CHECK(logits.size(1) > 0, "cross_entropy", "logits {} have no classes", shape_str(logits.sizes()));
  check_int64("cross_entropy", targets, "targets");
  check_same_device("cross_entropy", logits, targets);
  AG_CHECK(targets.sizes() == Shape{logits.size(0)}, "cross_entropy", "targets are {}, expected [{}] for logits {}",
           shape_str(targets.sizes()), logits.size(0), shape_str(logits.sizes()));
  check_indices("cross_entropy", targets, logits.size(1), "target", "classes", ignore_index);
  return AG_DEVICE_KERNEL(logits, cross_entropy_forward)(dense(logits), dense(targets), ignore_index);
}

namespace {
// The backward's checks, and dx = its gradient written by the device's kernel (dx may be the logits).
void cross_entropy_backward_into(const Tensor& dx, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 std::int64_t ignore_index, std::int64_t count, double dloss) {
  const char* op = "cross_entropy backward";
  check_rows(op, logits, "logits");
  AG_CHECK(logits.dim() == 2, op, "logits must be 2-d (N, V), got {}", shape_str(logits.sizes()));
  check_int64(op, targets, "targets");
  check_same_device(op, logits, targets);
  AG_CHECK(targets.sizes() == Shape{logits.size(0)}, op, "targets are {}, expected [{}]", shape_str(targets.sizes()),
           logits.size(0));
  check_defined(op, lse, "lse");
  AG_CHECK(lse.dtype() == compute_dtype(logits.dtype()), op, "lse is {}, expected the forward's {} for {} logits",
           dtype_name(lse.dtype()), dtype_name(compute_dtype(logits.dtype())), dtype_name(logits.dtype()));
  check_same_device(op, logits, lse);
  AG_CHECK(lse.sizes() == Shape{logits.size(0)}, op, "lse is {}, expected [{}]", shape_str(lse.sizes()),
           logits.size(0));
  AG_CHECK(count >= 0 && count <= logits.size(0), op, "count {} out of range for {} rows", count, logits.size(0));
  check_indices(op, targets, logits.size(1), "target", "classes", ignore_index);
  AG_DEVICE_KERNEL(logits, cross_entropy_backward)(dx, logits, dense(targets), dense(lse), ignore_index, count, dloss);
}
}  // namespace

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              std::int64_t ignore_index, std::int64_t count, double dloss) {
  const Tensor x = dense(logits);
  Tensor dx = empty(x.sizes(), x.options());
  cross_entropy_backward_into(dx, x, targets, lse, ignore_index, count, dloss);
  return dx;
}

void cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             std::int64_t ignore_index, std::int64_t count, double dloss) {
  AG_CHECK(logits.defined() && logits.is_contiguous(), "cross_entropy backward",
           "the logits it overwrites must be contiguous, got {}", logits.defined() ? logits.str() : "undefined");
  cross_entropy_backward_into(logits, logits, targets, lse, ignore_index, count, dloss);
}

Tensor dropout_mask(const Shape& sizes, double p, std::uint64_t seed, std::uint64_t offset, TensorOptions options) {
  AG_CHECK(p >= 0 && p < 1, "dropout", "p must be in [0, 1), got {}", p);  // also rejects NaN
  AG_CHECK(is_floating(options.dtype), "dropout", "mask dtype must be floating, got {}", dtype_name(options.dtype));
  for (auto s : sizes) AG_CHECK(s >= 0, "dropout", "invalid mask shape {}", shape_str(sizes));
  return (options.device.is_cuda() ? gpu::dropout_mask : cpu::dropout_mask)(sizes, p, seed, offset, options);
}

Tensor cat(const std::vector<Tensor>& xs, int dim) {
  AG_CHECK(!xs.empty(), "cat", "needs at least one tensor, got an empty list");
  for (std::size_t i = 0; i < xs.size(); ++i) AG_CHECK(xs[i].defined(), "cat", "tensor {} is undefined", i);
  const Tensor& first = xs[0];
  AG_CHECK(first.dim() >= 1, "cat", "cannot concatenate scalars (tensor 0 is 0-d)");
  const int d = normalize_dim("cat", dim, first.dim());
  Shape out_shape = first.sizes();
  out_shape[d] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    AG_CHECK(x.dtype() == first.dtype(), "cat", "tensor {} is {}, but tensor 0 is {}", i, dtype_name(x.dtype()),
             dtype_name(first.dtype()));
    AG_CHECK(x.device() == first.device(), "cat", "tensor {} is on {}, but tensor 0 is on {}", i, x.device().str(),
             first.device().str());
    bool same_dims = x.dim() == first.dim();
    for (std::int64_t k = 0; same_dims && k < x.dim(); ++k) same_dims = k == d || x.sizes()[k] == first.sizes()[k];
    AG_CHECK(same_dims, "cat", "tensor {} is {}, but tensor 0 is {}: all dims except dim {} must agree", i,
             shape_str(x.sizes()), shape_str(first.sizes()), d);
    out_shape[d] += x.sizes()[d];
  }
  // Each piece is copied into its slice of the output: a view of `out` with the
  // piece's sizes, at an offset along d. copy_ walks any layout on either
  // device, so non-contiguous pieces need no copy of their own.
  Tensor out = empty(out_shape, first.options());
  std::int64_t start = 0;
  for (const Tensor& x : xs) {
    if (x.numel() > 0) copy_(make_view(out, x.sizes(), out.strides(), out.offset() + start * out.strides()[d]), x);
    start += x.sizes()[d];
  }
  return out;
}

}  // namespace attograd::kernels
