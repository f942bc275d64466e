#pragma once
// The CUDA runtime as the rest of attograd sees it: raw device memory, copies
// and the device count. Built from runtime.cu when CUDA is enabled, and from
// no_cuda.cpp otherwise, where every entry point throws
// "[op] has no CUDA implementation in this build" (device_count() returns 0).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace attograd::cuda {

bool built_with_cuda();
int device_count();  // 0 when built without CUDA or when no GPU is present
// Why device_count() is 0, in the CUDA runtime's words ("cudaErrorNoDevice: no
// CUDA-capable device is detected", an old driver, ...); "" when it is not.
std::string no_device_reason();
// The GPU's PCI address ("0000:65:00.0"): the same GPU gives the same one in
// every process, whatever CUDA_VISIBLE_DEVICES numbers it.
std::string pci_bus_id(int device);
// The GPU's streaming multiprocessors, which the products'
// tile sizes are chosen to fill.
int multiprocessor_count(int device);

// Whether the sm_90a kernels (wgmma.mma_async, cuda/wgmma.cuh) run on `device`:
// built for sm_90a (CMAKE_CUDA_ARCHITECTURES names 90a) and an sm_90 GPU (H100,
// H200), or the emulator. The bfloat16 product takes them only where chosen
// too, off by default until a GPU has timed and checked them (docs/cuda.md):
// ATTOGRAD_CUDA_WGMMA=1 (or tma) their tiles copied by TMA where the operands
// allow it and by cp.async elsewhere, =cp.async by cp.async alone; or set_wgmma_products.
enum class WgmmaProducts { off, tma, cp_async };
// Products the TMA-fed sm_90a kernel has launched in this process: how a test
// knows that its case took that kernel, not the cp.async one.
std::int64_t wgmma_tma_launches();
bool wgmma_kernels_run(int device);
WgmmaProducts wgmma_products();
inline bool wgmma_products_chosen() { return wgmma_products() != WgmmaProducts::off; }
void set_wgmma_products(WgmmaProducts chosen);
class ScopedWgmmaProducts {  // for a test or benchmark: this choice, then as before
 public:
  explicit ScopedWgmmaProducts(WgmmaProducts chosen) { set_wgmma_products(chosen); }
  ~ScopedWgmmaProducts() { set_wgmma_products(before_); }
  ScopedWgmmaProducts(const ScopedWgmmaProducts&) = delete;
  ScopedWgmmaProducts& operator=(const ScopedWgmmaProducts&) = delete;

 private:
  WgmmaProducts before_ = wgmma_products();  // read before the constructor's body sets the new one
};

// Device memory comes from a caching allocator (cuda/allocator.cu): freed blocks
// wait in free lists keyed by their rounded size, so a training step that asks
// for the same sizes every iteration calls cudaMalloc only during its first one.
void* device_malloc(std::size_t nbytes, int device);
void device_free(void* ptr, std::size_t nbytes, int device);

struct MemoryStats {
  std::size_t allocated = 0;      // bytes in blocks handed out and not yet freed
  std::size_t cached = 0;         // bytes in free blocks kept for reuse
  std::size_t peak = 0;           // the most `allocated` has been
  std::uint64_t cuda_mallocs = 0; // requests that went to cudaMalloc
  std::uint64_t reuses = 0;       // requests served from the free lists
};
MemoryStats memory_stats(int device);  // all zero without CUDA
void release_cached(int device);       // cudaFree every cached block of `device`

void copy_host_to_device(void* dst, const void* src, std::size_t nbytes, int device);
void copy_device_to_host(void* dst, const void* src, std::size_t nbytes, int device);
void copy_device_to_device(void* dst, const void* src, std::size_t nbytes, int device);
void synchronize(int device);

// The fused attention kernels take heads of up to this many values
// (kernels::attention_forward refuses longer ones on a CUDA device).
constexpr std::int64_t kAttentionMaxHeadDim = 128;

// Two ops have two sets of kernels on a GPU: fused attention (cuda/attention.cu)
// and matmul (cuda/matmul.cu). `simt` is float32 FMAs on the CUDA cores;
// `tensor_core` is mma.sync on TF32 operands with each float32 split in two
// (3xTF32: float32 accuracy, cuda/mma.cuh; sm_80 and newer). The environment's
// ATTOGRAD_CUDA_ATTENTION and ATTOGRAD_CUDA_MATMUL (simt|tensor-core) choose at
// an op's first call, simt when unset; set_kernel_set changes it for the whole
// process (tests and benchmarks run both). Not thread-safe against the op running.
enum class KernelSet { simt, tensor_core };
enum class KernelOp { attention, matmul };
KernelSet kernel_set(KernelOp op);
void set_kernel_set(KernelOp op, KernelSet kernels);
inline const char* kernel_set_name(KernelSet kernels) {  // as the environment names them
  return kernels == KernelSet::tensor_core ? "tensor-core" : "simt";
}
inline const char* kernel_op_name(KernelOp op) {  // as errors name it
  return op == KernelOp::attention ? "attention" : "matmul";
}

// One set of kernels for an op for the guard's lifetime, the previous choice restored after.
class ScopedKernelSet {
 public:
  ScopedKernelSet(KernelOp op, KernelSet kernels) : op_(op) { set_kernel_set(op, kernels); }
  ~ScopedKernelSet() { set_kernel_set(op_, before_); }
  ScopedKernelSet(const ScopedKernelSet&) = delete;
  ScopedKernelSet& operator=(const ScopedKernelSet&) = delete;

 private:
  KernelOp op_;
  KernelSet before_ = kernel_set(op_);  // read before the constructor's body sets the new one
};

// Milliseconds the GPU spends on the work `fn` queues on `device`: CUDA events
// recorded on the device's stream before and after fn, then waited for. For
// benchmarks (Google Benchmark's UseManualTime).
double time_gpu_ms(int device, const std::function<void()>& fn);

}  // namespace attograd::cuda
