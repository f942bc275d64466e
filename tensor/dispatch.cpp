// The one place where a raw op is checked and routed to the CPU or CUDA.
// Checks here are the user-facing ones (dtype, device, shape agreement); the
// device implementations assume them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "cuda/runtime.h"
#include "tensor/attention_call.h"
#include "cpu/attention/attention.h"
#include "cpu/linear_heads.h"
#include "cpu/matmul_bf16/isa.h"
#include "cpu/matmul_f32/sgemm.h"
#include "cpu/mlp_products.h"
#include "tensor/dense_span.h"
#include "tensor/device_kernels.h"
#include "tensor/kernels.h"

// The implementation of device kernel `name` (tensor/device_kernels.h) for
// the device of tensor t: gpu::name on a CUDA device, else cpu::name. The
// checks before each call have made sure all the op's tensors share t's device.
#define AG_DEVICE_KERNEL(t, name) ((t).device().is_cuda() ? ::attograd::gpu::name : ::attograd::cpu::name)

namespace attograd::kernels {
namespace {

// Kernels that read their operands as packed rows (row ops, gathers, a GEMM's
// bias) get them contiguous from here, the same for both devices; an
// undefined optional operand stays undefined.
Tensor dense(const Tensor& t) { return t.defined() ? contiguous(t) : t; }

// The attention kernels read (B, H, T, D) rows through strides but need each
// row itself contiguous: a copy only when its last dim is strided.
Tensor rows_contiguous(const Tensor& x) { return x.size(-1) <= 1 || x.stride(-1) == 1 ? x : clone(x); }

void check_defined(const char* op, const Tensor& t, const char* what) {
  AG_CHECK(t.defined(), op, "{} is an undefined tensor", what);
}

// Tensors of one op must share a device: "[add] tensors on different devices: cpu and cuda:0".
void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  AG_CHECK(a.device() == b.device(), op, "tensors on different devices: {} and {}", a.device().str(),
           b.device().str());
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  AG_CHECK(a.dtype() == b.dtype(), op, "dtypes differ: {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
}

void check_floating(const char* op, const Tensor& t) {
  AG_CHECK(is_floating(t.dtype()), op, "expected a floating tensor, got {} {}", dtype_name(t.dtype()),
           shape_str(t.sizes()));
}

// bfloat16 through float32: an op whose kernels have no bfloat16 loop widens its
// bfloat16 operands to float32 (exactly), computes there, and rounds its
// floating results once to bfloat16, which is what a bfloat16 loop computing
// in float32 gives too. Ops with a loop of their own skip this: the products,
// the element-wise unary, binary and add_ (a chunk at a time on the CPU, an
// element at a time in float32 on the GPU), float32 with bfloat16 operands
// and sum (widened as read, on both devices).
bool is_bf16(const Tensor& t) { return t.defined() && t.dtype() == DType::bf16; }
Tensor widen(const Tensor& t) { return is_bf16(t) ? cast(t, DType::f32) : t; }
Tensor to_bf16(const Tensor& t) { return t.defined() ? cast(t, DType::bf16) : t; }

// The GPU's kernels take float32 and bfloat16 (a bfloat16 operand of a
// float32-only kernel comes widened); float64, the CPU's reference dtype, is
// refused with a message that says why.
void check_not_cuda_float64(const char* op, const Tensor& t) {
  AG_CHECK(!t.device().is_cuda() || t.dtype() != DType::f64, op,
           "float64 is CPU-only (the CUDA kernels are float32 and bfloat16), got {}", t.str());
}

}  // namespace

const char* unary_name(Unary op) {
  switch (op) {
#define AG_NAME(name) case Unary::name: return #name;
    AG_UNARY_OPS(AG_NAME)
#undef AG_NAME
  }
  return "unary";
}

const char* binary_name(Binary op) {
  switch (op) {
#define AG_NAME(name) case Binary::name: return #name;
    AG_BINARY_OPS(AG_NAME)
#undef AG_NAME
  }
  return "binary";
}

Tensor unary(Unary op, const Tensor& x, double s) {
  const char* name = unary_name(op);
  check_defined(name, x, "input");
  check_floating(name, x);
  return AG_DEVICE_KERNEL(x, unary)(op, x, s);
}

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_defined(name, a, "first operand");
  check_defined(name, b, "second operand");
  check_same_device(name, a, b);
  // float32 with bfloat16 (autocast's float32 residual plus a bfloat16 branch)
  // is float32's op with the bfloat16 operand widened as it is read: the
  // result PyTorch's promotion gives, without a widened copy of the operand.
  const bool widening = !is_comparison(op) && (is_bf16(a) != is_bf16(b)) &&
                        (a.dtype() == DType::f32 || b.dtype() == DType::f32);
  if (!widening) check_same_dtype(name, a, b);
  check_floating(name, a);
  const Shape shape = broadcast_shapes(name, a.sizes(), b.sizes());
  if (is_bf16(a) && is_comparison(op)) return binary(op, widen(a), widen(b));
  const DType out_dtype = is_comparison(op) ? DType::b8 : widening ? DType::f32 : a.dtype();
  return AG_DEVICE_KERNEL(a, binary)(op, a, b, shape, out_dtype);
}

Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  check_defined("where", mask, "mask");
  AG_CHECK(mask.dtype() == DType::b8, "where", "mask must be bool, got {}", dtype_name(mask.dtype()));
  check_same_device("where", mask, a);
  check_same_device("where", a, b);
  check_same_dtype("where", a, b);
  const Shape shape = broadcast_shapes("where", broadcast_shapes("where", mask.sizes(), a.sizes()), b.sizes());
  return AG_DEVICE_KERNEL(a, where)(mask, a, b, shape);
}

