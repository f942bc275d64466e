#include "tensor/dense_span.h"

#include <algorithm>
#include <utility>

#include "tensor/kernels.h"

namespace attograd::kernels {

std::optional<StorageSpan> dense_span(const std::vector<Tensor>& parts) {
  if (parts.empty()) return std::nullopt;
  const Tensor& first = parts.front();
  for (const Tensor& p : parts)
    if (!p.defined() || p.storage() != first.storage() || p.sizes() != first.sizes() ||
        p.strides() != first.strides() || p.numel() == 0)
      return std::nullopt;
  // The parts as one tensor with a leading dim over them: (size, stride) pairs.
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;
  for (std::int64_t d = 0; d < first.dim(); ++d)
    if (first.size(d) > 1) dims.emplace_back(first.size(d), first.stride(d));
  if (parts.size() > 1) {
    const std::int64_t step = parts[1].offset() - first.offset();
    for (std::size_t i = 1; i < parts.size(); ++i)
      if (parts[i].offset() - parts[i - 1].offset() != step) return std::nullopt;
    if (step <= 0) return std::nullopt;
    dims.emplace_back(static_cast<std::int64_t>(parts.size()), step);
  }
  // Dense and non-overlapping: in increasing stride, each stride is the count
  // of elements the smaller dims span.
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::int64_t covered = 1;
  for (const auto& [size, stride] : dims) {
    if (stride != covered) return std::nullopt;
    covered *= size;
  }
  return StorageSpan{first.offset(), covered};
}

Tensor flat_view(const Tensor& part, const StorageSpan& span) { return make_view(part, {span.numel}, {1}, span.offset); }

std::vector<Tensor> views_over(const Tensor& flat, const std::vector<Tensor>& parts, const StorageSpan& span) {
  std::vector<Tensor> views;
  for (const Tensor& p : parts)
    views.push_back(make_view(flat, p.sizes(), p.strides(), flat.offset() + p.offset() - span.offset));
  return views;
}

std::vector<Tensor> cast_keeping_layout(const std::vector<Tensor>& parts, DType dtype) {
  if (const std::optional<StorageSpan> span = dense_span(parts))
    return views_over(cast(flat_view(parts.front(), *span), dtype), parts, *span);
  std::vector<Tensor> cast_parts;
  for (const Tensor& p : parts) cast_parts.push_back(cast(p, dtype));
  return cast_parts;
}

}  // namespace attograd::kernels
