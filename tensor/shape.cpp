#include "tensor/shape.h"

#include "base/error.h"

namespace attograd {

std::int64_t numel_of(const Shape& sizes) {
  std::int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  std::int64_t stride = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<std::int64_t>(sizes[i], 1);
  }
  return strides;
}

std::string shape_str(const Shape& sizes) { return fmt::format("[{}]", fmt::join(sizes, ",")); }

int normalize_dim(const char* op, std::int64_t dim, std::int64_t ndim) {
  std::int64_t d = dim < 0 ? dim + ndim : dim;
  AG_CHECK(d >= 0 && d < ndim, op, "dim {} out of range for a {}-d tensor", dim, ndim);
  return static_cast<int>(d);
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    AG_CHECK(sa == sb || sa == 1 || sb == 1, op, "shapes {} and {} cannot be broadcast", shape_str(a),
             shape_str(b));
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

std::vector<std::int64_t> broadcast_strides(const Shape& sizes, const std::vector<std::int64_t>& strides,
                                            const Shape& target) {
  std::vector<std::int64_t> out(target.size(), 0);
  const std::size_t lead = target.size() - sizes.size();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    out[lead + i] = sizes[i] == 1 && target[lead + i] != 1 ? 0 : strides[i];
  return out;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const std::size_t lead = to.size() - from.size();
  for (std::size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

}  // namespace attograd
