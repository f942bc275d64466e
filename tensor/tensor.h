#pragma once
// Tensor: a cheap shared handle to a TensorImpl (storage + sizes + strides +
// offset + dtype + autograd metadata). Views share storage and differ only in
// sizes, strides and offset. This header knows nothing of differentiation
// beyond holding the autograd fields; the differentiable ops live in
// autograd/ops.h, the raw kernels in tensor/kernels.h.
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace attograd {

class Node;  // autograd/node.h
struct TensorImpl;

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const;
  std::int64_t size(std::int64_t dim) const;  // negative dims count from the end
  const Shape& strides() const;
  std::int64_t stride(std::int64_t dim) const;
  std::int64_t dim() const { return static_cast<std::int64_t>(sizes().size()); }
  std::int64_t numel() const;
  std::int64_t offset() const;
  DType dtype() const;
  Device device() const;
  TensorOptions options() const { return {dtype(), device()}; }
  bool is_contiguous() const;  // computed from sizes and strides, never assumed
  std::string str() const;     // "[2,3] float32 cpu"

  // Raw element pointer at this tensor's offset (CPU or device memory).
  void* raw_data() const;
  template <typename T> T* data() const {
    check_dtype(dtype_of<T>::value, "data");
    return static_cast<T*>(raw_data());
  }
  const std::shared_ptr<Storage>& storage() const;

  // Element access for tests and small host-side work (copies from a device).
  double item() const;                              // one-element tensors
  double at(std::initializer_list<std::int64_t> index) const;
  template <typename T> std::vector<T> to_vector() const;  // row-major copy

  // Autograd metadata.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool enabled);  // leaves of floating dtype only
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined until a backward reaches this leaf
  void set_grad(Tensor grad) const;
  const std::shared_ptr<Node>& grad_fn() const;
  void set_grad_fn(std::shared_ptr<Node> fn) const;  // for autograd/ only
  std::uint64_t version() const;
  void bump_version() const;  // every in-place write calls this

  // A new handle on the same storage with no autograd history.
  Tensor detach() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  void check_defined(const char* what) const;
  void check_dtype(DType expected, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;  // in elements
  std::int64_t offset = 0;
  DType dtype = DType::f32;
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
};

// Allocates an uninitialised contiguous tensor.
Tensor empty(const Shape& sizes, TensorOptions options = {});
// A view on `base`'s storage; no autograd history (see autograd/ops.h for differentiable views).
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, std::int64_t offset);

// Factories.
Tensor zeros(const Shape& sizes, TensorOptions options = {});
Tensor ones(const Shape& sizes, TensorOptions options = {});
Tensor full(const Shape& sizes, double value, TensorOptions options = {});
Tensor arange(std::int64_t end, TensorOptions options = {});  // 0, 1, ..., end-1
Tensor arange(double start, double end, double step, TensorOptions options = {});
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes, Device device = Device::cpu());
// `from({1, 2, 3}, {3})`: float32 values; `from<double>(...)` for float64.
template <typename T = float>
Tensor from(std::initializer_list<std::type_identity_t<T>> values, const Shape& sizes, Device device = Device::cpu()) {
  return from_vector(std::vector<T>(values), sizes, device);
}
Tensor scalar_tensor(double value, TensorOptions options = {});

// Printing like PyTorch's repr: values (elided when large), shape and dtype.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace attograd
