#pragma once
// Which bfloat16 matrix-product kernel this CPU runs:
//   amx          AMX tiles, TDPBF16PS: 16 x 16 x 32 multiply-adds an instruction
//                (Sapphire Rapids and later), after Linux has granted the process
//                the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM))
//   avx512_bf16  VDPBF16PS on 512-bit vectors: 16 x 2 multiply-adds an instruction
//                (Cooper Lake, Sapphire Rapids, AMD Zen 4 and later)
//   widen        anything else: float32's product (matmul_f32/sgemm.h), the
//                operands widened exactly as it packs them (correct, not
//                faster than float32)
// AMX where the CPU has it, else avx512_bf16 on AMD's cores and widen on
// Intel's (where VDPBF16PS runs at half rate: isa.cpp), or the one
// ATTOGRAD_BF16_ISA names (so each can be tested and timed on an AMX machine;
// `widen` so named also stops the roundings' use of bfloat16 instructions);
// one wider than the CPU is refused.
// The *_model kernels run the first two's instructions as scalar C++ on the
// same packed buffers (tests: a packing mistake then fails on every machine).
#include <cstdint>

// Which hardware kernels this build has. The AMX kernel is inline assembly
// (any x86-64 compiler); the AVX512_BF16 one hands 512-bit vectors to inline
// assembly inside a function compiled for AVX-512 by its target attribute,
// which only GCC accepts (as with the fused attention's ISA dispatch, clang,
// the sanitizer build's compiler, gets the scalar models and widen instead).
#if defined(__x86_64__)
#define AG_BF16_AMX_KERNEL 1
#else
#define AG_BF16_AMX_KERNEL 0
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AG_BF16_AVX512_KERNEL 1
#else
#define AG_BF16_AVX512_KERNEL 0
#endif

// What the hardware kernels' entry points, and the helpers always inlined into
// them (bf16_rounding.h's), are compiled for: every CPU they run on has
// AVX512_BF16 (AMX is only taken with it). Beside the kernel itself, the
// rounding into C and the packing run there 512 bits wide: compiled for the
// build's baseline (SSE2) they took a large share of a product.
#if AG_BF16_AVX512_KERNEL
#define AG_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define AG_TARGET_AVX512_BF16
#endif

namespace attograd::cpu {

enum class Bf16Kernel { amx, avx512_bf16, widen, amx_model, avx512_bf16_model };

// "amx", "avx512_bf16", "widen", "amx_model", "avx512_bf16_model".
const char* bf16_kernel_name(Bf16Kernel kernel);

// The kernel bfloat16 products run on here (read once; a bad
// ATTOGRAD_BF16_ISA throws "[matmul] ATTOGRAD_BF16_ISA=... ").
Bf16Kernel bf16_kernel();

// Whether ATTOGRAD_BF16_ISA=widen asks to run as a CPU without bfloat16
// instructions would: then the roundings to bfloat16 (bf16_rounding.h) leave
// AVX512_BF16's VCVTNE2PS2BF16 unused too, so that such a CPU's step can be
// timed, and the integer rounding tested, on one that has them. (widen taken
// by default, on Intel's AVX512_BF16 cores without AMX, still rounds by it.)
bool bf16_instructions_refused();

// Whether this CPU (and OS) can run `kernel`: the models and widen always can.
bool bf16_kernel_runs_here(Bf16Kernel kernel);

// What the choice is made from: which hardware kernels run here, and the vendor.
struct Bf16Hardware {
  bool amx = false, avx512_bf16 = false;
  bool amd = false;
};
// The kernel bf16_kernel() takes when ATTOGRAD_BF16_ISA is unset.
Bf16Kernel preferred_bf16_kernel(const Bf16Hardware& hardware);

}  // namespace attograd::cpu
