// One warp's tensor-core product on known operands (see cuda_mma_probe.h): on a
// GPU the one direct check that the fragment layout cuda/mma.cuh reads in the
// PTX ISA is the hardware's, before the attention kernels built on it.
#include "cuda/check.h"
#include "cuda/device_utils.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mma.cuh"
#include "cuda/mbarrier.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"
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

// The bfloat16 bits of x, which is a bfloat16 number: its top half.
__device__ std::uint16_t top_half(float x) { return static_cast<std::uint16_t>(cuda::float_bits(x) >> 16); }

__global__ void warp_product_bf16_kernel(const float* A, const float* B, float* C) {
  using namespace attograd::cuda;
  const int g = static_cast<int>(threadIdx.x) / 4, t = static_cast<int>(threadIdx.x) % 4;
  const auto a_pair = [&](int row, int k) { return bf16_pair(top_half(A[row * 16 + k]), top_half(A[row * 16 + k + 1])); };
  const auto b_pair = [&](int k, int col) { return bf16_pair(top_half(B[k * 8 + col]), top_half(B[(k + 1) * 8 + col])); };
  const std::uint32_t a[4] = {a_pair(g, 2 * t), a_pair(g + 8, 2 * t), a_pair(g, 2 * t + 8), a_pair(g + 8, 2 * t + 8)};
  const std::uint32_t b[2] = {b_pair(2 * t, g), b_pair(2 * t + 8, g)};
  float c[4] = {};
  mma_bf16(c, a, b);
  for (int r = 0; r < 4; ++r) C[(g + 8 * (r / 2)) * 8 + 2 * t + r % 2] = c[r];
}

template <bool Transposed>
__global__ void load_matrices_kernel(std::uint32_t* out) {
  __shared__ __align__(16) std::uint16_t rows[32 * 8];
  const int lane = static_cast<int>(threadIdx.x);
  for (int c = 0; c < 8; ++c) rows[lane * 8 + c] = static_cast<std::uint16_t>(lane * 8 + c);
  __syncthreads();
  std::uint32_t r[4];
  cuda::load_matrices<Transposed>(r, rows + (13 * lane) % 32 * 8);
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = r[i];
}

// A's and B^T's tiles into shared memory as cuda/wgmma.cuh lays them out
// (gemm_tiles::WgmmaTile), each K-major or MN-major, one value at a time (the
// layout is what is probed, not the copies), then the four products of K =
// 64 and each thread's accumulators out.
constexpr int kProbeN = 256, kProbeK = 64;
constexpr int kProbeSharedBytes = (64 + kProbeN) * cuda::wgmma::kLineBytes + cuda::wgmma::kSwizzleBytes;
template <bool AMnMajor, bool BMnMajor>
__global__ void warpgroup_product_kernel(const float* A, const float* Bt, float* C) {
  using namespace attograd::cuda;
  unsigned char* a_tile = wgmma::swizzle_aligned(dynamic_shared_memory<unsigned char>());
  unsigned char* b_tile = a_tile + 64 * wgmma::kLineBytes;
  // X[row][k] into its tile: line and chunk as WgmmaTile<Rows, KFastest> has them.
  const auto put = [](unsigned char* tile, bool mn_major, int row, int k, float x) {
    const int line = mn_major ? k : row, chunk = mn_major ? row / 8 : k / 8, in_chunk = mn_major ? row % 8 : k % 8;
    const int at = mn_major ? gemm_tiles::WgmmaTile<64, false>::Layout::at(line, chunk)
                            : gemm_tiles::WgmmaTile<64, true>::Layout::at(line, chunk);
    *reinterpret_cast<std::uint16_t*>(tile + at * 16 + in_chunk * 2) = top_half(x);
  };
  for (int i = static_cast<int>(threadIdx.x); i < 64 * kProbeK; i += wgmma::kWarpgroup)
    put(a_tile, AMnMajor, i / kProbeK, i % kProbeK, A[i]);
  for (int i = static_cast<int>(threadIdx.x); i < kProbeN * kProbeK; i += wgmma::kWarpgroup)
    put(b_tile, BMnMajor, i / kProbeK, i % kProbeK, Bt[i]);
  wgmma::fence_async_shared();
  __syncthreads();
  float d[128];
  for (float& x : d) x = -1.0f;  // the first product overwrites them
  wgmma::fence();
  const std::uint32_t a_at = wgmma::shared_address(a_tile), b_at = a_at + 64 * wgmma::kLineBytes;
#pragma unroll
  for (int step = 0; step < kProbeK / 16; ++step)
    wgmma::mma_bf16_n256<AMnMajor, BMnMajor>(d, wgmma::tile_descriptor<!AMnMajor>(a_at, step),
                                             wgmma::tile_descriptor<!BMnMajor>(b_at, step), step > 0);
  wgmma::commit();
  wgmma::wait<0>();
  const int t = static_cast<int>(threadIdx.x), w = t / 32, g = t % 32 / 4, q = t % 4;
#pragma unroll
  for (int j = 0; j < kProbeN / 8; ++j)
#pragma unroll
    for (int v = 0; v < 4; ++v) C[(16 * w + g + 8 * (v / 2)) * kProbeN + 8 * j + 2 * q + v % 2] = d[4 * j + v];
}

