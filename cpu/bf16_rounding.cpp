#include "cpu/bf16_rounding.h"

namespace attograd::cpu {
namespace {

AG_SIMD_CLONES void round_to_bf16_arithmetic(std::uint16_t* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bfloat16_bits(x[i]);
}

#if AG_BF16_AVX512_KERNEL
AG_TARGET_AVX512_BF16 void round_to_bf16_instruction(std::uint16_t* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += 32) round_bf16_avx512(y + i, x + i, nullptr, n - i);
}
#endif

}  // namespace

bool rounds_bf16_by_instruction() {
  static const bool by_instruction =
      AG_BF16_AVX512_KERNEL && bf16_kernel_runs_here(Bf16Kernel::avx512_bf16) && !bf16_instructions_refused();
  return by_instruction;
}

void round_to_bf16(std::uint16_t* y, const float* x, std::int64_t n) {
#if AG_BF16_AVX512_KERNEL
  if (rounds_bf16_by_instruction()) return round_to_bf16_instruction(y, x, n);
#endif
  round_to_bf16_arithmetic(y, x, n);
}

AG_SIMD_CLONES void widen_bf16(float* y, const std::uint16_t* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bfloat16_to_float(x[i]);
}

}  // namespace attograd::cpu
