#pragma once
// What every bridge in cuda/bridge/ needs to call a launcher: the stream of a
// tensor's device, and the StridedLayout (cuda/strided.h) of a loop over some
// shape with each operand read through its own (broadcast) strides.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "cuda/launchers.h"
#include "cuda/stream.h"
#include "tensor/kernel_common.h"
#include "tensor/tensor.h"

namespace attograd::gpu {

// Makes t's device current and returns its stream.
inline cudaStream_t stream_of(const Tensor& t) { return cuda::stream(t.device().index); }

// A loop over `shape` with N operands whose element strides over it are given
// (0 on broadcast dims). Size-1 dims are dropped and neighbouring dims merged
// where every operand steps through them as one, as cpu/loops.h does,
// so the kernel sees the fewest dims the layouts allow.
template <int N>
cuda::StridedLayout<N> collapse(const char* op, const Shape& shape, const std::array<Shape, N>& strides) {
  cuda::StridedLayout<N> layout;
  layout.numel = numel_of(shape);
  Shape sizes;
  std::array<Shape, N> kept;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sizes.push_back(shape[d]);
    for (int i = 0; i < N; ++i) kept[i].push_back(strides[i][d]);
  }
  for (std::size_t d = sizes.size(); d-- > 1;) {
    bool mergeable = true;
    for (int i = 0; i < N; ++i) mergeable &= kept[i][d - 1] == kept[i][d] * sizes[d];
    if (!mergeable) continue;
    sizes[d - 1] *= sizes[d];
    sizes.erase(sizes.begin() + d);
    for (int i = 0; i < N; ++i) {
      kept[i][d - 1] = kept[i][d];
      kept[i].erase(kept[i].begin() + d);
    }
  }
  AG_CHECK(static_cast<int>(sizes.size()) <= cuda::kMaxDims, op,
           "loop over {} needs {} dims after merging, more than the CUDA kernels' {}", shape_str(shape), sizes.size(),
           cuda::kMaxDims);
  layout.ndim = static_cast<int>(sizes.size());
  layout.contiguous = true;
  for (int d = 0; d < layout.ndim; ++d) {
    layout.sizes[d] = sizes[d];
    for (int i = 0; i < N; ++i) layout.strides[i][d] = kept[i][d];
  }
  for (int i = 0; i < N; ++i) layout.contiguous &= layout.ndim == 0 || (layout.ndim == 1 && kept[i][0] == 1);
  return layout;
}

// The loop over `shape` reading each operand through its strides broadcast to `shape`.
template <int N>
cuda::StridedLayout<N> layout_of(const char* op, const Shape& shape, const std::array<const Tensor*, N>& operands) {
  std::array<Shape, N> strides;
  for (int i = 0; i < N; ++i) strides[i] = broadcast_strides(operands[i]->sizes(), operands[i]->strides(), shape);
  return collapse<N>(op, shape, strides);
}

// x's dims split into the kept ones (in order) and `reduced` ones, each a
// one-operand layout of x's strides over them (cuda::ReduceLayout).
inline cuda::ReduceLayout reduce_layout_of(const char* op, const Tensor& x, const std::vector<int>& reduced) {
  Shape kept_sizes, kept_strides, reduced_sizes, reduced_strides;
  for (int d = 0; d < static_cast<int>(x.dim()); ++d) {
    const bool is_reduced = std::find(reduced.begin(), reduced.end(), d) != reduced.end();
    (is_reduced ? reduced_sizes : kept_sizes).push_back(x.sizes()[d]);
    (is_reduced ? reduced_strides : kept_strides).push_back(x.strides()[d]);
  }
  return {collapse<1>(op, kept_sizes, {kept_strides}), collapse<1>(op, reduced_sizes, {reduced_strides})};
}

}  // namespace attograd::gpu
