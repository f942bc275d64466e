#pragma once
// Kernels that work on many tensors in one launch (AdamW's update, gradient
// clipping's passes), where a launch a tensor would make a small model's step
// mostly launches: up to kTensorsPerLaunch tensors travel in the kernel's
// parameters, tensor k taking blocks [first_block[k], first_block[k + 1]).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/device_utils.cuh"

namespace attograd::cuda {

constexpr int kTensorsPerLaunch = 32;

template <typename Tensor>
struct TensorLaunch {
  Tensor tensors[kTensorsPerLaunch];
  int first_block[kTensorsPerLaunch + 1];
};

// This block's tensor k, its index among that tensor's blocks and their count.
struct BlockOfTensor {
  int k, index, count;
  template <typename Tensor>
  __device__ __forceinline__ explicit BlockOfTensor(const TensorLaunch<Tensor>& launch) {
    const int block = static_cast<int>(blockIdx.x);
    k = 0;
    while (block >= launch.first_block[k + 1]) ++k;  // tensors with no blocks are passed over
    index = block - launch.first_block[k];
    count = launch.first_block[k + 1] - launch.first_block[k];
  }
  // The first element this thread takes, and the stride of its grid-stride loop.
  __device__ __forceinline__ std::int64_t first() const { return std::int64_t(index) * kThreads + threadIdx.x; }
  __device__ __forceinline__ std::int64_t stride() const { return std::int64_t(count) * kThreads; }
};

// Blocks for a tensor of n elements (tensor.n): grid_for's, at most max_blocks, none for an empty one.
inline int blocks_for(std::int64_t n, unsigned max_blocks) {
  return n > 0 ? static_cast<int>(std::min(grid_for(n), max_blocks)) : 0;
}

// The launches of `count` tensors, up to kTensorsPerLaunch each, at most
// max_blocks blocks a tensor (else grid_for's own cap): launch_with(launch,
// blocks) for each one with any blocks.
template <typename Tensor, typename Launch>
void for_each_tensor_launch(const Tensor* tensors, int count, Launch launch_with,
                            unsigned max_blocks = std::numeric_limits<unsigned>::max()) {
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    const int here = std::min(kTensorsPerLaunch, count - first);
    TensorLaunch<Tensor> launch{};
    int blocks = 0;
    for (int k = 0; k < here; ++k) {
      launch.tensors[k] = tensors[first + k];
      launch.first_block[k] = blocks;
      blocks += blocks_for(tensors[first + k].n, max_blocks);
    }
    launch.first_block[here] = blocks;
    if (blocks > 0) launch_with(launch, blocks);
  }
}

}  // namespace attograd::cuda