void copy_(const Tensor& dst, const Tensor& src) {
  // Broadcasting src into dst must not change dst's shape.
  AG_CHECK(broadcast_shapes("copy_", dst.sizes(), src.sizes()) == dst.sizes(), "copy_",
           "cannot copy {} into {}", shape_str(src.sizes()), shape_str(dst.sizes()));
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    cpu::copy_(dst, src);
  } else if (dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
             src.is_contiguous()) {
    const std::size_t nbytes = dst.numel() * dtype_size(dst.dtype());
    if (dst.device().is_cuda() && src.device().is_cpu())
      cuda::copy_host_to_device(dst.raw_data(), src.raw_data(), nbytes, dst.device().index);
    else if (dst.device().is_cpu())
      cuda::copy_device_to_host(dst.raw_data(), src.raw_data(), nbytes, src.device().index);
    else if (src.device() == dst.device()) {
      cuda::copy_device_to_device(dst.raw_data(), src.raw_data(), nbytes, dst.device().index);
    } else {
      // Another device's stream may still be writing src: wait for it first. And the copy reads
      // src on dst's stream, outside the order of src's device, whose allocator may hand src's
      // block out again as soon as src dies (to_device's temporary does at once): wait for it too.
      cuda::synchronize(src.device().index);
      cuda::copy_device_to_device(dst.raw_data(), src.raw_data(), nbytes, dst.device().index);
      cuda::synchronize(dst.device().index);
    }
  } else if (dst.device() == src.device()) {  // one CUDA device: any layouts, casts, broadcasts
    gpu::copy_(dst, src);
  } else if (src.device().is_cuda() && dst.device().is_cpu()) {
    copy_(dst, to_device(src, Device::cpu()));
  } else {
    copy_(dst, to_device(contiguous(cast(src, dst.dtype())), dst.device()));
  }
  dst.bump_version();
}

void fill_(const Tensor& dst, double value) {
  AG_DEVICE_KERNEL(dst, fill_)(dst, value);
  dst.bump_version();
}

