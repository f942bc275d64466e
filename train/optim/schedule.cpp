#include "train/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace attograd::train::optim {

double learning_rate(const TrainOptions& o, std::int64_t step) {
  if (step <= o.warmup) return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup);
  if (o.schedule == "constant") return o.lr;
  // The decay runs from step `start` to the last step.
  const std::int64_t start =
      o.schedule == "wsd" ? std::max(o.warmup, o.steps - static_cast<std::int64_t>(std::llround(o.decay_fraction * o.steps)))
                          : o.warmup;
  if (step <= start) return o.lr;
  const double decay_steps = static_cast<double>(std::max<std::int64_t>(1, o.steps - start));
  const double progress = std::min(1.0, static_cast<double>(step - start) / decay_steps);  // 0 -> 1
  const double min_lr = o.lr * o.min_lr_ratio;
  if (o.schedule == "cosine") return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  return o.lr + (min_lr - o.lr) * progress;  // linear, wsd
}

}  // namespace attograd::train::optim
