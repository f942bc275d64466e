// Reductions with their backward.
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {
namespace {

std::vector<int> normalize_dims(const char* op, const std::vector<std::int64_t>& dims, std::int64_t ndim) {
  std::vector<int> out;
  for (auto d : dims) {
    const int nd = normalize_dim(op, d, ndim);
    AG_CHECK(std::find(out.begin(), out.end(), nd) == out.end(), op, "dim {} given twice", d);
    out.push_back(nd);
  }
  if (out.empty())
    for (int d = 0; d < ndim; ++d) out.push_back(d);
  return out;
}

// x's shape with `dims` set to 1: where a reduced gradient is viewed before expanding back.
Shape keepdim_shape(const Shape& sizes, const std::vector<int>& dims) {
  Shape kept = sizes;
  for (int d : dims) kept[d] = 1;
  return kept;
}

Tensor expand_back(const Tensor& g, const Shape& kept, const Shape& sizes) {
  Tensor gc = kernels::contiguous(g);
  return make_view(gc, sizes, broadcast_strides(kept, contiguous_strides(kept), sizes), gc.offset());
}

}  // namespace

Tensor sum(const Tensor& x_in, const std::vector<std::int64_t>& dims, bool keepdim) {
  const Tensor x = autocast_float32(x_in);  // in float32 under autocast (mean too, through sum)
  const std::vector<int> nd = normalize_dims("sum", dims, x.dim());
  return record("sum", kernels::sum(x, nd, keepdim), {x}, {},
                [sizes = x.sizes(), kept = keepdim_shape(x.sizes(), nd)](
                    const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                  // forward: y = sum(x, dims); so dx = g broadcast back over dims
                  return {expand_back(g, kept, sizes)};
                });
}

Tensor mean(const Tensor& x, const std::vector<std::int64_t>& dims, bool keepdim) {
  const std::vector<int> nd = normalize_dims("mean", dims, x.dim());
  std::int64_t count = 1;
  for (int d : nd) count *= x.sizes()[d];
  AG_CHECK(count > 0, "mean", "mean over an empty selection of {}", shape_str(x.sizes()));
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(count));
}

Tensor max(const Tensor& x, std::int64_t dim, bool keepdim) {
  AG_CHECK(x.defined(), "max", "input is an undefined tensor");
  const int d = normalize_dim("max", dim, x.dim());
  kernels::MaxResult r = kernels::max(x, d, keepdim);
  return record("max", r.values, {x}, {r.indices},
                [sizes = x.sizes(), d, kept = keepdim_shape(x.sizes(), {d})](
                    const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = max(x, dim); so dx = g at the first argmax, 0 elsewhere
                  Shape pos_shape(sizes.size(), 1);
                  pos_shape[d] = sizes[d];
                  const Tensor positions =
                      kernels::cast(reshape(arange(sizes[d], {DType::i64, g.device()}), pos_shape), g.dtype());
                  const Tensor index = kernels::cast(reshape(s[0], kept), g.dtype());
                  const Tensor hit = kernels::binary(kernels::Binary::eq, positions, index);
                  return {kernels::where(hit, expand_back(g, kept, sizes), zeros({}, g.options()))};
                });
}

Tensor max(const Tensor& x) {
  AG_CHECK(x.numel() > 0, "max", "max of an empty tensor {}", shape_str(x.sizes()));
  return reshape(max(reshape(x, {x.numel()}), 0, false), {});
}

Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim) {
  AG_CHECK(x.defined(), "argmax", "input is an undefined tensor");
  return kernels::max(x, normalize_dim("argmax", dim, x.dim()), keepdim).indices;
}

}  // namespace attograd
