#pragma once
// The tensor-core products of cuda/mma.cuh and cuda/mma_bf16.cuh on known operands, run on the GPU (or
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

// a: 16 x 16, b: 16 x 8, both row major, every value a bfloat16 number. One
// warp's mma.sync.m16n8k16 .bf16 (cuda/mma_bf16.cuh), its fragments loaded and
// stored as that file lays them out; C = A B, 16 x 8, row major.
std::vector<float> warp_product_bf16_on_gpu(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace attograd::test
