#pragma once
// The tensor-core products of cuda/mma.cuh and cuda/mma_bf16.cuh on known operands, run on the GPU (or
// the emulator) by tests/cuda_mma_probe.cu; checked in test_cuda.cpp. Built only
// with CUDA (ATTOGRAD_WITH_CUDA).
#include <cstdint>
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

// One warp's load_matrices (ldmatrix .x4, cuda/mma_bf16.cuh) from a 32 x 8
// shared-memory array holding the value r * 8 + c at row r, column c, lane l
// giving the address of row (13 l) mod 32; plain, or transposing with
// `transposed`. What each lane got: lane l's four registers at 4 l to 4 l + 3.
std::vector<std::uint32_t> load_matrices_on_gpu(bool transposed);

// a: 64 x 64, bt: 256 x 64 (B transposed), both row major, every value a
// bfloat16 number. One warpgroup's four wgmma.mma_async m64n256k16 .bf16
// products over K = 64 (cuda/wgmma.cuh), A and B^T each in its swizzled
// K-major or MN-major tile, the accumulators stored as that file lays them
// out; C = A B, 64 x 256, row major. Only where cuda::wgmma_kernels_run (an
// sm_90a build on an sm_90 GPU, or the emulator).
std::vector<float> warpgroup_product_bf16_on_gpu(const std::vector<float>& a, const std::vector<float>& bt,
                                                bool a_mn_major, bool b_mn_major);

// One TMA copy (cuda/tma.cuh) of the box of 64 x 16 bfloat16 (bits) at
// (x, y, z) of `tensor`, extent[0] values a line, lines `ld` apart, planes
// `plane` apart, into shared memory through an mbarrier (cuda/mbarrier.cuh),
// then the box's 2048 bytes out as they lie there: 1024 values. Only where
// cuda::wgmma_kernels_run.
std::vector<std::uint16_t> tma_box_on_gpu(const std::vector<std::uint16_t>& tensor, const std::int64_t (&extent)[3],
                                          std::int64_t ld, std::int64_t plane, int x, int y, int z);

}  // namespace attograd::test
