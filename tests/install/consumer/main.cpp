// Built against an installed attograd only: a small GPT learns a periodic
// sequence through the library's API (nn::GPT, train::optim::AdamW, backward), and its
// weights go through a safetensors file and back. Exits non-zero when it does not learn.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/version.h"
#include "nn/gpt.h"
#include "train/optim/optim.h"
#include "train/output/output.h"

using namespace attograd;

int main() try {
  std::printf("attograd %s\n", version());
  const nn::GPTConfig config{.vocab_size = 5, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
  nn::GPT model(config);
  train::optim::AdamW optimizer(model.named_parameters(), {.lr = 1e-2});

  // Rows of 0 1 2 3 4 0 1 ..., each starting elsewhere: the next token is always (t + 1) % 5.
  std::vector<std::int64_t> tokens, targets;
  for (std::int64_t row = 0; row < 4; ++row)
    for (std::int64_t t = 0; t < config.block_size; ++t) {
      tokens.push_back((row + t) % 5);
      targets.push_back((row + t + 1) % 5);
    }
  const Tensor x = from_vector(tokens, {4, config.block_size});
  const Tensor y = from_vector(targets, {4, config.block_size});

  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    const Tensor loss = model.loss(x, y);
    backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    last = loss.item();
    if (step == 0) first = last;
  }
  std::printf("loss %.4f -> %.4f (ln 5 = %.4f)\n", first, last, std::log(5.0));
  if (!(last < 0.1 * first)) {
    std::fprintf(stderr, "consumer: the model did not learn (loss %.4f -> %.4f)\n", first, last);
    return 1;
  }

  // Weights out to a safetensors file and into a second model: the same logits.
  const auto path = std::filesystem::temp_directory_path() / "attograd_consumer.safetensors";
  train::output::NamedTensors named;
  for (const auto& [name, tensor] : model.state_dict()) named.emplace_back(name, tensor);
  train::output::save_safetensors(path.string(), named);
  nn::GPT reloaded(config);
  reloaded.load_state_dict(train::output::load_safetensors(path.string()).tensors);
  std::filesystem::remove(path);
  NoGradGuard no_grad;
  const auto a = model(x).to_vector<float>(), b = reloaded(x).to_vector<float>();
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  std::printf("max |logits - reloaded logits| = %g\n", diff);
  return diff == 0 ? 0 : 1;
} catch (const Error& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}
