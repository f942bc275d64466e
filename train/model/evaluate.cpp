#include "train/model/evaluate.h"

#include <fmt/format.h>

#include <algorithm>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/error.h"

namespace attograd::train::model {

std::int64_t eval_batch_rows(const nn::GPTConfig& c) {
  const std::int64_t floats_per_row = c.block_size * std::max(c.vocab_size, c.n_head * c.block_size);
  return std::clamp<std::int64_t>(kEvalBatchFloats / std::max<std::int64_t>(1, floats_per_row), 1, kEvalBatchRows);
}

EvalResult evaluate(nn::GPT& model, const data::Dataset& data, const EvaluateOptions& options) {
  AG_CHECK(options.batch >= 0, "eval", "batch must be >= 1 (0: the default), got {}", options.batch);
  AG_CHECK(options.max_sequences >= 0, "eval", "max_sequences must be >= 0 (0: all), got {}", options.max_sequences);
  EvaluateOptions o = options;
  if (o.batch == 0) o.batch = eval_batch_rows(model.config());
  NoGradGuard no_grad;
  const AutocastGuard autocast(o.dtype);  // every batch reads the one bfloat16 copy of each weight
  model.eval();
  const std::int64_t heldout = data.eval_sequences(model.config().block_size);
  const std::int64_t rows = o.max_sequences > 0 ? std::min(o.max_sequences, heldout) : heldout;
  double loss_sum = 0;
  std::int64_t counted = 0, exact = 0, batches = 0;
  for (std::int64_t first = 0; first < rows; first += o.batch) {
    const data::Batch b = data.eval_batch(first, std::min(o.batch, rows - first), model.config().block_size);
    const Tensor targets = b.targets;
    const auto target = targets.to_vector<std::int64_t>();
    const std::int64_t n = data::counted_targets(target), B = targets.size(0), T = targets.size(1);
    counted += n;
    if (!data.has_answers()) {
      // A language model's loss alone: the fused head and loss (GPT::loss), never the batch's whole logits.
      if (n > 0)
        loss_sum += model.loss(to(b.tokens, o.device), to(targets, o.device), data::kIgnoreIndex).item() *
                    static_cast<double>(n);
    } else {
      const Tensor logits = model.token_logits(model.forward(to(b.tokens, o.device)));  // (B, T, tokens)
      if (n > 0) loss_sum += cross_entropy(logits, to(targets, o.device), data::kIgnoreIndex).item() * static_cast<double>(n);
      const auto predicted = to_cpu(argmax(logits, -1)).to_vector<std::int64_t>();  // (B, T)
      for (std::int64_t r = 0; r < B; ++r) {
        bool all = true;
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t want = target[r * T + t];
          all = all && (want == data::kIgnoreIndex || predicted[r * T + t] == want);
        }
        exact += all;
      }
    }
    ++batches;
    if (o.after_batch) o.after_batch(first + B, rows);
  }
  EvalResult result;
  result.loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
  result.examples = rows;
  result.heldout = heldout;
  result.targets = counted;
  result.batches = batches;
  result.total_batches = (heldout + o.batch - 1) / o.batch;
  if (data.has_answers()) result.accuracy = rows > 0 ? static_cast<double>(exact) / static_cast<double>(rows) : 0.0;
  return result;
}

std::string thousands(std::int64_t n) {
  const std::string digits = std::to_string(n);
  const std::size_t sign = n < 0 ? 1 : 0;
  std::string out = digits.substr(0, sign);
  for (std::size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string coverage(const EvalResult& r) {
  return r.whole() ? fmt::format("all {}", thousands(r.heldout))
                   : fmt::format("{} of {}", thousands(r.examples), thousands(r.heldout));
}

}  // namespace attograd::train::model
