#pragma once
// Warpgroup tensor-core products of sm_90a (wgmma.mma_async): the 128 threads
// of four consecutive warps make one 64 x N x 16 product together, A and B
// read by the tensor cores straight from shared memory through descriptors,
// the float32 sums left in the threads' registers. Asynchronous: a product
// is issued, its group committed, and its accumulators are the thread's again
// only after wgmma.wait_group has seen the group finish; its operands' tiles
// may not be overwritten before then either.
//
// The tiles this header describes (gemm_tiles::WgmmaTile lays them out), 64
// bfloat16 of K each, in the hardware's 128-byte swizzle (an address's bits
// 4-6 XORed with its bits 7-9, so a tile starts on a 1024-byte boundary of the
// shared state space):
// - K-major (instruction's transpose flag 0): rows of X (A, or B^T) of 64 k,
//   128-byte lines, line l's 16-byte chunk c at chunk l * 8 + (c ^ l % 8),
//   eight lines 1024 bytes apart (the descriptor's stride byte offset; its
//   leading byte offset unused). Step s of 16 along K starts 32 s bytes in.
// - MN-major (flag 1; A transposed, B as it is): blocks of 64 rows of X, a
//   block the 64 k's lines of 128 bytes one after the other (line k's chunk c
//   at k * 8 + (c ^ k % 8)), blocks 8 KiB apart (the leading byte offset), eight
//   lines of k 1024 bytes apart (the stride byte offset). Step s starts 16
//   lines, 2048 s bytes, in.
//
// The accumulators of a 64 x N product, as the PTX ISA lays them out (CuTe's
// CLayout_64xN): thread t of the warpgroup, warp w = t / 32, g = t % 32 / 4,
// q = t % 4, holds d[4 j + v] = D[16 w + g + 8 (v / 2)][8 j + 2 q + v % 2]:
// mma.sync's m16n8 C fragment for each 8 columns j, warp w's 16 rows.
//
// Outside sm_90a code (the other architectures of a build, which never launch
// these kernels: cuda::wgmma_kernels_run) the fences and waits are empty and a
// product traps, so that every architecture compiles.
//
// The emulated build (tests/cuda_emulator) makes each thread's own sums from
// shared memory, decoding the descriptor as the hardware does; a
// descriptor it does not model (another swizzle, a step across a line) stops
// the process. The GPU is the judge of this reading of the ISA:
// tests/cuda_mma_probe.cu's wgmma probe, a [cuda] test, compares it with the CPU.
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mma.cuh"

namespace attograd::cuda::wgmma {

constexpr int kWarpgroup = 128;       // threads that make one product
constexpr int kLineBytes = 128;       // a tile's line: 64 bfloat16 of K
constexpr int kSwizzleBytes = 1024;   // eight lines: the swizzle's period, a tile's alignment
constexpr int kStepBytes = 32;        // 16 bfloat16 of K: one product's K

// The shared state space's address of p (in dynamic shared memory).
__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  return ::emu::shared_address(p);
#else
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// The first byte at or after p (in dynamic shared memory) on a 1024-byte
// boundary, where a kernel's swizzled tiles start: the swizzle is of addresses.
__device__ __forceinline__ unsigned char* swizzle_aligned(unsigned char* p) {
  return p + (kSwizzleBytes - shared_address(p) % kSwizzleBytes) % kSwizzleBytes;
}

// MN-major: one block of 64 rows, its 64 lines of k (the descriptor's leading byte offset).
constexpr int kMnBlockBytes = gemm_tiles::WgmmaTile<64, false>::kBlockBytes;

__device__ __forceinline__ std::uint64_t descriptor(std::uint32_t start, std::uint32_t leading_bytes) {
  return static_cast<std::uint64_t>((start >> 4) & 0x3fffu)                 // bits 0-13: start address / 16
         | static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3fffu) << 16  // bits 16-29: leading byte offset / 16
         | static_cast<std::uint64_t>(kSwizzleBytes >> 4) << 32             // bits 32-45: stride byte offset / 16
         | static_cast<std::uint64_t>(1) << 62;                             // bits 62-63: 1, the 128-byte swizzle
}

// The descriptor of a K-major operand whose rows begin at the tile's first
// line (a 1024-byte boundary) and whose K begins `step` products of 16 in.
__device__ __forceinline__ std::uint64_t k_major_descriptor(std::uint32_t tile_address, int step) {
  return descriptor(tile_address + static_cast<std::uint32_t>(step * kStepBytes), 16);  // 16: "unused, 1"
}

// The same for an MN-major operand whose rows begin at a block's first line.
__device__ __forceinline__ std::uint64_t mn_major_descriptor(std::uint32_t tile_address, int step) {
  return descriptor(tile_address + static_cast<std::uint32_t>(step * 16 * kLineBytes), kMnBlockBytes);
}

template <bool KMajor>
__device__ __forceinline__ std::uint64_t tile_descriptor(std::uint32_t tile_address, int step) {
  return KMajor ? k_major_descriptor(tile_address, step) : mn_major_descriptor(tile_address, step);
}

