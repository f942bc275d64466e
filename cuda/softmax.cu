// Softmax and log-softmax over the last dim of contiguous (rows, n) buffers,
// forward and backward. Each row is read by a warp (or a block, for long
// rows); the row's max and sums are warp-shuffle reductions. Numerically
// stable: exponentials are taken of x - max(x), never of x.
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

template <int Threads, bool Log, typename T>
__global__ void softmax_forward_kernel(T* y, const T* x, std::int64_t rows, std::int64_t n) {
  for_each_row<Threads>(rows, [&](std::int64_t r, int lane, bool active) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    T m = dmath::neg_infinity<T>();
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) m = MaxOp{}(m, xr[i]);
    m = row_reduce<Threads>(m, MaxOp{});
    // A row of all -inf (every position masked) gives exp(-inf - -inf) = NaN, as on the CPU and in PyTorch.
    T s = 0;
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) s += dmath::exp(xr[i] - m);
    s = row_reduce<Threads>(s, SumOp{});
    if (!active) return;
    if constexpr (Log) {
      const T lse = m + dmath::log(s);
      for (std::int64_t i = lane; i < n; i += Threads) yr[i] = xr[i] - lse;
    } else {
      const T inv = T(1) / s;
      for (std::int64_t i = lane; i < n; i += Threads) yr[i] = dmath::exp(xr[i] - m) * inv;
    }
  });
}

template <int Threads, bool Log, typename T>
__global__ void softmax_backward_kernel(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t n) {
  for_each_row<Threads>(rows, [&](std::int64_t r, int lane, bool active) {
    const T *yr = y + r * n, *dyr = dy + r * n;
    T* dxr = dx + r * n;
    // softmax:     forward y = softmax(x);      so dx = y * (dy - sum(dy * y))
    // log_softmax: forward y = x - logsumexp(x); so dx = dy - exp(y) * sum(dy)
    T s = 0;
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) s += Log ? dyr[i] : dyr[i] * yr[i];
    s = row_reduce<Threads>(s, SumOp{});
    if (!active) return;
    for (std::int64_t i = lane; i < n; i += Threads)
      dxr[i] = Log ? dyr[i] - dmath::exp(yr[i]) * s : yr[i] * (dyr[i] - s);
  });
}

template <bool Log, typename T>
void forward(T* y, const T* x, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  launch_rows(rows, n, [&](auto threads, unsigned grid) {
    launch(softmax_forward_kernel<decltype(threads)::value, Log, T>, grid, kThreads, 0, stream, y, x, rows, n);
  });
}

template <bool Log, typename T>
void backward(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  launch_rows(rows, n, [&](auto threads, unsigned grid) {
    launch(softmax_backward_kernel<decltype(threads)::value, Log, T>, grid, kThreads, 0, stream, dx, y, dy, rows, n);
  });
}

}  // namespace

template <typename T>
void softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  forward<false>(y, x, rows, n, stream);
}
template <typename T>
void softmax_backward(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  backward<false>(dx, y, dy, rows, n, stream);
}
template <typename T>
void log_softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  forward<true>(y, x, rows, n, stream);
}
template <typename T>
void log_softmax_backward(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  backward<true>(dx, y, dy, rows, n, stream);
}

#define AG_INSTANTIATE(T)                                                                                     \
  template void softmax_forward<T>(T*, const T*, std::int64_t, std::int64_t, cudaStream_t);                   \
  template void softmax_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, cudaStream_t);        \
  template void log_softmax_forward<T>(T*, const T*, std::int64_t, std::int64_t, cudaStream_t);               \
  template void log_softmax_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, cudaStream_t);
AG_INSTANTIATE(float)
AG_INSTANTIATE(double)
#undef AG_INSTANTIATE

}  // namespace attograd::cuda
