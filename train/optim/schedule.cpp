#include "train/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace attograd::train::optim {

double learning_rate(const TrainOptions& o, std::int64_t step) {
  if (step <= o.warmup) return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup);
  const double decay_steps = static_cast<double>(std::max<std::int64_t>(1, o.steps - o.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / decay_steps);  // 0 -> 1
  const double min_lr = o.lr * o.min_lr_ratio;
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace attograd::train::optim