#if defined(ATTOGRAD_CUDA_EMULATION)
// Element (row, k) of the operand a descriptor names (bfloat16 bits), k < 16,
// K-major or MN-major, through the hardware's 128-byte swizzle of the address.
inline std::uint16_t emulated_operand(std::uint64_t descriptor, bool mn_major, int row, int k) {
  const std::uint32_t start = static_cast<std::uint32_t>(descriptor & 0x3fffu) << 4;
  const std::uint32_t leading = static_cast<std::uint32_t>(descriptor >> 16 & 0x3fffu) << 4;
  const std::uint32_t stride = static_cast<std::uint32_t>(descriptor >> 32 & 0x3fffu) << 4;
  if (descriptor >> 62 != 1 || (descriptor >> 49 & 7u) != 0)
    ::emu::device_fault("wgmma: a descriptor other than the 128-byte swizzle with base offset 0");
  std::uint32_t logical = 0;
  if (mn_major) {
    if (start % kSwizzleBytes != 0) ::emu::device_fault("wgmma: an MN-major operand off a 1024-byte boundary");
    logical = start + static_cast<std::uint32_t>(row / 64) * leading + static_cast<std::uint32_t>(k / 8) * stride +
              static_cast<std::uint32_t>(k % 8) * kLineBytes + static_cast<std::uint32_t>(2 * (row % 64));
  } else {
    if (start % kLineBytes + kStepBytes > kLineBytes) ::emu::device_fault("wgmma: a step of K across a 128-byte line");
    logical = start + static_cast<std::uint32_t>(row / 8) * stride + static_cast<std::uint32_t>(row % 8) * kLineBytes +
              static_cast<std::uint32_t>(2 * k);
  }
  const std::uint32_t physical = logical ^ ((logical >> 7 & 7u) << 4);
  std::uint16_t bits;
  std::memcpy(&bits, ::emu::shared_pointer(physical), sizeof bits);
  return bits;
}

inline double emulated_bf16(std::uint16_t bits) { return bits_float(static_cast<std::uint32_t>(bits) << 16); }

// One thread's part of a 64 x N x 16 product, made when the emulator says.
template <int N>
struct EmulatedProduct {
  float* d;
  std::uint64_t a, b;
  int thread;  // in the warpgroup
  bool accumulate, a_mn_major, b_mn_major;
  static void make(const void* args) {
    EmulatedProduct p;
    std::memcpy(&p, args, sizeof p);
    const int w = p.thread / 32, g = p.thread % 32 / 4, q = p.thread % 4;
    double a[2][16], b[N / 4][16];  // this thread's two rows of A, and its columns of B (2 of each 8)
    for (int k = 0; k < 16; ++k) {
      for (int h = 0; h < 2; ++h) a[h][k] = emulated_bf16(emulated_operand(p.a, p.a_mn_major, 16 * w + g + 8 * h, k));
      for (int c = 0; c < N / 4; ++c)
        b[c][k] = emulated_bf16(emulated_operand(p.b, p.b_mn_major, 8 * (c / 2) + 2 * q + c % 2, k));
    }
    for (int j = 0; j < N / 8; ++j)
      for (int v = 0; v < 4; ++v) {
        float& out = p.d[4 * j + v];
        double sum = p.accumulate ? out : 0.0;
        for (int k = 0; k < 16; ++k) sum += a[v / 2][k] * b[2 * j + v % 2][k];
        out = rounded_toward_zero(sum);  // as mma.sync's (cuda/mma.cuh says why)
      }
  }
};
#endif

// Orders this thread's register and shared memory writes before the products issued after it.
__device__ __forceinline__ void fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// Makes shared memory written by ordinary stores and cp.async visible to the
// tensor cores' reads (the async proxy): after the wait for a tile's copies,
// before the barrier that lets the products read it.
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The products issued since the last commit become one group.
__device__ __forceinline__ void commit() {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::async_product_commit();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most `Pending` of the newest committed groups are unfinished.
template <int Pending>
__device__ __forceinline__ void wait() {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::async_product_wait(Pending);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}

// d = A B (+ d where `accumulate`): a 64 x 256 x 16 product on bfloat16, A
// and B^T in tiles named by their descriptors, each K-major or (AMnMajor,
// BMnMajor) MN-major. Every thread of the warpgroup calls it together, with
// the same descriptors; d is the thread's 128 accumulators (above), indexed by
// constants only, so that they stay in registers.
template <bool AMnMajor, bool BMnMajor>
__device__ __forceinline__ void mma_bf16_n256(float (&d)[128], std::uint64_t a, std::uint64_t b, bool accumulate) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  const EmulatedProduct<256> p{d, a, b, static_cast<int>(threadIdx.x % kWarpgroup), accumulate, AMnMajor, BMnMajor};
  ::emu::async_product(&EmulatedProduct<256>::make, &p, sizeof p);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"
      " %128, %129, p, 1, 1, %131, %132;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(AMnMajor)),
        "n"(static_cast<int>(BMnMajor)));
#else
  __trap();  // wgmma exists only in sm_90a code: the host launches these kernels only where it was built
#endif
}

}  // namespace attograd::cuda::wgmma
