#include "cpu/matmul_bf16/isa.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>

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
  bool amd = false;          // CPUID's vendor string is "AuthenticAMD"
};

Features cpu_features() {
  Features f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);  // the vendor string is in ebx, edx, ecx, in that order
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    f.amd = std::strcmp(vendor, "AuthenticAMD") == 0;
  }
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

// What this build can run here (each hardware kernel built and its instructions
// present) and whose CPU it is.
const Bf16Hardware& runs() {
  static const Bf16Hardware r = [] {
    const Features f = cpu_features();
    return Bf16Hardware{AG_BF16_AMX_KERNEL && f.amx_bf16 && amx_permitted(),
                        AG_BF16_AVX512_KERNEL && f.avx512_bf16, f.amd};
  }();
  return r;
}
#else
const Bf16Hardware& runs() {
  static const Bf16Hardware r;
  return r;
}
#endif

Bf16Kernel widest() {
  return runs().amx ? Bf16Kernel::amx : runs().avx512_bf16 ? Bf16Kernel::avx512_bf16 : Bf16Kernel::widen;
}

}  // namespace

// AMX where it runs; else the AVX512_BF16 kernel on AMD's cores, the product
// widened to float32 on Intel's. How fast VDPBF16PS issues decides it:
// - On Intel's Xeons with AVX512_BF16 (AMX hidden or not permitted), about
//   once every 2 cycles: half float32's FMA rate, so the kernel takes longer
//   than the widened product on float32's FMAs (bench bf16_peak, fma_peak).
// - On AMD's cores (Zen 4 and later), at float32's FMA rate with twice the
//   multiply-adds an instruction: the kernel runs well ahead of the widened
//   product.
// Chosen from the CPU alone, not timed at start-up: the kernels sum in different
// orders, and a run's results must not depend on a moment's timing.
Bf16Kernel preferred_bf16_kernel(const Bf16Hardware& hardware) {
  if (hardware.amx) return Bf16Kernel::amx;
  if (hardware.avx512_bf16 && hardware.amd) return Bf16Kernel::avx512_bf16;
  return Bf16Kernel::widen;
}

const char* bf16_kernel_name(Bf16Kernel kernel) { return kNames[static_cast<int>(kernel)]; }

bool bf16_kernel_runs_here(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::amx: return runs().amx;
    case Bf16Kernel::avx512_bf16: return runs().avx512_bf16;
    default: return true;
  }
}

namespace {

// The kernel ATTOGRAD_BF16_ISA names, if it is set (read once; throws as bf16_kernel says).
std::optional<Bf16Kernel> asked_kernel() {
  static const std::optional<Bf16Kernel> asked = []() -> std::optional<Bf16Kernel> {
    const char* env = std::getenv("ATTOGRAD_BF16_ISA");
    if (env == nullptr || *env == '\0') return std::nullopt;
    for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) {
      if (std::strcmp(env, kNames[i]) != 0) continue;
      const auto chosen = static_cast<Bf16Kernel>(i);
      AG_CHECK(bf16_kernel_runs_here(chosen), "matmul", "ATTOGRAD_BF16_ISA={} is wider than this CPU's {}", env,
               bf16_kernel_name(widest()));
      return chosen;
    }
    fail("matmul", "ATTOGRAD_BF16_ISA={} is not one of amx, avx512_bf16, widen, amx_model, avx512_bf16_model", env);
  }();
  return asked;
}

}  // namespace

Bf16Kernel bf16_kernel() { return asked_kernel().value_or(preferred_bf16_kernel(runs())); }

bool bf16_instructions_refused() { return asked_kernel() == Bf16Kernel::widen; }

}  // namespace attograd::cpu
