#pragma once
// OpenBLAS, set up once before its first call: single-threaded (the pool's
// threads each call it on their own slice), and on the AVX-512 or AVX2
// kernels of this CPU where OpenBLAS's own detection does not know the CPU and
// falls back to its generic SSE3 ones (Debian 12's 0.3.21 on CPUs newer than
// it, Intel's family 6 model 207 among them), which run every product at a
// fraction of the speed.
#include <string>

namespace attograd {

// Called before any BLAS call (cheap after the first). Throws, naming
// OPENBLAS_CORETYPE, where it chose kernels this CPU cannot run.
void prepare_blas();

namespace cpu {

// What prepare_blas decides from the kernels OpenBLAS picked by itself and
// this CPU's vector instructions: the kernel family to give it instead
// ("Cooperlake", "SkylakeX", "Haswell"), or nullptr to keep its pick.
struct VectorIsa {
  bool avx2_fma = false, avx512 = false, avx512_bf16 = false;
};
VectorIsa this_cpu_vector_isa();
// The kernel family OpenBLAS runs now (its openblas_get_corename()).
std::string blas_kernels_in_use();
const char* blas_kernels_instead_of(const std::string& picked, const VectorIsa& cpu);
// The vector instructions OpenBLAS's kernel family `core` is written for
// (SkylakeX: AVX-512; Haswell and Zen: AVX2 and FMA; none for a generic one).
VectorIsa instructions_of_blas_kernels(const std::string& core);
// The instructions OpenBLAS's kernel family `core` needs and this CPU lacks
// ("AVX-512" for SkylakeX on an AVX2 CPU), or nullptr where they run here.
const char* blas_kernels_need(const std::string& core, const VectorIsa& cpu);

}  // namespace cpu

// A line for the user about OpenBLAS's kernels, or empty: when prepare_blas
// replaced OpenBLAS's own pick, or when OPENBLAS_CORETYPE keeps it on kernels
// narrower than this CPU runs (its AVX2 ones on an AVX-512 CPU: half the
// speed of every product).
std::string blas_kernels_note();

}  // namespace attograd
