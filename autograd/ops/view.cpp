// View ops (same storage, new sizes/strides/offset) and copies, with their
// backward. Every view checks its arguments; `view` refuses strides it cannot
// express instead of silently copying (use reshape for that).
#include <algorithm>
#include <numeric>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {
namespace {

// Resolves one -1 in `sizes` against numel; checks the element count.
Shape infer_sizes(const char* op, const Shape& sizes, std::int64_t numel, const Shape& from) {
  Shape out = sizes;
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      AG_CHECK(infer < 0, op, "only one dim can be -1 in {}", shape_str(sizes));
      infer = static_cast<std::int64_t>(i);
    } else {
      AG_CHECK(out[i] >= 0, op, "invalid size {} in {}", out[i], shape_str(sizes));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    AG_CHECK(known != 0 && numel % known == 0, op, "shape {} is invalid for {} ({} elements)", shape_str(sizes),
             shape_str(from), numel);
    out[infer] = numel / known;
  }
  AG_CHECK(numel_of(out) == numel, op, "shape {} is invalid for {} ({} elements)", shape_str(sizes),
           shape_str(from), numel);
  return out;
}

// Strides that give `sizes` the same element order as (old_sizes, old_strides),
// or an empty result when no such strides exist (PyTorch's computeStride):
// each run of old dims that is contiguous in memory can be re-split freely.
bool view_strides(const Shape& old_sizes, const Shape& old_strides, const Shape& sizes, Shape& strides) {
  strides.assign(sizes.size(), 0);
  if (numel_of(sizes) == 0 || old_sizes.empty()) {
    strides = contiguous_strides(sizes);
    return true;
  }
  std::int64_t view_d = static_cast<std::int64_t>(sizes.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(old_sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_sizes[d];
    // At the start of a contiguous chunk (or the first dim), lay out the view dims of this chunk.
    if (d == 0 || (old_sizes[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor alias(const char* op, const Tensor& x, Shape sizes, Shape strides, std::int64_t offset, BackwardFn backward) {
  return record(op, make_view(x, std::move(sizes), std::move(strides), offset), {x}, {}, std::move(backward));
}

void check_defined(const char* op, const Tensor& x) { AG_CHECK(x.defined(), op, "input is an undefined tensor"); }

}  // namespace

Tensor view(const Tensor& x, const Shape& sizes_in) {
  check_defined("view", x);
  const Shape sizes = infer_sizes("view", sizes_in, x.numel(), x.sizes());
  Shape strides;
  AG_CHECK(view_strides(x.sizes(), x.strides(), sizes, strides), "view",
           "cannot view {} with strides {} as {}: the layout is incompatible (use reshape, which copies)",
           shape_str(x.sizes()), shape_str(x.strides()), shape_str(sizes));
  return alias("view", x, sizes, strides, x.offset(),
               [from = x.sizes()](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                 // forward: y = x viewed as sizes; so dx = g viewed back
                 return {reshape(g, from)};
               });
}

Tensor reshape(const Tensor& x, const Shape& sizes_in) {
  check_defined("reshape", x);
  const Shape sizes = infer_sizes("reshape", sizes_in, x.numel(), x.sizes());
  Shape strides;
  if (view_strides(x.sizes(), x.strides(), sizes, strides)) return view(x, sizes);
  return view(contiguous(x), sizes);
}

Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1) {
  check_defined("transpose", x);
  const int d0 = normalize_dim("transpose", dim0, x.dim()), d1 = normalize_dim("transpose", dim1, x.dim());
  Shape sizes = x.sizes(), strides = x.strides();
  std::swap(sizes[d0], sizes[d1]);
  std::swap(strides[d0], strides[d1]);
  return alias("transpose", x, sizes, strides, x.offset(),
               [d0, d1](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                 // forward: y = x with dims d0, d1 swapped; so dx = g swapped back
                 return {transpose(g, d0, d1)};
               });
}

Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims) {
  check_defined("permute", x);
  AG_CHECK(static_cast<std::int64_t>(dims.size()) == x.dim(), "permute", "{} dims given for a {}-d tensor",
           dims.size(), x.dim());
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<std::int64_t> inverse(dims.size(), -1);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int d = normalize_dim("permute", dims[i], x.dim());
    AG_CHECK(inverse[d] < 0, "permute", "dim {} repeated in [{}]", dims[i], fmt::join(dims, ","));
    inverse[d] = static_cast<std::int64_t>(i);
    sizes[i] = x.sizes()[d];
    strides[i] = x.strides()[d];
  }
  return alias("permute", x, sizes, strides, x.offset(),
               [inverse](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                 // forward: y = x with dims permuted; so dx = g with the inverse permutation
                 return {permute(g, inverse)};
               });
}

Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  check_defined("slice", x);
  const int d = normalize_dim("slice", dim, x.dim());
  AG_CHECK(step >= 1, "slice", "step must be >= 1, got {}", step);
  const std::int64_t n = x.sizes()[d];
  auto clamp = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
  start = clamp(start);
  end = std::max(start, clamp(end));
  Shape sizes = x.sizes(), strides = x.strides();
  sizes[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return alias("slice", x, sizes, strides, x.offset() + start * x.strides()[d],
               [from = x.sizes(), d, start, step](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                 // forward: y = x[start:end:step] along d; so dx = zeros with g written into that slice
                 Tensor dx = zeros(from, g.options());
                 Shape sizes = dx.sizes(), strides = dx.strides();
                 sizes[d] = g.sizes()[d];
                 strides[d] *= step;
                 kernels::copy_(make_view(dx, sizes, strides, start * dx.strides()[d]), g);
                 return {dx};
               });
}

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  check_defined("narrow", x);
  const int d = normalize_dim("narrow", dim, x.dim());
  AG_CHECK(start >= 0 && length >= 0 && start + length <= x.sizes()[d], "narrow",
           "start {} + length {} out of range for dim {} of size {}", start, length, dim, x.sizes()[d]);
  return slice(x, d, start, start + length);
}

Tensor select(const Tensor& x, std::int64_t dim, std::int64_t index) {
  check_defined("select", x);
  const int d = normalize_dim("select", dim, x.dim());
  const std::int64_t n = x.sizes()[d];
  AG_CHECK(index >= -n && index < n, "select", "index {} out of range for dim {} of size {}", index, dim, n);
  return squeeze(narrow(x, d, index < 0 ? index + n : index, 1), d);
}

Tensor expand(const Tensor& x, const Shape& sizes_in) {
  check_defined("expand", x);
  AG_CHECK(sizes_in.size() >= x.sizes().size(), "expand", "cannot expand {} to fewer dims {}", shape_str(x.sizes()),
           shape_str(sizes_in));
  Shape sizes = sizes_in;
  const std::size_t lead = sizes.size() - x.sizes().size();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::int64_t have = i < lead ? 1 : x.sizes()[i - lead];
    if (sizes[i] == -1) {
      AG_CHECK(i >= lead, "expand", "-1 is not allowed for a new leading dim in {}", shape_str(sizes_in));
      sizes[i] = have;
    }
    AG_CHECK(have == sizes[i] || have == 1, "expand", "cannot expand {} to {}", shape_str(x.sizes()),
             shape_str(sizes_in));
  }
  return alias("expand", x, sizes, broadcast_strides(x.sizes(), x.strides(), sizes), x.offset(),
               [from = x.sizes()](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                 // forward: y = x broadcast to sizes; so dx = g summed over the broadcast dims
                 return {kernels::sum_to(g, from)};
               });
}

