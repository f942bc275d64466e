#pragma once
// Held-out evaluation: the mean loss over every target that counts and, for
// tasks, exact-match accuracy.
//
// Exact match is computed from one teacher-forced forward pass: greedy
// decoding reproduces the answer exactly when, and only when, the argmax at
// every answer position is the right token given the right prefix (each
// greedy step then sees the true prefix; the first wrong argmax is a wrong
// answer either way). tests/test_train.cpp checks this against real greedy
// decoding.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "nn/gpt.h"
#include "train/data/dataset.h"

namespace attograd::train::model {

struct EvaluateOptions {
  std::int64_t batch = 0;          // held-out rows per forward pass; 0: eval_batch_rows(the model's config)
  std::int64_t max_sequences = 0;  // read only the first this many held-out rows; 0: every one
  Device device = Device::cpu();
  DType dtype = DType::f32;        // bfloat16: the forward under autocast (autograd/autocast.h)
  // Called after each batch with the rows read so far and the rows to read (for a progress line).
  std::function<void(std::int64_t done, std::int64_t total)> after_batch;
};

struct EvalResult {
  double loss = 0;                 // nats per counted target
  std::optional<double> accuracy;  // fraction of rows whose every counted target is the argmax
  std::int64_t examples = 0;       // rows evaluated
  std::int64_t heldout = 0;        // rows in the whole held-out set: examples < heldout when capped
  std::int64_t targets = 0;        // targets counted in the loss (text: every position; tasks: answer tokens)
  std::int64_t batches = 0, total_batches = 0;  // forward passes made, and needed for the whole set
  bool whole() const { return examples == heldout; }
};

// Rows per evaluation batch: 500 (large batches amortise the per-op overhead),
// fewer when its logits or attention weights, (B, T, V) and (B, H, T, T),
// would pass kEvalBatchFloats floats each.
inline constexpr std::int64_t kEvalBatchRows = 500;
inline constexpr std::int64_t kEvalBatchFloats = std::int64_t{1} << 24;  // 64 MiB of float32
std::int64_t eval_batch_rows(const nn::GPTConfig& config);

// Reads the held-out set from its first row, in batches of options.batch rows
// (the last one shorter), stopping after options.max_sequences rows when that
// is set. Puts the model in eval mode and leaves it there.
EvalResult evaluate(nn::GPT& model, const data::Dataset& data, const EvaluateOptions& options = {});

// "256 of 4,120" or "all 4,120": how much of the held-out set `r` covers.
std::string coverage(const EvalResult& r);
// 1234567 -> "1,234,567".
std::string thousands(std::int64_t n);

}  // namespace attograd::train::model
