// 06 - Training: a tiny GPT learns to reverse four digits.
//
// The attention of examples 01-05, stacked into a GPT (nn::GPT: embeddings,
// causal multi-head attention blocks, a head giving next-token logits) and
// trained with AdamW. Each sequence is four random digits, '=', and the same
// digits reversed:  3 1 4 1 = 1 4 1 3.  The model reads a sequence and at
// every position predicts the next token; only the predictions after '=' are
// scored (the other targets are ignore_index), since the first digits are
// random. To reverse, the token after '=' must attend to the 4th digit, the
// next to the 3rd, and so on: causal attention learns to look back by position.
//
// What to look at: the loss falling from ln(11) = 2.40 (a uniform guess over
// 11 tokens) towards 0, and the model reversing freshly drawn digits.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "check.h"
#include "nn/gpt.h"
#include "train/optim/optimizer.h"

using namespace attograd;
using examples::check;

constexpr std::int64_t kDigits = 4, kEquals = 10, kVocab = 11;
constexpr std::int64_t kT = 2 * kDigits;  // the model sees 2N of the 2N + 1 tokens

// A batch of (input, target) pairs, each (batch, kT) int64: target[t] = sequence[t + 1].
std::pair<Tensor, Tensor> make_batch(std::int64_t batch, std::mt19937& rng) {
  std::uniform_int_distribution<std::int64_t> digit(0, 9);
  std::vector<std::int64_t> inputs, targets;
  for (std::int64_t b = 0; b < batch; ++b) {
    std::vector<std::int64_t> sequence(2 * kDigits + 1, kEquals);
    for (std::int64_t i = 0; i < kDigits; ++i) sequence[i] = sequence[2 * kDigits - i] = digit(rng);
    for (std::int64_t t = 0; t < kT; ++t) {
      inputs.push_back(sequence[t]);
      targets.push_back(t < kDigits ? -100 : sequence[t + 1]);  // -100: not scored
    }
  }
  return {from_vector(inputs, {batch, kT}), from_vector(targets, {batch, kT})};
}

int main() {
  try {
    nn::GPT model({.vocab_size = kVocab, .block_size = kT, .n_layer = 2, .n_head = 2, .n_embd = 32, .seed = 1});
    train::optim::AdamW optimizer(model.named_parameters(), {.lr = 3e-3, .weight_decay = 0.0});
    std::mt19937 rng(42);

    const int steps = 200;
    double first_loss = 0;
    for (int step = 0; step < steps; ++step) {
      const auto [inputs, targets] = make_batch(32, rng);
      const Tensor loss = model.loss(inputs, targets);
      if (step == 0) first_loss = loss.item();
      if (step % 50 == 0 || step == steps - 1) std::cout << "step " << step << "  loss " << loss.item() << '\n';
      optimizer.zero_grad();
      backward(loss);
      optimizer.step();
    }

    // Held-out sequences, in evaluation mode and without a graph.
    model.eval();
    NoGradGuard no_grad;
    const auto [inputs, targets] = make_batch(256, rng);
    const double held_out_loss = model.loss(inputs, targets).item();
    // Teacher-forced predictions of the reversed half: all four right counts as reversed.
    const std::vector<std::int64_t> predicted = argmax(model(inputs), -1).to_vector<std::int64_t>();
    const std::vector<std::int64_t> expected = targets.to_vector<std::int64_t>();
    int reversed = 0;
    for (std::int64_t b = 0; b < 256; ++b) {
      bool all_right = true;
      for (std::int64_t t = kDigits; t < kT; ++t) all_right = all_right && predicted[b * kT + t] == expected[b * kT + t];
      reversed += all_right;
    }

    // Greedy generation: feed "3 1 4 1 =", append the most likely next token, repeat.
    std::vector<std::int64_t> sequence = {3, 1, 4, 1, kEquals};
    while (static_cast<std::int64_t>(sequence.size()) < 2 * kDigits + 1) {
      const auto length = static_cast<std::int64_t>(sequence.size());
      const Tensor logits = model(from_vector(sequence, {1, length}));  // (1, length, V)
      sequence.push_back(static_cast<std::int64_t>(argmax(select(select(logits, 0, 0), 0, length - 1), 0).item()));
    }
    std::cout << "\nheld-out loss " << held_out_loss << ", sequences reversed " << reversed << " / 256\n"
              << "greedy: 3 1 4 1 = ->";
    for (std::int64_t t = kDigits + 1; t < 2 * kDigits + 1; ++t) std::cout << ' ' << sequence[t];
    std::cout << "\n\nclaims:\n";

    const double uniform_loss = std::log(static_cast<double>(kVocab));
    check(std::fabs(first_loss - uniform_loss) < 0.5, "the first loss is about ln(11) = 2.40 (a uniform guess)");
    check(held_out_loss < 0.25 * uniform_loss, "after 200 steps the held-out loss is below 25% of ln(11)");
    check(reversed >= 230, "at least 90% of 256 held-out sequences are reversed correctly");
    check(sequence == std::vector<std::int64_t>{3, 1, 4, 1, kEquals, 1, 4, 1, 3}, "greedy generation turns 3 1 4 1 = into 1 4 1 3");
  } catch (const Error& e) {
    std::cerr << "attograd error: " << e.what() << '\n';
    return 1;
  }
  return examples::exit_code();
}