void add_(const Tensor& y, const Tensor& x, double alpha) {
  check_same_device("add_", y, x);
  check_same_dtype("add_", y, x);
  check_floating("add_", y);
  AG_CHECK(broadcast_shapes("add_", y.sizes(), x.sizes()) == y.sizes(), "add_", "cannot add {} into {}",
           shape_str(x.sizes()), shape_str(y.sizes()));
  AG_DEVICE_KERNEL(y, add_)(y, x, alpha);
  y.bump_version();
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) {
  Tensor out = empty(x.sizes(), x.options());
  copy_(out, x);
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = empty(x.sizes(), {dtype, x.device()});
  copy_(out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  if (device.is_cuda())
    AG_CHECK(device.index < cuda::device_count(), "to", "no CUDA device {} ({} present)", device.index,
             cuda::device_count());
  Tensor src = contiguous(x);
  Tensor out = empty(x.sizes(), {x.dtype(), device});
  copy_(out, src);
  return out;
}

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  check_floating("sum", x);
  std::vector<int> all = dims;
  if (all.empty())
    for (int d = 0; d < x.dim(); ++d) all.push_back(d);
  for (int d : all) AG_CHECK(d >= 0 && d < x.dim(), "sum", "dim {} out of range for {}", d, shape_str(x.sizes()));
  return AG_DEVICE_KERNEL(x, sum)(x, all, keepdim);
}

MaxResult max(const Tensor& x, int dim, bool keepdim) {
  check_floating("max", x);
  AG_CHECK(dim >= 0 && dim < x.dim(), "max", "dim {} out of range for {}", dim, shape_str(x.sizes()));
  AG_CHECK(x.sizes()[dim] > 0, "max", "reducing an empty dim {} of {}", dim, shape_str(x.sizes()));
  if (is_bf16(x)) {  // exact: the maximum of widened values is one of them
    MaxResult r = max(widen(x), dim, keepdim);
    r.values = to_bf16(r.values);
    return r;
  }
  return AG_DEVICE_KERNEL(x, max)(x, dim, keepdim);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const std::int64_t lead = x.dim() - static_cast<std::int64_t>(shape.size());
  AG_CHECK(lead >= 0, "sum_to", "cannot reduce {} to {}", shape_str(x.sizes()), shape_str(shape));
  std::vector<int> dims;
  for (std::int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(static_cast<int>(d));
    } else if (shape[d - lead] != x.sizes()[d]) {
      AG_CHECK(shape[d - lead] == 1, "sum_to", "cannot reduce {} to {}", shape_str(x.sizes()), shape_str(shape));
      dims.push_back(static_cast<int>(d));
    }
  }
  Tensor reduced = sum(x, dims, /*keepdim=*/true);
  return make_view(reduced, shape, contiguous_strides(shape), reduced.offset());
}

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul(a, b, Tensor()); }

Tensor matmul(const Tensor& a, const Tensor& b, const Tensor& bias) {
  check_same_device("matmul", a, b);
  check_same_dtype("matmul", a, b);
  check_floating("matmul", a);
  AG_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul", "operands must be at least 2-d, got {} and {}",
           shape_str(a.sizes()), shape_str(b.sizes()));
  AG_CHECK(a.size(-1) == b.size(-2), "matmul", "inner dimensions differ: a is {}, b is {}", shape_str(a.sizes()),
           shape_str(b.sizes()));
  const Shape batch = broadcast_shapes("matmul", Shape(a.sizes().begin(), a.sizes().end() - 2),
                                       Shape(b.sizes().begin(), b.sizes().end() - 2));
  if (bias.defined()) {
    check_same_device("matmul", a, bias);
    check_same_dtype("matmul", a, bias);
    AG_CHECK(bias.dim() == 1 && bias.size(0) == b.size(-1), "matmul", "bias {} does not match the {} columns of b {}",
             shape_str(bias.sizes()), b.size(-1), shape_str(b.sizes()));
  }
  check_not_cuda_float64("matmul", a);
  return AG_DEVICE_KERNEL(a, matmul)(a, b, batch, dense(bias));
}

bool linear_heads_direct(Device device, DType dtype, std::int64_t head_dim) {
  return device.is_cpu() && dtype == DType::f32 && cpu::linear_heads_direct(head_dim);
}

