#include "train/evaluate.h"

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace attograd {

EvalResult evaluate(nn::GPT& model, const Dataset& data, std::int64_t batch, Device device) {
  NoGradGuard no_grad;
  model.eval();
  double loss_sum = 0;
  std::int64_t counted = 0, rows = 0, exact = 0;
  for (const Batch& b : data.eval_batches(batch, model.config().block_size)) {
    const Tensor logits = model.forward(to(b.tokens, device));  // (B, T, V)
    const Tensor targets = b.targets;
    const auto target = targets.to_vector<std::int64_t>();
    std::int64_t n = 0;
    for (std::int64_t t : target) n += t != kIgnoreIndex;
    if (n > 0) loss_sum += cross_entropy(logits, to(targets, device), kIgnoreIndex).item() * static_cast<double>(n);
    counted += n;
    const auto predicted = to_cpu(argmax(logits, -1)).to_vector<std::int64_t>();  // (B, T)
    const std::int64_t B = targets.size(0), T = targets.size(1);
    for (std::int64_t r = 0; r < B; ++r) {
      bool all = true;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t want = target[r * T + t];
        all = all && (want == kIgnoreIndex || predicted[r * T + t] == want);
      }
      exact += all;
    }
    rows += B;
  }
  EvalResult result;
  result.loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
  result.examples = rows;
  if (data.has_answers()) result.accuracy = rows > 0 ? static_cast<double>(exact) / static_cast<double>(rows) : 0.0;
  return result;
}

}  // namespace attograd
