#pragma once
// Casting tensors that together fill one stretch of their storage, in a single
// flat pass that keeps their layout. The bfloat16 attention, where it widens to
// float32 (tensor/dispatch_attention.cpp), reads q, k and v as three strided views of
// one packed projection and writes its output and gradients into such views;
// three strided casts each way, and a copy to merge the heads after the
// output's, cost more than the kernel's own float32 work at the default task's
// sizes. Private to the library.
#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace attograd::kernels {

// Where `parts` lie when together they cover each element of one contiguous
// stretch of a storage exactly once: one non-overlapping dense tensor in any
// dim order, or equal views of the same sizes and strides whose offsets step
// by one stride (the q, k, v of a packed projection). Else nothing.
struct StorageSpan {
  std::int64_t offset = 0;  // the stretch's first element in the storage
  std::int64_t numel = 0;
};
std::optional<StorageSpan> dense_span(const std::vector<Tensor>& parts);

// The stretch as a flat tensor over the parts' storage (parts[0]'s), and
// `parts` laid over another flat tensor of span.numel elements, each at its
// place in the stretch with its sizes and strides.
Tensor flat_view(const Tensor& part, const StorageSpan& span);
std::vector<Tensor> views_over(const Tensor& flat, const std::vector<Tensor>& parts, const StorageSpan& span);

// parts[i] in `dtype`: views of one new buffer laid out as the parts are, cast
// in one flat pass, where they have a dense_span; else each cast alone (contiguous).
std::vector<Tensor> cast_keeping_layout(const std::vector<Tensor>& parts, DType dtype);

}  // namespace attograd::kernels
