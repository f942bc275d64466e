// One warp's tensor-core product on known operands (see cuda_mma_probe.h): on a
// GPU the one direct check that the fragment layout cuda/mma.cuh reads in the
// PTX ISA is the hardware's, before the attention kernels built on it.
#include "cuda/check.h"
#include "cuda/device_utils.cuh"
#include "cuda/mma.cuh"
#include "cuda_mma_probe.h"

namespace attograd::test {
namespace {

__global__ void warp_product_kernel(const float* A, const float* B, float* c1, float* c3) {
  using namespace attograd::cuda;
  const int g = static_cast<int>(threadIdx.x) / 4, t = static_cast<int>(threadIdx.x) % 4;
  const float a[4] = {A[g * 8 + t], A[(g + 8) * 8 + t], A[g * 8 + t + 4], A[(g + 8) * 8 + t + 4]};
  const float b[2] = {B[t * 8 + g], B[(t + 4) * 8 + g]};
  const SplitFragment<4> as = split_tf32(a);
  const SplitFragment<2> bs = split_tf32(b);
  float one[4] = {}, three[4] = {};
  mma_tf32(one, as.big, bs.big);
  mma_3xtf32(three, as, bs);
  for (int r = 0; r < 4; ++r) {
    const int at = (g + 8 * (r / 2)) * 8 + 2 * t + r % 2;
    c1[at] = one[r], c3[at] = three[r];
  }
}

}  // namespace

WarpProduct warp_product_on_gpu(const std::vector<float>& a, const std::vector<float>& b) {
  // On the default stream, apart from attograd's own: the probe needs nothing else.
  float *da = nullptr, *db = nullptr, *c1 = nullptr, *c3 = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&da), 128 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&db), 64 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c1), 128 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c3), 128 * sizeof(float)));
  CUDA_CHECK(cudaMemcpyAsync(da, a.data(), 128 * sizeof(float), cudaMemcpyHostToDevice, nullptr));
  CUDA_CHECK(cudaMemcpyAsync(db, b.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, nullptr));
  cuda::launch(warp_product_kernel, 1, cuda::kWarp, 0, nullptr, da, db, c1, c3);
  CUDA_CHECK_LAUNCH();
  WarpProduct out{std::vector<float>(128), std::vector<float>(128)};
  CUDA_CHECK(cudaMemcpyAsync(out.tf32.data(), c1, 128 * sizeof(float), cudaMemcpyDeviceToHost, nullptr));
  CUDA_CHECK(cudaMemcpyAsync(out.three_tf32.data(), c3, 128 * sizeof(float), cudaMemcpyDeviceToHost, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (float* p : {da, db, c1, c3}) CUDA_CHECK(cudaFree(p));
  return out;
}

}  // namespace attograd::test