Tensor unsqueeze(const Tensor& x, std::int64_t dim) {
  check_defined("unsqueeze", x);
  const int d = normalize_dim("unsqueeze", dim, x.dim() + 1);
  Shape sizes = x.sizes(), strides = x.strides();
  const std::int64_t stride = d < x.dim() ? x.sizes()[d] * x.strides()[d] : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return alias("unsqueeze", x, sizes, strides, x.offset(),
               [d](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {squeeze(g, d)}; });
}

Tensor squeeze(const Tensor& x, std::int64_t dim) {
  check_defined("squeeze", x);
  const int d = normalize_dim("squeeze", dim, x.dim());
  AG_CHECK(x.sizes()[d] == 1, "squeeze", "dim {} of {} has size {}, not 1", dim, shape_str(x.sizes()),
           x.sizes()[d]);
  Shape sizes = x.sizes(), strides = x.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return alias("squeeze", x, sizes, strides, x.offset(),
               [d](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {unsqueeze(g, d)}; });
}

Tensor squeeze(const Tensor& x) {
  check_defined("squeeze", x);
  Shape sizes;
  for (auto s : x.sizes())
    if (s != 1) sizes.push_back(s);
  return reshape(x, sizes);
}

Tensor flatten(const Tensor& x, std::int64_t start_dim, std::int64_t end_dim) {
  check_defined("flatten", x);
  if (x.dim() == 0) return reshape(x, {1});
  const int s = normalize_dim("flatten", start_dim, x.dim()), e = normalize_dim("flatten", end_dim, x.dim());
  AG_CHECK(s <= e, "flatten", "start_dim {} is after end_dim {}", start_dim, end_dim);
  Shape sizes(x.sizes().begin(), x.sizes().begin() + s);
  sizes.push_back(std::accumulate(x.sizes().begin() + s, x.sizes().begin() + e + 1, std::int64_t{1},
                                  std::multiplies<>()));
  sizes.insert(sizes.end(), x.sizes().begin() + e + 1, x.sizes().end());
  return reshape(x, sizes);
}

Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", x);
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  check_defined("clone", x);
  return record("clone", kernels::clone(x), {x}, {},
                [](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> { return {g}; });
}

Tensor to(const Tensor& x, DType dtype) {
  check_defined("to", x);
  if (x.dtype() == dtype) return x;
  AG_CHECK(!x.requires_grad() || is_floating(dtype), "to", "cannot cast a tensor that requires grad to {}",
           dtype_name(dtype));
  return record("to_dtype", kernels::cast(x, dtype), {x}, {},
                [from = x.dtype()](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                  return {kernels::cast(g, from)};
                });
}

Tensor to(const Tensor& x, Device device) {
  check_defined("to", x);
  if (x.device() == device) return x;
  return record("to_device", kernels::to_device(x, device), {x}, {},
                [from = x.device()](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                  return {kernels::to_device(g, from)};
                });
}

Tensor to_cpu(const Tensor& x) { return to(x, Device::cpu()); }

}  // namespace attograd
