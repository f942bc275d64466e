#pragma once
// What the CPU's fused attention offers besides its two device kernels
// (cpu::attention_forward and _backward, tensor/device_kernels.h).
#include <cstdint>

#include "tensor/attention_call.h"
#include "cpu/matmul_bf16/isa.h"

namespace attograd::cpu {

// The instruction set the fused attention kernels run on: "avx512", "avx2" or
// "baseline" (SSE2, or any CPU without the x86 dispatch); the widest this CPU
// has, or a narrower one named by ATTOGRAD_ATTENTION_ISA (see isa.h).
const char* attention_isa();

// The bfloat16 attention on the product's blocks (attention_bf16.cpp): whether
// it runs on `kernel` here (amx and avx512_bf16 where the CPU has them, the
// models anywhere; on widen kernels::attention_forward widens to float32), and
// its forward and backward on `kernel` (cpu::attention_forward and _backward
// run them on bf16_kernel()).
// The forward fills r.out (bfloat16, (B, H, Tq, D) over (B, Tq, H, D) memory)
// and r.lse (float32); no weights, no saved probabilities. The backward reads
// s.lse in float32 and recomputes the probabilities.
bool attention_bf16_runs_on(Bf16Kernel kernel);
void attention_forward_bf16(const AttentionCall& call, kernels::AttentionForwardResult& r, Bf16Kernel kernel);
void attention_backward_bf16(const AttentionCall& call, const AttentionSaved& s, const kernels::AttentionGrads& g,
                             Bf16Kernel kernel);

}  // namespace attograd::cpu
