#include "tensor/cpu/matmul_bf16/isa.h"

#include <cstdlib>
#include <cstring>
#include <iterator>

#include "base/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attograd::cpu {
namespace {

constexpr const char* kNames[] = {"amx", "avx512_bf16", "widen", "amx_model", "avx512_bf16_model"};

#if defined(__x86_64__)
std::uint64_t xcr0() {
  std::uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return static_cast<std::uint64_t>(hi) << 32 | lo;
}

struct Features {
  bool avx512_bf16 = false;  // and the AVX-512 state saved by the OS
  bool amx_bf16 = false;     // and the tile state saved by the OS
};

Features cpu_features() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return f;  // OSXSAVE: xgetbv is there
  const std::uint64_t xcr = xcr0();
  const bool zmm_state = (xcr & 0xe6) == 0xe6;            // SSE, AVX, opmask, ZMM upper halves, ZMM16-31
  const bool tile_state = (xcr & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30);
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  unsigned a1 = 0, b1, c1, d1;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const bool avx512bf16 = a1 & (1u << 5);
  f.avx512_bf16 = zmm_state && avx512f && avx512bw && avx512bf16;
  f.amx_bf16 = zmm_state && tile_state && amx_tile && amx_bf16 && f.avx512_bf16;
  return f;
}

// Linux hands out the AMX tile data state (8 KiB more per thread to save) only
// to a process that asks: once, for all its threads.
bool amx_permitted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// What this build can run here: each hardware kernel built and its instructions present.
struct Runs {
  bool amx = false, avx512_bf16 = false;
};
const Runs& runs() {
  static const Runs r = [] {
    const Features f = cpu_features();
    return Runs{AG_BF16_AMX_KERNEL && f.amx_bf16 && amx_permitted(), AG_BF16_AVX512_KERNEL && f.avx512_bf16};
  }();
  return r;
}
#else
struct Runs {
  bool amx = false, avx512_bf16 = false;
};
const Runs& runs() {
  static const Runs r;
  return r;
}
#endif

Bf16Kernel widest() {
  return runs().amx ? Bf16Kernel::amx : runs().avx512_bf16 ? Bf16Kernel::avx512_bf16 : Bf16Kernel::widen;
}

// The default: AMX where it runs, else the product widened to float32. The
// AVX512_BF16 kernel runs only when ATTOGRAD_BF16_ISA names it: on the Sapphire
// and Emerald Rapids class Xeons it was measured on, VDPBF16PS issues about once
// every 2 cycles, so its peak is half float32's FMA rate (bf16_peak/avx512_bf16
// 141 GFLOP/s against fma_peak/avx512's 290, 2 threads), and the kernel, at 70%
// of it (matmul_bf16/2048 98 GFLOP/s), takes twice the widened product's time
// (190, OpenBLAS's float32). Not measured on AMD Zen 4/5.
Bf16Kernel preferred() { return runs().amx ? Bf16Kernel::amx : Bf16Kernel::widen; }

}  // namespace

const char* bf16_kernel_name(Bf16Kernel kernel) { return kNames[static_cast<int>(kernel)]; }

bool bf16_kernel_runs_here(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::amx: return runs().amx;
    case Bf16Kernel::avx512_bf16: return runs().avx512_bf16;
    default: return true;
  }
}

Bf16Kernel bf16_kernel() {
  static const Bf16Kernel kernel = [] {
    const char* env = std::getenv("ATTOGRAD_BF16_ISA");
    if (env == nullptr || *env == '\0') return preferred();
    for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) {
      if (std::strcmp(env, kNames[i]) != 0) continue;
      const auto chosen = static_cast<Bf16Kernel>(i);
      AG_CHECK(bf16_kernel_runs_here(chosen), "matmul", "ATTOGRAD_BF16_ISA={} is wider than this CPU's {}", env,
               bf16_kernel_name(widest()));
      return chosen;
    }
    fail("matmul", "ATTOGRAD_BF16_ISA={} is not one of amx, avx512_bf16, widen, amx_model, avx512_bf16_model", env);
  }();
  return kernel;
}

}  // namespace attograd::cpu