Tensor linear_heads(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts,
                    std::int64_t heads) {
  const char* op = "linear_heads";
  AG_CHECK(x.dim() == 3 && weight.dim() == 2 && x.size(2) == weight.size(1), op,
           "x must be (B, T, in) and weight (out, in), got {} and {}", shape_str(x.sizes()),
           shape_str(weight.sizes()));
  AG_CHECK(parts > 0 && heads > 0 && weight.size(0) % (parts * heads) == 0, op,
           "weight {} does not split into {} parts of {} heads", shape_str(weight.sizes()), parts, heads);
  const std::int64_t B = x.size(0), T = x.size(1), out = weight.size(0), D = out / (parts * heads);
  check_same_device(op, x, weight);
  check_same_dtype(op, x, weight);
  check_floating(op, x);
  if (bias.defined()) {
    check_same_device(op, x, bias);
    check_same_dtype(op, x, bias);
    AG_CHECK(bias.dim() == 1 && bias.size(0) == out, op, "bias {} does not match weight {}", shape_str(bias.sizes()),
             shape_str(weight.sizes()));
  }
  if (linear_heads_direct(x.device(), x.dtype(), D) && x.size(2) > 0)
    return cpu::linear_heads(contiguous(x), contiguous(weight), dense(bias), parts, heads);
  // The product as linear makes it, its columns then copied head by head.
  const Tensor xc = contiguous(x);
  const Tensor x2 = make_view(xc, {B * T, x.size(2)}, {x.size(2), 1}, xc.offset());
  const Tensor w_t = make_view(weight, {weight.size(1), out}, {weight.stride(1), weight.stride(0)}, weight.offset());
  const Tensor y = matmul(x2, w_t, bias);  // (B T, out)
  return contiguous(make_view(y, {B, parts, heads, T, D}, {T * out, heads * D, D, out, 1}, y.offset()));
}

namespace {
bool gelu_in_product(const Tensor& x) { return x.device().is_cpu() && x.dtype() == DType::f32; }
}  // namespace

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  AG_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear_gelu",
           "x must be (N, in) and weight (hidden, in), got {} and {}", shape_str(x.sizes()), shape_str(weight.sizes()));
  const Tensor w_t = make_view(weight, {weight.size(1), weight.size(0)}, {weight.stride(1), weight.stride(0)},
                               weight.offset());
  if (!gelu_in_product(x)) {
    const Tensor pre = matmul(x, w_t, bias);
    return {pre, unary(Unary::gelu, pre)};
  }
  check_same_device("linear_gelu", x, weight);
  check_same_dtype("linear_gelu", x, weight);
  if (bias.defined()) {
    check_same_device("linear_gelu", x, bias);
    check_same_dtype("linear_gelu", x, bias);
    AG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear_gelu", "bias {} does not match weight {}",
             shape_str(bias.sizes()), shape_str(weight.sizes()));
  }
  Tensor out = empty({x.size(0), weight.size(0)}, x.options());
  Tensor pre = cpu::linear_gelu(contiguous(x), contiguous(weight), dense(bias), out);
  return {pre, out};
}

Tensor matmul_gelu_grad(const Tensor& g, const Tensor& weight, const Tensor& pre) {
  AG_CHECK(g.dim() == 2 && weight.dim() == 2 && g.size(1) == weight.size(0) && pre.dim() == 2 &&
               pre.size(0) == g.size(0) && pre.size(1) == weight.size(1),
           "matmul_gelu_grad", "g (N, out) @ weight (out, hidden) against pre (N, hidden), got {}, {} and {}",
           shape_str(g.sizes()), shape_str(weight.sizes()), shape_str(pre.sizes()));
  if (!gelu_in_product(g)) return binary(Binary::gelu_backward, matmul(g, weight), pre);
  check_same_device("matmul_gelu_grad", g, weight);
  check_same_device("matmul_gelu_grad", g, pre);
  check_same_dtype("matmul_gelu_grad", g, weight);
  check_same_dtype("matmul_gelu_grad", g, pre);
  return cpu::matmul_gelu_grad(contiguous(g), contiguous(weight), contiguous(pre));
}

}  // namespace attograd::kernels

