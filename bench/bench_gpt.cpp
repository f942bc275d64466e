// Training steps of a GPT (nn/gpt.h, GPT-2's init) on a batch of random
// tokens, in the trainer's order (train/cli/trainer.cpp): forward + loss, backward,
// [gradient clipping,] AdamW update, zero_grad. The AdamW decay applies to the
// Linear weights only (train::optim::AdamW). Cases:
//   gpt_step     the design notes' toy GPT (nn::GPTConfig's defaults: vocab 65,
//                4 layers, 4 heads, 128 wide, block 128, tied embeddings, no
//                dropout), batch 32 x 128, AdamW lr 1e-3, weight decay 0.01,
//                no clipping;
//   charlm_step  the character LM of `attograd train --data FILE --layers 4
//                --width 128 --heads 4 --block 64 --batch 64`, built as the CLI
//                builds it: the --data preset (train/options.cpp preset_for)
//                under those flags, gpt_config() with vocab 65 (tiny Shakespeare's
//                characters). So: dropout 0.1 (embeddings, attention weights,
//                residual branches; the model in training mode), batch 64 x 64,
//                AdamW lr 3e-3, betas (0.9, 0.99), weight decay 0.1, global-norm
//                clipping at 1.0 (clip_grad_norm) between backward and the update.
//                The schedule's warm-up is left out: the learning rate does not
//                change a step's cost.
//   gpt2_124m_step  GPT-2 124M as nanoGPT trains it: gpt2_step with the vocabulary
//                50304 (GPT-2's 50257 padded), its head and loss the fused
//                classifier's;
//   shakespeare_step, gpt2_step  the real sizes of the design notes, vocab 65:
//                nanoGPT's shakespeare_char (6 layers, 6 heads, 384 wide, block
//                256, batch 16) and GPT-2 small (12, 12, 768, block 1024,
//                batch 2), AdamW lr 1e-5 (the check that 4 steps on one batch
//                lower its loss fails at 1e-4 for GPT-2 small, in PyTorch too), weight
//                decay 0.1, clipping at 1.0.
// Each case also as <case>/bf16: the forward under autocast
// (autograd/autocast.h), as `attograd train --dtype bfloat16` runs it. The
// step itself, its checks and counters: bench_step_case.h (bench_cuda.cpp
// runs the same on the GPU).
// Counters: "tokens" (tokens/s, B*T per step), and "flops", "bytes" as below.
//
// FLOPs per step (matmul FLOPs only, forward x 3 for forward + backward;
// layer norms, GELU, softmax, dropout, embedding, clipping and the optimizer are
// not counted):
//   per layer forward: the qkv, out, fc and proj matmuls, 2 BT C (3C + C + 4C + 4C)
//   = 24 BT C^2, plus causal attention 2 B C T (T + 1) (bench_attention.cpp);
//   the head: 2 BT C V.  Step = 3 (n_layer (24 BT C^2 + 2 B C T (T + 1)) + 2 BT C V),
//   with gpt_step's B = 32, T = 128 and charlm_step's B = 64, T = 64 (C = 128, V = 65).
// Bytes per step: the compulsory parameter traffic, 40 P for P parameters
// (read in forward and in backward, gradient written, and AdamW reading p, g,
// m, v and writing p, m, v); activations, and clipping's reads of the
// gradients, are not counted.
#include <string>
#include <utility>

#include "bench_step_case.h"
#include "train/model/gpt.h"
#include "train/options.h"

namespace attograd::bench {
namespace {

// `attograd train --data FILE --layers 4 --width 128 --heads 4 --block 64 --batch 64`:
// the --data preset with the given flags over it, as train/cli/cli.cpp composes them,
// and the model and optimizer the trainer builds from it.
StepCase charlm_step() {
  train::TrainOptions given;
  given.data = "FILE";  // only its being set matters: it picks the text preset
  train::TrainOptions o = train::preset_for(given, /*task_size_given=*/false);
  o.layers = 4, o.width = 128, o.heads = 4, o.block = 64, o.batch = 64;
  constexpr std::int64_t kVocab = 65;  // tiny Shakespeare's characters
  return {.config = train::model::gpt_config(o, kVocab),
          .batch = o.batch,
          .adamw = {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = 1e-8, .weight_decay = o.weight_decay},
          .clip_norm = o.grad_clip};
}

StepCase shakespeare_step() { return real_size(6, 384, 6, 256, 16); }
StepCase gpt2_step() { return real_size(12, 768, 12, 1024, 2); }
// GPT-2 124M itself: its vocabulary padded to 50304, as nanoGPT trains it.
StepCase gpt2_124m_step() { return real_size(12, 768, 12, 1024, 2, 50304); }

// A step is ~0.1-1 s on two cores (GPT-2 small's a few); a fixed count keeps the
// figure stable and the suite short.
const bool registered = [] {
  const std::pair<const char*, StepCase (*)()> cases[] = {
      {"gpt_step", gpt_step},   {"charlm_step", charlm_step},          {"shakespeare_step", shakespeare_step},
      {"gpt2_step", gpt2_step}, {"gpt2_124m_step", gpt2_124m_step}};
  for (const auto& [name, make] : cases) {
    const int iterations = std::string(name).rfind("gpt2", 0) == 0 ? 2 : 5;
    register_case(name, [make](benchmark::State& st) { step_case(st, make()); })->Iterations(iterations);
    register_case(std::string(name) + "/bf16", [make](benchmark::State& st) { step_case(st, in_bf16(make())); })
        ->Iterations(iterations);
  }
  return true;
}();

}  // namespace
}  // namespace attograd::bench