// The box through one mbarrier phase; every thread then copies part of it out.
constexpr int kBoxBytes = 64 * 16 * 2, kBoxSharedBytes = cuda::wgmma::kSwizzleBytes + kBoxBytes + 8;

__global__ void tma_box_kernel(const __grid_constant__ cuda::tma::TensorMap map, int x, int y, int z,
                               std::uint16_t* out) {
  using namespace attograd::cuda;
  unsigned char* const tile = wgmma::swizzle_aligned(dynamic_shared_memory<unsigned char>());
  const std::uint32_t box = wgmma::shared_address(tile), barrier = box + kBoxBytes;
  if (threadIdx.x == 0) {
    mbarrier::init(barrier, 1);
    mbarrier::fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier::arrive_expect_bytes(barrier, kBoxBytes);
    tma::load_box(&map, box, barrier, x, y, z);
  }
  mbarrier::wait(barrier, 0);
  const auto* values = reinterpret_cast<const std::uint16_t*>(tile);
  for (int i = static_cast<int>(threadIdx.x); i < kBoxBytes / 2; i += static_cast<int>(blockDim.x)) out[i] = values[i];
}

// x in new device memory, copied on the default stream: the probes need
// nothing of attograd's own streams or allocator.
float* device_copy(const std::vector<float>& x) {
  float* d = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), x.size() * sizeof(float)));
  CUDA_CHECK(cudaMemcpyAsync(d, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, nullptr));
  return d;
}

}  // namespace

std::vector<float> warp_product_bf16_on_gpu(const std::vector<float>& a, const std::vector<float>& b) {
  float *da = device_copy(a), *db = device_copy(b), *dc = device_copy(std::vector<float>(128));
  cuda::launch(warp_product_bf16_kernel, 1, cuda::kWarp, 0, nullptr, da, db, dc);
  CUDA_CHECK_LAUNCH();
  std::vector<float> c(128);
  CUDA_CHECK(cudaMemcpyAsync(c.data(), dc, 128 * sizeof(float), cudaMemcpyDeviceToHost, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (float* p : {da, db, dc}) CUDA_CHECK(cudaFree(p));
  return c;
}

std::vector<std::uint32_t> load_matrices_on_gpu(bool transposed) {
  std::uint32_t* d = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), 128 * sizeof(std::uint32_t)));
  if (transposed)
    cuda::launch(load_matrices_kernel<true>, 1, cuda::kWarp, 0, nullptr, d);
  else
    cuda::launch(load_matrices_kernel<false>, 1, cuda::kWarp, 0, nullptr, d);
  CUDA_CHECK_LAUNCH();
  std::vector<std::uint32_t> got(128);
  CUDA_CHECK(cudaMemcpyAsync(got.data(), d, 128 * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaFree(d));
  return got;
}

std::vector<float> warpgroup_product_bf16_on_gpu(const std::vector<float>& a, const std::vector<float>& bt,
                                                bool a_mn_major, bool b_mn_major) {
  float *da = device_copy(a), *db = device_copy(bt), *dc = device_copy(std::vector<float>(64 * kProbeN));
  const auto kernel = a_mn_major ? (b_mn_major ? warpgroup_product_kernel<true, true> : warpgroup_product_kernel<true, false>)
                                 : (b_mn_major ? warpgroup_product_kernel<false, true> : warpgroup_product_kernel<false, false>);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kProbeSharedBytes));
  cuda::launch(kernel, 1, cuda::wgmma::kWarpgroup, kProbeSharedBytes, nullptr, da, db, dc);
  CUDA_CHECK_LAUNCH();
  std::vector<float> c(64 * kProbeN);
  CUDA_CHECK(cudaMemcpyAsync(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (float* p : {da, db, dc}) CUDA_CHECK(cudaFree(p));
  return c;
}

std::vector<std::uint16_t> tma_box_on_gpu(const std::vector<std::uint16_t>& tensor, const std::int64_t (&extent)[3],
                                          std::int64_t ld, std::int64_t plane, int x, int y, int z) {
  std::uint16_t *dt = nullptr, *dout = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dt), tensor.size() * 2));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dout), kBoxBytes));
  CUDA_CHECK(cudaMemcpyAsync(dt, tensor.data(), tensor.size() * 2, cudaMemcpyHostToDevice, nullptr));
  const cuda::tma::TensorMap map = cuda::tma::tile_map({dt, {extent[0], extent[1], extent[2]}, {ld, plane}, {64, 16}});
  cuda::launch(tma_box_kernel, 1, cuda::wgmma::kWarpgroup, kBoxSharedBytes, nullptr, map, x, y, z, dout);
  CUDA_CHECK_LAUNCH();
  std::vector<std::uint16_t> got(kBoxBytes / 2);
  CUDA_CHECK(cudaMemcpyAsync(got.data(), dout, kBoxBytes, cudaMemcpyDeviceToHost, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaFree(dt));
  CUDA_CHECK(cudaFree(dout));
  return got;
}

WarpProduct warp_product_on_gpu(const std::vector<float>& a, const std::vector<float>& b) {
  float *da = device_copy(a), *db = device_copy(b), *c1 = device_copy(std::vector<float>(128)),
        *c3 = device_copy(std::vector<float>(128));
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
