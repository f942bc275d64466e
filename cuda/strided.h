#pragma once
// How a kernel walks tensors of any layout: a loop shape of up to kMaxDims
// dims and, per operand, a stride in elements for each dim (0 on broadcast
// dims). The host side (cuda/bridge/launch.h) builds it after dropping size-1
// dims and merging dims that every operand walks as one, so contiguous tensors
// of any rank arrive as a single dim with `contiguous` set and skip the index
// arithmetic entirely.
#include <cstdint>

namespace attograd::cuda {

constexpr int kMaxDims = 8;

template <int N>
struct StridedLayout {
  int ndim = 0;
  std::int64_t numel = 0;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[N][kMaxDims] = {};  // in elements
  bool contiguous = false;  // loop index i is element i of every operand
};

#if defined(__CUDACC__) || defined(ATTOGRAD_CUDA_EMULATION)
// Element offsets of loop index i in each operand. Index is 32-bit when the
// loop has fewer than 2^31 elements: 64-bit division is several times slower.
template <typename Index, int N>
__device__ __forceinline__ void offsets_of(const StridedLayout<N>& layout, Index i, std::int64_t (&offset)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) offset[k] = 0;
  for (int d = layout.ndim - 1; d >= 0; --d) {
    const Index size = static_cast<Index>(layout.sizes[d]);
    const Index index = i % size;
    i /= size;
#pragma unroll
    for (int k = 0; k < N; ++k) offset[k] += static_cast<std::int64_t>(index) * layout.strides[k][d];
  }
}

template <int N>
__device__ __forceinline__ void offsets_at(const StridedLayout<N>& layout, std::int64_t i, std::int64_t (&offset)[N]) {
  if (layout.contiguous) {
#pragma unroll
    for (int k = 0; k < N; ++k) offset[k] = i;
  } else if (layout.numel <= 0x7fffffff) {
    offsets_of<std::uint32_t>(layout, static_cast<std::uint32_t>(i), offset);
  } else {
    offsets_of<std::uint64_t>(layout, static_cast<std::uint64_t>(i), offset);
  }
}
#endif

}  // namespace attograd::cuda
