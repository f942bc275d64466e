// Cross-entropy fused with log-softmax over (rows, n) logits: the forward
// never writes the (rows, n) log-probabilities, only each row's log-sum-exp
// (which backward reuses) and its loss; a single block then averages the row
// losses in a fixed order, so the loss is the same on every run. bfloat16
// logits (L, under autocast) are widened as they are read, and their gradient
// rounded as it is stored, the rest in float32 (T): the float32 kernels' bits
// on the widened logits, without a float32 copy of them or of the gradient.
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

// lse[r] = log(sum(exp(x_r))); row_loss[r] = lse[r] - x_r[target] (0 when ignored).
template <int Threads, typename T, typename L>
__global__ void cross_entropy_rows_kernel(T* lse, double* row_loss, const L* logits, const std::int64_t* targets,
                                          std::int64_t rows, std::int64_t n, std::int64_t ignore_index) {
  for_each_row<Threads>(rows, [&](std::int64_t r, int lane, bool active) {
    const L* xr = logits + r * n;
    T m = dmath::neg_infinity<T>();
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) m = MaxOp{}(m, T(xr[i]));
    m = row_reduce<Threads>(m, MaxOp{});
    // Summed, and the loss taken, in double, as the CPU's row_logsumexp does: a float sum over a
    // long row drifts, and a float lse rounds the loss by up to half an ulp of the logits.
    double s = 0;
    if (active)
      for (std::int64_t i = lane; i < n; i += Threads) s += static_cast<double>(dmath::exp(T(xr[i]) - m));
    s = row_reduce<Threads>(s, SumOp{});
    if (!active || lane != 0) return;
    const double l = static_cast<double>(m) + dmath::log(s);
    lse[r] = static_cast<T>(l);
    const std::int64_t t = targets[r];
    row_loss[r] = t == ignore_index ? 0.0 : l - static_cast<double>(T(xr[t]));
  });
}

// One block: loss = sum(row_loss) / count over counted rows, 0 when none count.
template <typename T>
__global__ void cross_entropy_mean_kernel(T* loss, std::int64_t* count, const double* row_loss,
                                          const std::int64_t* targets, std::int64_t rows, std::int64_t ignore_index) {
  double total = 0, counted = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += kThreads) {
    total += row_loss[r];
    counted += targets[r] != ignore_index;
  }
  total = row_reduce<kThreads>(total, SumOp{});
  counted = row_reduce<kThreads>(counted, SumOp{});
  if (threadIdx.x == 0) {
    *count = static_cast<std::int64_t>(counted);
    *loss = static_cast<T>(counted > 0 ? total / counted : 0.0);
  }
}

// forward: loss = sum over counted rows of (lse - x[target]) / count;
// so dx = (softmax(x) - onehot(target)) * dloss / count, with softmax(x) = exp(x - lse).
template <typename T, typename L>
__global__ void cross_entropy_backward_kernel(L* dx, const L* logits, const std::int64_t* targets, const T* lse,
                                              std::int64_t rows, std::int64_t n, std::int64_t ignore_index,
                                              std::int64_t count, T scale) {
  for (std::int64_t e = global_thread(); e < rows * n; e += grid_threads()) {
    const std::int64_t r = e / n, i = e % n;
    const std::int64_t t = targets[r];
    if (t == ignore_index || count == 0) {
      dx[e] = L(T(0));
      continue;
    }
    const T p = dmath::exp(T(logits[e]) - lse[r]) * scale;
    dx[e] = L(i == t ? p - scale : p);
  }
}

}  // namespace

template <typename T, typename L>
void cross_entropy_forward(T* loss, T* lse, std::int64_t* count, const L* logits, const std::int64_t* targets,
                           std::int64_t rows, std::int64_t n, std::int64_t ignore_index, cudaStream_t stream) {
  DeviceBuffer row_loss(sizeof(double) * rows);  // (rows)
  launch_rows(rows, n, [&](auto threads, unsigned grid) {
    launch(cross_entropy_rows_kernel<decltype(threads)::value, T, L>, grid, kThreads, 0, stream, lse,
           row_loss.as<double>(), logits, targets, rows, n, ignore_index);
  });
  launch(cross_entropy_mean_kernel<T>, 1, kThreads, 0, stream, loss, count, row_loss.as<const double>(), targets, rows,
         ignore_index);
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename L>
void cross_entropy_backward(L* dlogits, const L* logits, const std::int64_t* targets, const T* lse, std::int64_t rows,
                            std::int64_t n, std::int64_t ignore_index, std::int64_t count, T scale,
                            cudaStream_t stream) {
  if (rows * n == 0) return;
  launch(cross_entropy_backward_kernel<T, L>, grid_for(rows * n), kThreads, 0, stream, dlogits, logits, targets, lse,
         rows, n, ignore_index, count, scale);
  CUDA_CHECK_LAUNCH();
}

// T: the arithmetic, lse and the loss; L: the logits and their gradient (T, or bfloat16 for float32).
#define AG_INSTANTIATE(T, L)                                                                                          \
  template void cross_entropy_forward<T, L>(T*, T*, std::int64_t*, const L*, const std::int64_t*, std::int64_t,       \
                                            std::int64_t, std::int64_t, cudaStream_t);                                \
  template void cross_entropy_backward<T, L>(L*, const L*, const std::int64_t*, const T*, std::int64_t, std::int64_t, \
                                             std::int64_t, std::int64_t, T, cudaStream_t);
AG_INSTANTIATE(float, float)
AG_INSTANTIATE(double, double)
AG_INSTANTIATE(float, bfloat16)
#undef AG_INSTANTIATE

}  // namespace attograd::cuda
