#pragma once
// The tensor-core product of cuda/mma.cuh on known operands, run on the GPU (or
// the emulator) by tests/cuda_mma_probe.cu; checked in test_cuda.cpp. Built only
// with CUDA (ATTOGRAD_WITH_CUDA).
#include <vector>

namespace attograd::test {

struct WarpProduct {
  std::vector<float> tf32, three_tf32;  // C = A B (16 x 8, row major) as one TF32 product and as 3xTF32
};

// a: 16 x 8, b: 8 x 8, both row major. One warp's mma.sync.m16n8k8, its fragments
// loaded and stored as cuda/mma.cuh lays them out.
WarpProduct warp_product_on_gpu(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace attograd::test
