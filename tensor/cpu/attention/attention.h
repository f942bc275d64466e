#pragma once
// What the CPU's fused attention offers besides its two device kernels
// (cpu::attention_forward and _backward, tensor/device_kernels.h).
#include <cstdint>

namespace attograd::cpu {

// The instruction set the fused attention kernels run on: "avx512", "avx2" or
// "baseline" (SSE2, or any CPU without the x86 dispatch); the widest this CPU
// has, or a narrower one named by ATTOGRAD_ATTENTION_ISA (see isa.h).
const char* attention_isa();

// The bytes the forward keeps of its probability tiles within `budget`
// (AttentionKernelOptions::probs_budget), for `heads` (B * H) heads of Tq
// queries and Tk keys of element_bytes each: the tiles of as many whole heads
// as fit.
std::int64_t attention_probs_bytes(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal,
                                   std::int64_t element_bytes, std::int64_t budget);

}  // namespace attograd::cpu
