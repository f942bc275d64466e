// LayerNorm over the last dim of contiguous (rows, n) buffers. Under autocast
// a float32 x gives a bfloat16 y (Y), rounded once as it is stored, and its
// gradient dy comes bfloat16 (G), widened as it is read: the CPU's
// cpu/layer_norm.cpp, without a float32 y or dy in memory.
//
// Forward and the dx part of backward are row kernels (a warp or a block per
// row, cuda/device_utils.cuh). The mean and variance take two passes over the
// row, as on the CPU: the one-pass E[x^2] - E[x]^2 cancels catastrophically
// when the mean is large against the spread.
//
// dweight and dbias are sums over rows, i.e. column sums: one thread per
// column reads down a chunk of rows (neighbouring threads, neighbouring
// addresses), writes a float64 partial per chunk, and a second kernel adds the
// chunks in order. Deterministic, unlike atomics.
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

template <int Threads, typename T, typename Y>
__global__ void layer_norm_forward_kernel(Y* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                                          std::int64_t rows, std::int64_t n, T eps) {
  for_each_row<Threads>(rows, [&](std::int64_t r, int lane, bool active) {
    const T* xr = x + r * n;
    T s = 0;
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) s += xr[i];
    const T mu = row_reduce<Threads>(s, SumOp{}) / T(n);
    T ss = 0;
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) ss += (xr[i] - mu) * (xr[i] - mu);
    const T var = row_reduce<Threads>(ss, SumOp{}) / T(n);
    if (!active) return;
    const T rs = T(1) / dmath::sqrt(var + eps);
    if (lane == 0) mean[r] = mu, rstd[r] = rs;
    Y* yr = y + r * n;
    for (std::int64_t i = lane; i < n; i += Threads) {
      T v = (xr[i] - mu) * rs;
      if (weight) v *= weight[i];
      if (bias) v += bias[i];
      yr[i] = Y(v);
    }
  });
}

// forward: xhat = (x - mean) * rstd, y = xhat * w + b. With dxhat = dy * w:
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
template <int Threads, typename T, typename G>
__global__ void layer_norm_dx_kernel(T* dx, const G* dy, const T* x, const T* weight, const T* mean, const T* rstd,
                                     std::int64_t rows, std::int64_t n) {
  for_each_row<Threads>(rows, [&](std::int64_t r, int lane, bool active) {
    const T* xr = x + r * n;
    const G* dyr = dy + r * n;
    const T mu = active ? mean[r] : T(0), rs = active ? rstd[r] : T(0);
    T sum_dxhat = 0, sum_dxhat_xhat = 0;
    if (active) {
      for (std::int64_t i = lane; i < n; i += Threads) {
        const T dxhat = weight ? T(dyr[i]) * weight[i] : T(dyr[i]);
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * (xr[i] - mu) * rs;
      }
    }
    const T mean_dxhat = row_reduce<Threads>(sum_dxhat, SumOp{}) / T(n);
    const T mean_dxhat_xhat = row_reduce<Threads>(sum_dxhat_xhat, SumOp{}) / T(n);
    if (!active) return;
    T* dxr = dx + r * n;
    for (std::int64_t i = lane; i < n; i += Threads) {
      const T dxhat = weight ? T(dyr[i]) * weight[i] : T(dyr[i]);
      const T xhat = (xr[i] - mu) * rs;
      dxr[i] = rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  });
}

// dw = sum over rows of dy * xhat, db = sum over rows of dy, as a column sum
// (device_utils.cuh): block (x, y) takes columns [x * kWarp, (x + 1) * kWarp)
// over rows [y * chunk, (y + 1) * chunk). Partials are (chunks, n).
template <typename T, typename G>
__global__ void layer_norm_dparams_kernel(double* dw_partial, double* db_partial, const G* dy, const T* x,
                                          const T* mean, const T* rstd, std::int64_t rows, std::int64_t n,
                                          std::int64_t chunk) {
  const int lane = threadIdx.x / kWarp;
  const std::int64_t c = std::int64_t(blockIdx.x) * kWarp + threadIdx.x % kWarp;
  const std::int64_t begin = blockIdx.y * chunk, end = min(rows, begin + chunk);
  double sums[2] = {0, 0};  // dw, db
  if (c < n) {
#pragma unroll 4
    for (std::int64_t r = begin + lane; r < end; r += kColumnLanes) {
      const T g = T(dy[r * n + c]);
      const T xhat = (x[r * n + c] - mean[r]) * rstd[r];
      sums[0] += static_cast<double>(g) * xhat;
      sums[1] += g;
    }
  }
  add_column_lanes(sums);
  if (lane != 0 || c >= n) return;
  if (dw_partial) dw_partial[blockIdx.y * n + c] = sums[0];
  db_partial[blockIdx.y * n + c] = sums[1];
}

}  // namespace

template <typename T, typename Y>
void layer_norm_forward(Y* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias, std::int64_t rows,
                        std::int64_t n, double eps, cudaStream_t stream) {
  launch_rows(rows, n, [&](auto threads, unsigned grid) {
    launch(layer_norm_forward_kernel<decltype(threads)::value, T, Y>, grid, kThreads, 0, stream, y, mean, rstd, x,
           weight, bias, rows, n, static_cast<T>(eps));
  });
}

template <typename T, typename G>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const G* dy, const T* x, const T* weight, const T* mean,
                         const T* rstd, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_rows(rows, n, [&](auto threads, unsigned grid) {
    launch(layer_norm_dx_kernel<decltype(threads)::value, T, G>, grid, kThreads, 0, stream, dx, dy, x, weight, mean,
           rstd, rows, n);
  });
  const std::int64_t chunks = column_sum_chunks(rows, n), chunk = (rows + chunks - 1) / chunks;
  DeviceBuffer dw_partial(dweight ? sizeof(double) * chunks * n : 0), db_partial(sizeof(double) * chunks * n);
  const dim3 grid(static_cast<unsigned>((n + kWarp - 1) / kWarp), static_cast<unsigned>(chunks));
  launch(layer_norm_dparams_kernel<T, G>, grid, kThreads, 0, stream, dweight ? dw_partial.as<double>() : nullptr,
         db_partial.as<double>(), dy, x, mean, rstd, rows, n, chunk);
  CUDA_CHECK_LAUNCH();
  if (dweight) sum_column_partials(dweight, dw_partial.as<const double>(), chunks, n, stream);
  sum_column_partials(dbias, db_partial.as<const double>(), chunks, n, stream);
}

// T: x, the statistics and the parameters; O: y (forward) and dy (backward),
// T or, for a float32 x, bfloat16.
#define AG_INSTANTIATE(T, O)                                                                                          \
  template void layer_norm_forward<T, O>(O*, T*, T*, const T*, const T*, const T*, std::int64_t, std::int64_t, double, \
                                         cudaStream_t);                                                              \
  template void layer_norm_backward<T, O>(T*, T*, T*, const O*, const T*, const T*, const T*, const T*, std::int64_t, \
                                          std::int64_t, cudaStream_t);
AG_INSTANTIATE(float, float)
AG_INSTANTIATE(double, double)
AG_INSTANTIATE(float, bfloat16)
#undef AG_INSTANTIATE

}  // namespace attograd::cuda