// ---- fused row ops, gathers, joins, dropout masks --------------------------------
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

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
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
  return AG_DEVICE_KERNEL(logits, cross_entropy_backward)(dense(logits), dense(targets), dense(lse), ignore_index,
                                                         count, dloss);
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

// ---- fused attention -------------------------------------------------------------
namespace attograd::kernels {

namespace {

// Whether a bfloat16 attention runs on bfloat16 kernels, else widened to
// float32: it returns no weights, and runs on the GPU (cuda/attention_bf16.cu)
// or on a CPU whose product kernel is AMX or AVX512_BF16, or a model of one
// (cpu/attention/attention_bf16.cpp).
bool bf16_attention_fused(const Tensor& q, bool return_weights) {
  return !return_weights && (q.device().is_cuda() || cpu::attention_bf16_runs_on(cpu::bf16_kernel()));
}

// A fused call: its operands checked, the options in range and what the CUDA
// kernels support; each row made contiguous (a copy only of an operand whose
// last dim is strided). For the forward and again for the backward: a caller
// of the kernels need not come through autograd.
AttentionCall attention_call(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                             const AttentionKernelOptions& options) {
  check_attention_operands(op, q, k, v, mask);
  const Shape& qs = q.sizes();
  AG_CHECK(options.dropout_p >= 0 && options.dropout_p < 1, op, "dropout_p must be in [0, 1), got {}",
           options.dropout_p);
  if (q.device().is_cuda()) {
    check_not_cuda_float64(op, q);
    AG_CHECK(qs[3] <= cuda::kAttentionMaxHeadDim, op, "head dim {} is above the CUDA kernels' maximum of {}", qs[3],
             cuda::kAttentionMaxHeadDim);
  }
  return {rows_contiguous(q), rows_contiguous(k), rows_contiguous(v), mask, options};
}

}  // namespace

void check_attention_operands(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_floating(op, q);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  AG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, "q, k, v must be (B, H, T, D), got {}, {}, {}",
           shape_str(q.sizes()), shape_str(k.sizes()), shape_str(v.sizes()));
  const Shape& qs = q.sizes();
  const Shape& ks = k.sizes();
  AG_CHECK(ks == v.sizes() && qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3], op,
           "q {} and k, v {}, {} must share B, H and D, and k and v must match", shape_str(qs), shape_str(ks),
           shape_str(v.sizes()));
  if (!mask.defined()) return;
  AG_CHECK(mask.dtype() == DType::b8, op, "mask must be bool (true = hidden), got {}", dtype_name(mask.dtype()));
  check_same_device(op, q, mask);
  const Shape scores{qs[0], qs[1], qs[2], ks[2]};
  AG_CHECK(broadcasts_to(mask.sizes(), scores), op,
           "mask {} does not broadcast to the scores (B, H, Tq, Tk) = {}", shape_str(mask.sizes()), shape_str(scores));
}

const char* bf16_matmul_kernel() { return cpu::bf16_kernel_name(cpu::bf16_kernel()); }
const char* f32_matmul_kernel() { return cpu::f32_kernel_name(cpu::f32_kernel()); }
const char* widening_matmul_kernel() { return cpu::f32_kernel_name(cpu::widening_f32_kernel()); }

std::int64_t attention_probs_bytes(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal,
                                   std::int64_t element_bytes, std::int64_t budget) {
  return cpu::attention_probs_bytes(heads, Tq, Tk, causal, element_bytes, budget);
}

