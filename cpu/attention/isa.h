#pragma once
// Instruction sets: the vector width and the micro-kernel's register tile of
// each (AVX-512, AVX2, SSE2), and the one the kernels run on, chosen once at
// run time. Part of the one translation unit cpu/attention/attention.cpp.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "base/error.h"

namespace attograd::cpu::attention_detail {

// The vector width and the micro-kernel's register tile depend on the
// register file: AVX-512 has 32 registers of 64 bytes, AVX2 16 of 32, SSE2 16
// of 16. Function multi-versioning (AG_SIMD_CLONES) compiles one body per
// target, so it cannot change them; instead each is its own template
// instance, compiled under its target attribute and picked once at run time
// from the CPU's features.

// GCC's portable vectors of kBytes (one register of the target).
template <typename T, int kBytes>
struct Simd {
  typedef T Vec __attribute__((vector_size(kBytes)));
  static constexpr std::int64_t kLanes = kBytes / static_cast<int>(sizeof(T));
};

// Vectors of kBytes; the micro-kernel holds kRows x kVecs of them of C in
// registers. Where a row group's columns are whole multiples of kWideVecs
// vectors, it runs as kRows / kWideRows micro-tiles of kWideRows x kWideVecs
// instead (kWideRows = 0: never, and then no kWideVecs is declared, as clang
// warns of an unused one): with AVX-512, 4 x 4 vectors feed 16 multiply-adds
// from 4 broadcasts and 4 loads, 8 x 2 from 8 and 2, so at D = 64 (one
// 4-vector row of output) the wide tile is the faster; at D = 32 only 8 x 2
// fits the output rows.
// A tile no causal limit trims (all but the diagonal's) has no row groups to
// keep: its rows run kWholeRows at a time in micro-tiles of kWholeRows x
// kWideVecs (0: never). With AVX-512 6 x 4 vectors: 24 multiply-adds from 6
// broadcasts and 4 loads, against 16 from 4 and 4 for 4 x 4.
struct TileAvx512 {
  static constexpr int kBytes = 64, kRows = 8, kVecs = 2;  // 16 accumulators of 32 registers
  static constexpr int kWideRows = 4, kWideVecs = 4;       // also 16
  static constexpr int kWholeRows = 6;                     // 24
};
struct TileAvx2 {
  static constexpr int kBytes = 32, kRows = 4, kVecs = 3;  // 12 of 16
  static constexpr int kWideRows = 0, kWholeRows = 0;
};
struct TileBaseline {
  static constexpr int kBytes = 16, kRows = 4, kVecs = 2;  // 8 of 16
  static constexpr int kWideRows = 0, kWholeRows = 0;
};

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define AG_ATTENTION_ISA_DISPATCH 1
#define AG_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define AG_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define AG_ATTENTION_ISA_DISPATCH 0
#define AG_TARGET_AVX512
#define AG_TARGET_AVX2
#endif

enum class Isa { avx512, avx2, baseline };  // widest first
inline constexpr const char* kIsaNames[] = {"avx512", "avx2", "baseline"};

inline Isa supported_isa() {
#if AG_ATTENTION_ISA_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Isa::avx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::avx2;
#endif
  return Isa::baseline;
}

// The widest path the CPU runs, or a narrower one named by
// ATTOGRAD_ATTENTION_ISA: so the AVX2 and baseline paths can be tested and
// timed on an AVX-512 machine. A path wider than the CPU's is refused, not
// run into an illegal instruction.
inline Isa cpu_isa() {
  static const Isa isa = [] {
    const Isa widest = supported_isa();
    const char* env = std::getenv("ATTOGRAD_ATTENTION_ISA");
    if (env == nullptr || *env == '\0') return widest;
    for (int i = 0; i < static_cast<int>(std::size(kIsaNames)); ++i) {
      if (std::strcmp(env, kIsaNames[i]) != 0) continue;
      AG_CHECK(static_cast<int>(widest) <= i, "attention", "ATTOGRAD_ATTENTION_ISA={} is wider than this CPU's {}",
               env, kIsaNames[static_cast<int>(widest)]);
      return static_cast<Isa>(i);
    }
    fail("attention", "ATTOGRAD_ATTENTION_ISA={} is not one of avx512, avx2, baseline", env);
  }();
  return isa;
}

}  // namespace attograd::cpu::attention_detail
