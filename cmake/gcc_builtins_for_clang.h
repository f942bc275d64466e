#pragma once
// Force-included (-include) into every C++ file of a clang build, which only the
// asan-ubsan preset makes (libFuzzer needs clang): GCC's vector builtins that
// clang lacks, written portably, so code tuned for GCC still compiles there.
// Speed does not matter in that build; correctness does, and is tested there.
#if defined(__clang__) && defined(__cplusplus)
// Vectors returned from the always-inlined helper below cross no real call, so
// clang's note that their ABI depends on -mavx512f is noise here.
#pragma clang diagnostic ignored "-Wpsabi"
namespace attograd_gcc_builtins {

// GCC's two-operand __builtin_shuffle(a, b, mask): lane k of the result is lane
// mask[k] (taken modulo 2n) of the concatenation of a and b.
template <typename V, typename M>
__attribute__((always_inline)) inline V shuffle(const V& a, const V& b, const M& mask) {
  constexpr int n = static_cast<int>(sizeof(V) / sizeof(a[0]));
  static_assert((n & (n - 1)) == 0, "__builtin_shuffle: lanes must be a power of two");
  V out = a;
  for (int k = 0; k < n; ++k) {
    const int m = static_cast<int>(mask[k]) & (2 * n - 1);
    out[k] = m < n ? a[m] : b[m - n];
  }
  return out;
}

}  // namespace attograd_gcc_builtins
// Variadic: a mask such as Interleave<T, B, false>::mask holds commas the preprocessor would split at.
#define __builtin_shuffle(...) ::attograd_gcc_builtins::shuffle(__VA_ARGS__)
#endif