AttentionForwardResult attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                         const AttentionKernelOptions& options) {
  const bool bf16 = is_bf16(q) && is_bf16(k) && is_bf16(v);
  if (bf16 && !bf16_attention_fused(q, options.return_weights)) {
    // Widened: the output rounded to bfloat16; lse, weights and probs float32.
    // q, k, v (a packed projection's views) widen in one flat pass, and the
    // output, laid out (B, Tq, H, D), rounds so: its heads merge for free.
    const std::vector<Tensor> wide = cast_keeping_layout({q, k, v}, DType::f32);
    AttentionForwardResult r = attention_forward(wide[0], wide[1], wide[2], mask, options);
    r.out = cast_keeping_layout({r.out}, DType::bf16)[0];
    r.weights = to_bf16(r.weights);
    return r;
  }
  const AttentionCall call = attention_call("attention", q, k, v, mask, options);
  const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  AttentionForwardResult r;
  // The output is laid out (B, Tq, H, D) and returned as a (B, H, Tq, D) view,
  // so merging the heads back to (B, Tq, H*D) afterwards is free.
  const Tensor out_bthd = empty({B, Tq, H, D}, q.options());
  r.out = make_view(out_bthd, {B, H, Tq, D}, {Tq * H * D, D, H * D, 1}, 0);
  r.lse = empty({B, H, Tq}, {compute_dtype(q.dtype()), q.device()});
  if (options.return_weights) r.weights = empty({B, H, Tq, Tk}, q.options());
  if (r.out.numel() == 0 && !(options.return_weights && r.weights.numel() > 0)) return r;
  if (bf16 && q.device().is_cpu()) {
    cpu::attention_forward_bf16(call, r, cpu::bf16_kernel());
    return r;
  }
  AG_DEVICE_KERNEL(q, attention_forward)(call, r);  // on the GPU, either dtype
  return r;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& probs,
                                  const AttentionKernelOptions& options, const AttentionGrads& into) {
  const char* op = "attention backward";
  const bool bf16 = is_bf16(q) && is_bf16(k) && is_bf16(v);
  if (bf16 && (!bf16_attention_fused(q, false) || probs.defined() || lse.dtype() != DType::f32)) {
    // Widened (as its forward was): float32 gradients, rounded into bfloat16
    // ones. Casts keep the layouts, and the three gradients, when they are one
    // packed d(qkv)'s views, are computed into a float32 twin of it and rounded
    // in one flat pass.
    const std::vector<Tensor> wide = cast_keeping_layout({q, k, v}, DType::f32);
    const Tensor wide_dout = cast_keeping_layout({dout}, DType::f32)[0];
    const Tensor wide_out = cast_keeping_layout({out}, DType::f32)[0];
    if (const std::optional<StorageSpan> span = dense_span({into.dq, into.dk, into.dv})) {
      const Tensor twin = empty({span->numel}, {DType::f32, q.device()});
      const std::vector<Tensor> twins = views_over(twin, {into.dq, into.dk, into.dv}, *span);
      attention_backward(wide_dout, wide[0], wide[1], wide[2], mask, wide_out, widen(lse), probs, options,
                         {twins[0], twins[1], twins[2]});
      copy_(flat_view(into.dq, *span), twin);
      return into;
    }
    const AttentionGrads g =
        attention_backward(wide_dout, wide[0], wide[1], wide[2], mask, wide_out, widen(lse), probs, options);
    AttentionGrads rounded;
    for (auto [target, computed, result] : {std::tuple{&into.dq, &g.dq, &rounded.dq}, std::tuple{&into.dk, &g.dk, &rounded.dk},
                                            std::tuple{&into.dv, &g.dv, &rounded.dv}}) {
      *result = target->defined() ? *target : empty(computed->sizes(), {DType::bf16, computed->device()});
      copy_(*result, *computed);
    }
    return rounded;
  }
  const AttentionCall call = attention_call(op, q, k, v, mask, options);
  check_defined(op, dout, "dout");
  check_defined(op, out, "out");
  check_defined(op, lse, "lse");
  check_same_dtype(op, dout, q);
  AG_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes(), op, "dout {} and out {} must match q {}",
           shape_str(dout.sizes()), shape_str(out.sizes()), shape_str(q.sizes()));
  AG_CHECK(lse.sizes() == Shape(q.sizes().begin(), q.sizes().end() - 1) && lse.is_contiguous(), op,
           "lse {} must be a contiguous (B, H, Tq) for q {}", shape_str(lse.sizes()), shape_str(q.sizes()));
  for (const Tensor* t : {&dout, &out, &lse}) check_same_device(op, q, *t);
  if (probs.defined()) {  // the CPU forward's saved tiles: whole heads of them, for these shapes
    const std::int64_t per_head = cpu::attention_probs_bytes(1, q.size(2), k.size(2), options.causal, 1,
                                                             std::numeric_limits<std::int64_t>::max());
    AG_CHECK(probs.device().is_cpu() && probs.dtype() == q.dtype() && probs.is_contiguous() && per_head > 0 &&
                 probs.numel() > 0 && probs.numel() % per_head == 0 && probs.numel() <= per_head * q.size(0) * q.size(1),
             op, "probs {} {} is not the forward's saved tiles for q {}, k {} (whole heads of {} values, at most {})",
             dtype_name(probs.dtype()), shape_str(probs.sizes()), shape_str(q.sizes()), shape_str(k.sizes()),
             per_head, q.size(0) * q.size(1));
  }
  const std::pair<const Tensor*, const Tensor*> outputs[] = {{&into.dq, &q}, {&into.dk, &k}, {&into.dv, &v}};
  for (const auto& [grad, input] : outputs) {
    if (!grad->defined()) continue;
    check_same_dtype(op, q, *grad);
    check_same_device(op, q, *grad);
    AG_CHECK(grad->sizes() == input->sizes() && (grad->size(-1) <= 1 || grad->stride(-1) == 1), op,
             "gradient output {} must have its input's shape {} and contiguous rows", grad->str(),
             shape_str(input->sizes()));
  }
  const AttentionGrads g{into.dq.defined() ? into.dq : empty(q.sizes(), q.options()),
                         into.dk.defined() ? into.dk : empty(k.sizes(), k.options()),
                         into.dv.defined() ? into.dv : empty(v.sizes(), v.options())};
  if (g.dq.numel() == 0 && g.dk.numel() == 0) return g;
  const AttentionSaved saved{rows_contiguous(dout), rows_contiguous(out), lse, probs};
  if (bf16 && q.device().is_cpu()) {
    cpu::attention_backward_bf16(call, saved, g, cpu::bf16_kernel());
    return g;
  }
  AG_DEVICE_KERNEL(q, attention_backward)(call, saved, g);  // on the GPU, either dtype
  return g;
}

}  // namespace attograd::kernels

