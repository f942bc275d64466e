// The GPU kernels of a build without CUDA, one stub for each kernel of
// tensor/device_kernels.h: no CUDA tensor can exist here (cuda/no_cuda.cpp
// refuses to allocate one), so none of these is reachable through
// tensor/dispatch*.cpp; each still throws a clear error rather than
// pretending. Linked instead of cuda/bridge/*.cpp when ATTOGRAD_CUDA is off.
#include "tensor/device_kernels.h"

namespace attograd::gpu {
namespace {
[[noreturn]] void no_gpu(const char* op) { fail(op, "has no CUDA implementation in this build (ATTOGRAD_CUDA=OFF)"); }
}  // namespace

// A stub names its parameters (they come from the list) and uses none of them.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#define AG_NO_GPU_KERNEL(name, result, parameters) \
  result name parameters { no_gpu(#name); }
AG_DEVICE_KERNELS(AG_NO_GPU_KERNEL)
#undef AG_NO_GPU_KERNEL

}  // namespace attograd::gpu
