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
#include <optional>

#include "nn/gpt.h"
#include "train/dataset.h"

namespace attograd {

struct EvalResult {
  double loss = 0;                 // nats per counted target
  std::optional<double> accuracy;  // fraction of rows whose every counted target is the argmax
  std::int64_t examples = 0;       // rows evaluated
};

// Puts the model in eval mode and leaves it there.
EvalResult evaluate(nn::GPT& model, const Dataset& data, std::int64_t batch, Device device = Device::cpu());

}  // namespace attograd