// ---- optimizer updates --------------------------------------------------------------
namespace attograd::kernels {

void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& step) {
  adamw_step_(std::vector<AdamWParameter>{{param, grad, m, v, true}}, step);
}

void adamw_step_(const std::vector<AdamWParameter>& params, const AdamWStep& step) {
  const char* op = "adamw";
  AG_CHECK(step.step >= 1, op, "step must be >= 1, got {}", step.step);
  std::vector<AdamWParameter> dense_grads;
  dense_grads.reserve(params.size());
  for (const AdamWParameter& p : params) {
    check_defined(op, p.param, "param");
    check_defined(op, p.grad, "grad");
    check_floating(op, p.param);
    for (const Tensor* t : {&p.grad, &p.m, &p.v}) {
      check_same_dtype(op, p.param, *t);
      check_same_device(op, p.param, *t);
      AG_CHECK(t->sizes() == p.param.sizes(), op, "param {} and its grad/state {} differ in shape",
               shape_str(p.param.sizes()), shape_str(t->sizes()));
    }
    AG_CHECK(p.param.is_contiguous() && p.m.is_contiguous() && p.v.is_contiguous(), op,
             "param and state must be contiguous, got {} {} {}", p.param.str(), p.m.str(), p.v.str());
    check_same_device(op, params.front().param, p.param);  // one launch needs one device
    check_not_cuda_float64(op, p.param);
    AG_CHECK(p.param.dtype() != DType::bf16, op,
             "parameters and their state are float32 (mixed precision keeps float32 master weights), got {}",
             p.param.str());
    dense_grads.push_back({p.param, contiguous(p.grad), p.m, p.v, p.decay});
  }
  if (params.empty()) return;
  AG_DEVICE_KERNEL(params.front().param, adamw_step_)(dense_grads, step);
  for (const AdamWParameter& p : params) {
    p.param.bump_version();
    p.m.bump_version();
    p.v.bump_version();
  }
}

}  // namespace attograd::kernels
