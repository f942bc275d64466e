// Embedding: rows of a (V, C) table picked by int64 ids, and the backward that
// scatter-adds gradient rows into a zeroed (V, C) table. Repeated ids add into
// the same row from different threads, so the backward uses atomicAdd: fast,
// but the order of the additions (and so the last bits of a row hit many times)
// may differ between runs. The CPU version is the deterministic reference.
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

template <typename T>
__global__ void embedding_forward_kernel(T* out, const T* weight, const std::int64_t* ids, std::int64_t count,
                                         std::int64_t channels) {
  for (std::int64_t e = global_thread(); e < count * channels; e += grid_threads()) {
    const std::int64_t i = e / channels, c = e % channels;
    out[e] = weight[ids[i] * channels + c];
  }
}

// forward: out[i] = weight[ids[i]]; so dweight[v] = sum of dy[i] over every i with ids[i] == v
template <typename T>
__global__ void embedding_backward_kernel(T* dweight, const T* dy, const std::int64_t* ids, std::int64_t count,
                                          std::int64_t channels) {
  for (std::int64_t e = global_thread(); e < count * channels; e += grid_threads()) {
    const std::int64_t i = e / channels, c = e % channels;
    atomicAdd(dweight + ids[i] * channels + c, dy[e]);
  }
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const T* weight, const std::int64_t* ids, std::int64_t count, std::int64_t channels,
                       cudaStream_t stream) {
  if (count * channels == 0) return;
  embedding_forward_kernel<<<grid_for(count * channels), kThreads, 0, stream>>>(out, weight, ids, count, channels);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(T* dweight, const T* dy, const std::int64_t* ids, std::int64_t count, std::int64_t channels,
                        std::int64_t num_rows, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(dweight, 0, sizeof(T) * num_rows * channels, stream));
  if (count * channels == 0) return;
  embedding_backward_kernel<<<grid_for(count * channels), kThreads, 0, stream>>>(dweight, dy, ids, count, channels);
  CUDA_CHECK_LAUNCH();
}

#define AG_INSTANTIATE(T)                                                                                        \
  template void embedding_forward<T>(T*, const T*, const std::int64_t*, std::int64_t, std::int64_t, cudaStream_t); \
  template void embedding_backward<T>(T*, const T*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, \
                                      cudaStream_t);
AG_INSTANTIATE(float)
AG_INSTANTIATE(double)
#undef AG_INSTANTIATE

}  // namespace attograd::cuda
