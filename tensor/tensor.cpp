#include "tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <ostream>
#include <sstream>

#include "tensor/kernels.h"

namespace attograd {

void Tensor::check_defined(const char* what) const {
  if (!impl_) fail(what, "called on an undefined tensor");
}
void Tensor::check_dtype(DType expected, const char* what) const {
  check_defined(what);
  AG_CHECK(impl_->dtype == expected, what, "tensor is {}, requested {}", dtype_name(impl_->dtype),
           dtype_name(expected));
}

const Shape& Tensor::sizes() const { check_defined("sizes"); return impl_->sizes; }
std::int64_t Tensor::size(std::int64_t d) const { return sizes()[normalize_dim("size", d, dim())]; }
const Shape& Tensor::strides() const { check_defined("strides"); return impl_->strides; }
std::int64_t Tensor::stride(std::int64_t d) const { return strides()[normalize_dim("stride", d, dim())]; }
std::int64_t Tensor::numel() const { return numel_of(sizes()); }
std::int64_t Tensor::offset() const { check_defined("offset"); return impl_->offset; }
DType Tensor::dtype() const { check_defined("dtype"); return impl_->dtype; }
Device Tensor::device() const { check_defined("device"); return impl_->storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { check_defined("storage"); return impl_->storage; }

bool Tensor::is_contiguous() const {
  const Shape& s = sizes();
  std::int64_t expected = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;  // a size-1 dim's stride never matters
    if (impl_->strides[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!impl_) return "undefined";
  return fmt::format("{} {} {}", shape_str(sizes()), dtype_name(dtype()), device().str());
}

void* Tensor::raw_data() const {
  check_defined("data");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

double Tensor::item() const {
  AG_CHECK(numel() == 1, "item", "tensor has {} elements ({}), expected one", numel(), shape_str(sizes()));
  return to_vector<double>()[0];
}

double Tensor::at(std::initializer_list<std::int64_t> index) const {
  AG_CHECK(static_cast<std::int64_t>(index.size()) == dim(), "at", "{} indices for a {}-d tensor",
           index.size(), dim());
  std::int64_t offset = impl_->offset, d = 0;
  for (std::int64_t i : index) {
    AG_CHECK(i >= 0 && i < impl_->sizes[d], "at", "index {} out of range for dim {} of size {}", i, d,
             impl_->sizes[d]);
    offset += i * impl_->strides[d++];
  }
  return make_view(*this, {}, {}, offset).item();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = kernels::contiguous(kernels::cast(kernels::to_device(detach(), Device::cpu()), dtype_of<T>::value));
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

bool Tensor::requires_grad() const { check_defined("requires_grad"); return impl_->requires_grad; }
Tensor& Tensor::set_requires_grad(bool enabled) {
  check_defined("requires_grad");
  AG_CHECK(!enabled || is_floating(dtype()), "requires_grad", "only floating tensors can require grad, got {}",
           dtype_name(dtype()));
  AG_CHECK(is_leaf(), "requires_grad", "can only be set on leaf tensors (this one has grad_fn)");
  impl_->requires_grad = enabled;
  return *this;
}
bool Tensor::is_leaf() const { check_defined("is_leaf"); return impl_->grad_fn == nullptr; }
const Tensor& Tensor::grad() const { check_defined("grad"); return impl_->grad; }
void Tensor::set_grad(Tensor grad) const { check_defined("grad"); impl_->grad = std::move(grad); }
const std::shared_ptr<Node>& Tensor::grad_fn() const { check_defined("grad_fn"); return impl_->grad_fn; }
void Tensor::set_grad_fn(std::shared_ptr<Node> fn) const {
  check_defined("grad_fn");
  impl_->grad_fn = std::move(fn);
  impl_->requires_grad = true;
}
std::uint64_t Tensor::version() const { return storage()->version(); }
void Tensor::bump_version() const { storage()->bump_version(); }

Tensor Tensor::detach() const {
  check_defined("detach");
  return make_view(*this, impl_->sizes, impl_->strides, impl_->offset);
}

Tensor empty(const Shape& sizes, TensorOptions options) {
  for (auto s : sizes) AG_CHECK(s >= 0, "empty", "negative size in {}", shape_str(sizes));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(numel_of(sizes) * dtype_size(options.dtype), options.device);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = options.dtype;
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, std::int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

Tensor full(const Shape& sizes, double value, TensorOptions options) {
  Tensor t = empty(sizes, options);
  kernels::fill_(t, value);
  return t;
}
Tensor zeros(const Shape& sizes, TensorOptions options) { return full(sizes, 0.0, options); }
Tensor ones(const Shape& sizes, TensorOptions options) { return full(sizes, 1.0, options); }
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  AG_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange",
           "bad range start={} end={} step={}", start, end, step);
  const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((end - start) / step)));
  std::vector<double> values(n);
  for (std::int64_t i = 0; i < n; ++i) values[i] = start + static_cast<double>(i) * step;
  return kernels::to_device(kernels::cast(from_vector(values, {n}), options.dtype), options.device);
}
Tensor arange(std::int64_t end, TensorOptions options) { return arange(0, static_cast<double>(end), 1, options); }

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes, Device device) {
  AG_CHECK(static_cast<std::int64_t>(values.size()) == numel_of(sizes), "from",
           "{} values do not fill shape {} ({} elements)", values.size(), shape_str(sizes), numel_of(sizes));
  Tensor t = empty(sizes, {dtype_of<T>::value, Device::cpu()});
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i];
  } else if (!values.empty()) {
    std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return kernels::to_device(t, device);
}
template Tensor from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector(const std::vector<std::int64_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<bool>&, const Shape&, Device);

namespace {
// Prints nested brackets like PyTorch; elides the middle of dims longer than 6
// when the tensor has more than 1000 elements.
std::string format_value(double v, DType dtype) {
  if (dtype == DType::b8) return v != 0 ? "true" : "false";
  if (dtype == DType::i64) return std::to_string(static_cast<std::int64_t>(v));
  return fmt::format("{:.4f}", v);
}

void print_values(std::ostream& os, const std::vector<double>& v, const Shape& sizes, std::size_t dim,
                  std::int64_t base, bool elide, DType dtype, int indent) {
  if (sizes.empty()) {
    os << format_value(v[0], dtype);
    return;
  }
  const Shape strides = contiguous_strides(sizes);
  os << '[';
  for (std::int64_t i = 0; i < sizes[dim]; ++i) {
    if (elide && sizes[dim] > 6 && i == 3) {
      os << (dim + 1 == sizes.size() ? "..., " : "...,\n" + std::string(indent + dim + 1, ' '));
      i = sizes[dim] - 3;
    }
    const std::int64_t at = base + i * strides[dim];
    if (dim + 1 == sizes.size()) {
      os << format_value(v[at], dtype);
    } else {
      print_values(os, v, sizes, dim + 1, at, elide, dtype, indent);
    }
    if (i + 1 < sizes[dim]) os << (dim + 1 == sizes.size() ? ", " : ",\n" + std::string(indent + dim + 1, ' '));
  }
  os << ']';
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  os << "tensor(";
  print_values(os, t.to_vector<double>(), t.sizes(), 0, 0, t.numel() > 1000, t.dtype(), 7);
  os << ", shape=" << shape_str(t.sizes()) << ", dtype=" << dtype_name(t.dtype());
  if (!t.device().is_cpu()) os << ", device=" << t.device().str();
  if (t.requires_grad()) os << ", requires_grad=true";
  return os << ')';
}

}  // namespace attograd
