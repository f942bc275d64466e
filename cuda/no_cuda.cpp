// The stub linked when attograd is built without CUDA: the device count is 0
// and every device entry point throws a clear error instead of crashing.
#include "base/error.h"
#include "cuda/runtime.h"

namespace attograd::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) { fail(op, "has no CUDA implementation in this build (ATTOGRAD_CUDA=OFF)"); }
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string no_device_reason() { return "this build has no CUDA backend (ATTOGRAD_CUDA=OFF)"; }
std::string pci_bus_id(int) { no_cuda("pci_bus_id"); }
int multiprocessor_count(int) { no_cuda("multiprocessor_count"); }
void* device_malloc(std::size_t, int) { no_cuda("cuda malloc"); }
void device_free(void*, std::size_t, int) {}
void copy_host_to_device(void*, const void*, std::size_t, int) { no_cuda("to(cuda)"); }
void copy_device_to_host(void*, const void*, std::size_t, int) { no_cuda("to(cpu)"); }
void copy_device_to_device(void*, const void*, std::size_t, int) { no_cuda("cuda copy"); }
void synchronize(int) {}
double time_gpu_ms(int, const std::function<void()>&) { no_cuda("cuda timer"); }
MemoryStats memory_stats(int) { return {}; }
void release_cached(int) {}
KernelSet kernel_set(KernelOp) { return KernelSet::simt; }
void set_kernel_set(KernelOp, KernelSet) {}
bool wgmma_kernels_run(int) { return false; }
WgmmaProducts wgmma_products() { return WgmmaProducts::off; }
std::int64_t wgmma_tma_launches() { return 0; }
void set_wgmma_products(WgmmaProducts) {}

}  // namespace attograd::cuda
