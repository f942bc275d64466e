#pragma once
// The learning-rate schedule: linear warm-up from lr / warmup to lr over the
// first `warmup` steps, then, by options.schedule, to lr * min_lr_ratio:
//   cosine    a cosine to the last step (nanoGPT's)
//   linear    a straight line to the last step (llm.c's)
//   constant  none: lr to the end
//   wsd       warmup-stable-decay: lr until the last decay_fraction of the
//             steps, then a straight line (MiniCPM's; a run may be continued
//             from a checkpoint of its stable part with more steps)
#include <cstdint>

#include "train/options.h"

namespace attograd::train::optim {

// The rate used by step `step` (1-based) of a run of options.steps steps.
double learning_rate(const TrainOptions& options, std::int64_t step);

}  // namespace attograd::train::optim
