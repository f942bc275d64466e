#include "cpu/blas_setup.h"

#include <cblas.h>

#include <cstdlib>

#include <fmt/format.h>

#include "base/error.h"

// OpenBLAS's DYNAMIC_ARCH entry points and its thread server's shutdown
// (exported by Debian's build, not declared in cblas.h): weak, so that a BLAS
// without them links too, and keeps its own kernels. Between quit and init
// OpenBLAS has no kernel table, and any thread of its own that allocates a
// buffer then (its server threads do as they start, at load time) picks the
// table again by itself: that raced with ours and crashed 1 start in 40. So
// its server threads, idle anyway (attograd calls OpenBLAS single-threaded),
// are joined first, and no BLAS call runs before prepare_blas is done.
extern "C" {
__attribute__((weak)) void gotoblas_dynamic_init(void);
__attribute__((weak)) void gotoblas_dynamic_quit(void);
__attribute__((weak)) int blas_thread_shutdown_(void);
}

namespace attograd {
namespace cpu {

VectorIsa this_cpu_vector_isa() {
  VectorIsa isa;
#if defined(__x86_64__)
  __builtin_cpu_init();
  isa.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  isa.avx512_bf16 = isa.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return isa;
}

const char* blas_kernels_instead_of(const std::string& picked, const VectorIsa& cpu) {
  // The cores OpenBLAS falls back to on a CPU its tables do not know: 32-bit
  // or SSE3-era kernels no x86-64 CPU with AVX2 should run.
  const bool generic = picked == "Prescott" || picked == "Katmai" || picked == "Core2" || picked == "Unknown";
  if (!generic) return nullptr;
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return nullptr;
}

VectorIsa instructions_of_blas_kernels(const std::string& core) {
  VectorIsa written_for;
  written_for.avx512_bf16 = core == "Cooperlake" || core == "SapphireRapids";
  written_for.avx512 = written_for.avx512_bf16 || core == "SkylakeX";
  written_for.avx2_fma = written_for.avx512 || core == "Haswell" || core == "Zen";
  return written_for;
}

const char* blas_kernels_need(const std::string& core, const VectorIsa& cpu) {
  const VectorIsa needed = instructions_of_blas_kernels(core);
  if (needed.avx512_bf16 && !cpu.avx512_bf16) return "AVX512_BF16";
  if (needed.avx512 && !cpu.avx512) return "AVX-512";
  if (needed.avx2_fma && !cpu.avx2_fma) return "AVX2 and FMA";
  return nullptr;
}

std::string blas_kernels_in_use() { return openblas_get_corename(); }

}  // namespace cpu

namespace {

std::string replaced_core;  // OpenBLAS's own pick, when prepare_blas replaced it

// OpenBLAS's kernels chosen again, as OPENBLAS_CORETYPE would at load time,
// where its own pick was a generic one and the user did not choose.
void choose_blas_kernels() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if ((forced && *forced) || !gotoblas_dynamic_init || !gotoblas_dynamic_quit || !blas_thread_shutdown_) return;
  const std::string picked = openblas_get_corename();
  const char* instead = cpu::blas_kernels_instead_of(picked, cpu::this_cpu_vector_isa());
  if (!instead) return;
  blas_thread_shutdown_();
  gotoblas_dynamic_quit();
  setenv("OPENBLAS_CORETYPE", instead, 1);  // read by gotoblas_dynamic_init, as at load time
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");  // child processes decide for themselves
  replaced_core = picked;
}

// OPENBLAS_CORETYPE=SkylakeX on an AVX2 CPU loads kernels that die of an
// illegal instruction at the first product: refused in one line instead.
void refuse_kernels_beyond_this_cpu() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (!forced || !*forced) return;
  const std::string core = openblas_get_corename();
  if (const char* missing = cpu::blas_kernels_need(core, cpu::this_cpu_vector_isa()))
    fail("matmul", "OPENBLAS_CORETYPE={} gives OpenBLAS its {} kernels, which need {}: this CPU lacks it (unset it)",
         forced, core, missing);
}

}  // namespace

void prepare_blas() {
  static const bool done = [] {
    refuse_kernels_beyond_this_cpu();
    choose_blas_kernels();
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

std::string blas_kernels_note() {
  prepare_blas();
  if (!replaced_core.empty())
    return fmt::format("note: OpenBLAS took this CPU for a {} (SSE3 kernels); attograd gave it its {} kernels "
                       "(OPENBLAS_CORETYPE chooses others)",
                       replaced_core, openblas_get_corename());
  const char* chosen = std::getenv("OPENBLAS_CORETYPE");
  if (!chosen || !*chosen) return "";  // OpenBLAS's own choice
  const std::string core = openblas_get_corename();
  if (!cpu::this_cpu_vector_isa().avx512 || cpu::instructions_of_blas_kernels(core).avx512) return "";
  return fmt::format("note: OPENBLAS_CORETYPE={} keeps OpenBLAS on its {} kernels on this AVX-512 CPU, where its own "
                     "choice multiplies about twice as fast (unset it unless that is meant)",
                     chosen, core);
}

}  // namespace attograd
