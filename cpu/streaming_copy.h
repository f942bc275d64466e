#pragma once
// Copies written with non-temporal stores: for results nothing reads again
// soon (a large gradient, read next by another op), which then go to memory
// without first being read into the cache (a store's usual read for
// ownership) and without evicting the operands the writer is working on.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace attograd::cpu {

// dst[0, n) = src[0, n): by streaming stores where they can be used (SSE2,
// float or double, dst 16-byte aligned, n a whole number of 16 bytes), else
// std::copy; the same bits either way. Call streaming_fence() after the
// last one, before the data is handed to another thread.
template <typename T>
inline void streaming_copy(const T* __restrict src, std::int64_t n, T* __restrict dst) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    constexpr std::int64_t kPerStore = 16 / sizeof(T);
    if (reinterpret_cast<std::uintptr_t>(dst) % 16 == 0 && n % kPerStore == 0) {
      for (std::int64_t i = 0; i < n; i += kPerStore) {
        if constexpr (std::is_same_v<T, float>)
          _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
        else
          _mm_stream_pd(dst + i, _mm_loadu_pd(src + i));
      }
      return;
    }
  }
#endif
  std::copy(src, src + n, dst);
}

// Streaming stores are weakly ordered: this orders them before the thread's
// later stores (the flag that hands the data on, say).
inline void streaming_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace attograd::cpu
