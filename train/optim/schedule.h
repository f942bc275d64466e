#pragma once
// The learning-rate schedule: linear warm-up from lr / warmup to lr over the
// first `warmup` steps, then cosine decay to lr * min_lr_ratio at the last step.
#include <cstdint>

#include "train/options.h"

namespace attograd::train::optim {

// The rate used by step `step` (1-based) of a run of options.steps steps.
double learning_rate(const TrainOptions& options, std::int64_t step);

}  // namespace attograd::train::optim
