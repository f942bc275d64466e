// The one place where a raw op is checked and routed to the CPU or CUDA, in three
// files: element-wise ops, copies, reductions, products and optimizer updates here;
// row ops, gathers, joins and dropout masks in dispatch_rows.cpp; the fused
// attention in dispatch_attention.cpp. Checks here are the user-facing ones (dtype,
// device, shape agreement); the device implementations assume them.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "cuda/runtime.h"
#include "tensor/dispatch_checks.h"

namespace attograd::kernels {

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

namespace {
// A fused product's operands (the undefined optional ones apart) of x's device and dtype.
void check_operands_like(const char* op, const Tensor& x, std::initializer_list<const Tensor*> others) {
  for (const Tensor* t : others) {
    if (!t->defined()) continue;
    check_same_device(op, x, *t);
    check_same_dtype(op, x, *t);
  }
}
}  // namespace

Tensor linear_heads(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t parts,
                    std::int64_t heads) {
  const char* op = "linear_heads";
  AG_CHECK(x.dim() == 3 && weight.dim() == 2 && x.size(2) == weight.size(1), op,
           "x must be (B, T, in) and weight (out, in), got {} and {}", shape_str(x.sizes()),
           shape_str(weight.sizes()));
  AG_CHECK(parts > 0 && heads > 0 && weight.size(0) % (parts * heads) == 0, op,
           "weight {} does not split into {} parts of {} heads", shape_str(weight.sizes()), parts, heads);
  const std::int64_t B = x.size(0), T = x.size(1), out = weight.size(0), D = out / (parts * heads);
  check_operands_like(op, x, {&weight, &bias});
  check_floating(op, x);
  if (bias.defined())
    AG_CHECK(bias.dim() == 1 && bias.size(0) == out, op, "bias {} does not match weight {}", shape_str(bias.sizes()),
             shape_str(weight.sizes()));
  const Tensor xc = contiguous(x);
  if (Tensor y = AG_DEVICE_KERNEL(x, linear_heads)(xc, contiguous(weight), dense(bias), parts, heads); y.defined())
    return y;
  // Composed: the product as linear makes it, (B T, out), seen head by head
  // through strides, which the fused attention reads as it lies.
  const Tensor x2 = make_view(xc, {B * T, x.size(2)}, {x.size(2), 1}, xc.offset());
  const Tensor w_t = make_view(weight, {weight.size(1), out}, {weight.stride(1), weight.stride(0)}, weight.offset());
  const Tensor y = matmul(x2, w_t, bias);
  return make_view(y, {B, parts, heads, T, D}, {T * out, heads * D, D, out, 1}, y.offset());
}

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  AG_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear_gelu",
           "x must be (N, in) and weight (hidden, in), got {} and {}", shape_str(x.sizes()), shape_str(weight.sizes()));
  check_operands_like("linear_gelu", x, {&weight, &bias});
  if (bias.defined())
    AG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear_gelu", "bias {} does not match weight {}",
             shape_str(bias.sizes()), shape_str(weight.sizes()));
  if (LinearGelu fused = AG_DEVICE_KERNEL(x, linear_gelu)(contiguous(x), contiguous(weight), dense(bias));
      fused.pre.defined())
    return fused;
  const Tensor w_t = make_view(weight, {weight.size(1), weight.size(0)}, {weight.stride(1), weight.stride(0)},
                               weight.offset());
  const Tensor pre = matmul(x, w_t, bias);
  return {pre, unary(Unary::gelu, pre)};
}

Tensor matmul_gelu_grad(const Tensor& g, const Tensor& weight, const Tensor& pre) {
  AG_CHECK(g.dim() == 2 && weight.dim() == 2 && g.size(1) == weight.size(0) && pre.dim() == 2 &&
               pre.size(0) == g.size(0) && pre.size(1) == weight.size(1),
           "matmul_gelu_grad", "g (N, out) @ weight (out, hidden) against pre (N, hidden), got {}, {} and {}",
           shape_str(g.sizes()), shape_str(weight.sizes()), shape_str(pre.sizes()));
  check_operands_like("matmul_gelu_grad", g, {&weight, &pre});
  if (Tensor fused = AG_DEVICE_KERNEL(g, matmul_gelu_grad)(contiguous(g), contiguous(weight), contiguous(pre));
      fused.defined())
    return fused;
  return binary(Binary::gelu_backward, matmul(g, weight), pre);
}

void matmul_add_(const Tensor& c, const Tensor& a, const Tensor& b) {
  AG_CHECK(c.dim() == 2 && a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && c.size(0) == a.size(0) &&
               c.size(1) == b.size(1),
           "matmul_add_", "c (M, N) += a (M, K) @ b (K, N), got {}, {} and {}", shape_str(c.sizes()),
           shape_str(a.sizes()), shape_str(b.sizes()));
  check_operands_like("matmul_add_", c, {&a, &b});
  check_floating("matmul_add_", c);
  check_not_cuda_float64("matmul_add_", c);
  if (c.is_contiguous() && AG_DEVICE_KERNEL(c, matmul_add_)(c, a, b)) return;
  add_(c, matmul(a, b), 1.0);
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

namespace {
// What sum_of_squares and scale_ take: defined, contiguous tensors of one floating dtype and device.
void check_tensor_list(const char* op, const std::vector<Tensor>& tensors) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_defined(op, t, "tensor");
    check_floating(op, t);
    check_same_device(op, tensors.front(), t);
    check_same_dtype(op, tensors.front(), t);
    check_not_cuda_float64(op, t);
    AG_CHECK(t.dtype() != DType::bf16, op, "takes float32 or float64 tensors (gradients of float32 master weights), got {}",
             t.str());
    AG_CHECK(t.is_contiguous(), op, "tensor {} of {} is not contiguous: {}", i, tensors.size(), t.str());
  }
}
}  // namespace

double sum_of_squares(const std::vector<Tensor>& tensors) {
  check_tensor_list("sum_of_squares", tensors);
  if (tensors.empty()) return 0.0;
  return AG_DEVICE_KERNEL(tensors.front(), sum_of_squares)(tensors);
}

void scale_(const std::vector<Tensor>& tensors, double scale) {
  check_tensor_list("scale_", tensors);
  if (tensors.empty()) return;
  AG_DEVICE_KERNEL(tensors.front(), scale_)(tensors, scale);
  for (const Tensor& t : tensors) t.bump_version();
}

}  // namespace attograd::kernels
