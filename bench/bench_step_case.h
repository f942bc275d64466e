#pragma once
// One training step of a GPT (nn/gpt.h, GPT-2's init) on a batch of random
// tokens as a benchmark case, on the CPU (bench_gpt.cpp) or the GPU
// (bench_cuda.cpp): in the trainer's order (train/cli/trainer.cpp), forward +
// loss, backward, [gradient clipping,] AdamW update, zero_grad, checked before
// it is timed. bench_gpt.cpp's header says what each case trains and how its
// FLOPs and bytes are counted.
#include <cstdint>

#include "bench_common.h"
#include "nn/gpt.h"
#include "tensor/device.h"
#include "train/optim/optimizer.h"

namespace attograd::bench {

// What a case trains and how.
struct StepCase {
  nn::GPTConfig config;
  std::int64_t batch;
  train::optim::AdamWOptions adamw;
  double clip_norm;  // max global gradient norm; 0: no clipping (not even the norm is computed)
  DType dtype = DType::f32;  // bfloat16: the forward under autocast
  // How far from ln(V) the loss at GPT-2's init may be: deeper and wider models
  // start further off (12 layers of 768: 0.15-0.2).
  double initial_loss_tolerance = 0.1;
};

// The design notes' toy GPT (nn::GPTConfig's defaults), batch 32, AdamW lr 1e-3, no clipping.
StepCase gpt_step();
// The design notes' real sizes, vocab 65 (characters) unless given: AdamW lr 1e-5, weight decay 0.1, clipping at 1.0.
StepCase real_size(std::int64_t layers, std::int64_t width, std::int64_t heads, std::int64_t block,
                   std::int64_t batch, std::int64_t vocab = 65);
StepCase in_bf16(StepCase c);

// The case's model on `device`, checked (the loss at init near ln(V), and
// four AdamW steps on one batch lowering it), then its steps timed: by the
// wall clock on the CPU, by CUDA events around each step on the GPU (manual
// time: register the GPU's cases with UseManualTime).
void step_case(benchmark::State& state, const StepCase& c, Device device = Device::cpu());

}  // namespace attograd::bench
