// The one place where a raw op is checked and routed to the CPU or CUDA.
// Checks here are the user-facing ones (dtype, device, shape agreement); the
// device implementations assume them.
#include <algorithm>

#include "cuda/runtime.h"
#include "tensor/cpu/cpu_kernels.h"
#include "tensor/kernels.h"

namespace attograd::kernels {
namespace {

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

// Until the CUDA backend lands, every device op reports that it is missing.
void require_cpu(const char* op, const Tensor& t) {
  if (!t.device().is_cpu()) fail(op, "has no CUDA implementation in this build");
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
  require_cpu(name, x);
  return cpu::unary(op, x, s);
}

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_defined(name, a, "first operand");
  check_defined(name, b, "second operand");
  check_same_device(name, a, b);
  check_same_dtype(name, a, b);
  check_floating(name, a);
  require_cpu(name, a);
  const Shape shape = broadcast_shapes(name, a.sizes(), b.sizes());
  const bool comparison = op == Binary::gt || op == Binary::lt || op == Binary::eq;
  return cpu::binary(op, a, b, shape, comparison ? DType::b8 : a.dtype());
}

Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  check_defined("where", mask, "mask");
  AG_CHECK(mask.dtype() == DType::b8, "where", "mask must be bool, got {}", dtype_name(mask.dtype()));
  check_same_device("where", mask, a);
  check_same_device("where", a, b);
  check_same_dtype("where", a, b);
  require_cpu("where", a);
  const Shape shape = broadcast_shapes("where", broadcast_shapes("where", mask.sizes(), a.sizes()), b.sizes());
  return cpu::where(mask, a, b, shape);
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
    else
      cuda::copy_device_to_device(dst.raw_data(), src.raw_data(), nbytes, dst.device().index);
  } else if (src.device().is_cuda() && dst.device().is_cpu()) {
    copy_(dst, to_device(src, Device::cpu()));
  } else {
    copy_(dst, to_device(contiguous(cast(src, dst.dtype())), dst.device()));
  }
  dst.bump_version();
}

void fill_(const Tensor& dst, double value) {
  require_cpu("fill_", dst);
  cpu::fill_(dst, value);
  dst.bump_version();
}

void add_(const Tensor& y, const Tensor& x, double alpha) {
  check_same_device("add_", y, x);
  check_same_dtype("add_", y, x);
  check_floating("add_", y);
  require_cpu("add_", y);
  AG_CHECK(broadcast_shapes("add_", y.sizes(), x.sizes()) == y.sizes(), "add_", "cannot add {} into {}",
           shape_str(x.sizes()), shape_str(y.sizes()));
  cpu::add_(y, x, alpha);
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
  require_cpu("sum", x);
  std::vector<int> all = dims;
  if (all.empty())
    for (int d = 0; d < x.dim(); ++d) all.push_back(d);
  for (int d : all) AG_CHECK(d >= 0 && d < x.dim(), "sum", "dim {} out of range for {}", d, shape_str(x.sizes()));
  return cpu::sum(x, all, keepdim);
}

MaxResult max(const Tensor& x, int dim, bool keepdim) {
  check_floating("max", x);
  require_cpu("max", x);
  AG_CHECK(dim >= 0 && dim < x.dim(), "max", "dim {} out of range for {}", dim, shape_str(x.sizes()));
  AG_CHECK(x.sizes()[dim] > 0, "max", "reducing an empty dim {} of {}", dim, shape_str(x.sizes()));
  return cpu::max(x, dim, keepdim);
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

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_same_device("matmul", a, b);
  check_same_dtype("matmul", a, b);
  check_floating("matmul", a);
  AG_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul", "operands must be at least 2-d, got {} and {}",
           shape_str(a.sizes()), shape_str(b.sizes()));
  AG_CHECK(a.size(-1) == b.size(-2), "matmul", "inner dimensions differ: a is {}, b is {}", shape_str(a.sizes()),
           shape_str(b.sizes()));
  require_cpu("matmul", a);
  const Shape batch = broadcast_shapes("matmul", Shape(a.sizes().begin(), a.sizes().end() - 2),
                                       Shape(b.sizes().begin(), b.sizes().end() - 2));
  return cpu::matmul(a, b, batch);
}

}  // namespace attograd::kernels
