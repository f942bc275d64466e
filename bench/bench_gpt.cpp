// gpt_step: one training step of the design notes' toy GPT (nn/gpt.h defaults:
// vocab 65, 4 layers, 4 heads, 128 wide, block 128, tied embeddings, no
// dropout) on a batch of 32 x 128 random tokens, with AdamW (lr 1e-3,
// weight decay 0.01 on the Linear weights): zero_grad, forward + loss,
// backward, update. Counters: "tokens" (tokens/s, B*T per step), and
// "flops", "bytes" as below.
//
// FLOPs per step (matmul FLOPs only, forward x 3 for forward + backward;
// layer norms, GELU, softmax, embedding and the optimizer are not counted):
//   per layer forward: the qkv, out, fc and proj matmuls, 2 BT C (3C + C + 4C + 4C)
//   = 24 BT C^2, plus causal attention 2 B C T (T + 1) (bench_attention.cpp);
//   the head: 2 BT C V.  Step = 3 (n_layer (24 BT C^2 + 2 B C T (T + 1)) + 2 BT C V).
// Bytes per step: the compulsory parameter traffic, 40 P for P parameters
// (read in forward and in backward, gradient written, and AdamW reading p, g,
// m, v and writing p, m, v); activations are not counted.
#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "bench_common.h"
#include "nn/gpt.h"
#include "tensor/rng.h"
#include "train/optimizer.h"

namespace attograd::bench {
namespace {

constexpr std::int64_t kBatch = 32;

// Token ids in [0, vocab), (B, T) int64, from a fixed seed.
Tensor random_tokens(std::int64_t B, std::int64_t T, std::int64_t vocab, std::uint64_t seed) {
  Generator gen(seed);
  const std::vector<float> u = rand({B, T}, {}, gen).to_vector<float>();
  std::vector<std::int64_t> ids(u.size());
  for (std::size_t i = 0; i < u.size(); ++i)
    ids[i] = std::min<std::int64_t>(vocab - 1, static_cast<std::int64_t>(u[i] * static_cast<float>(vocab)));
  return from_vector(ids, {B, T});
}

double step_loss(nn::GPT& model, train::AdamW& optimizer, const Tensor& tokens, const Tensor& targets) {
  optimizer.zero_grad();
  Tensor loss = model.loss(tokens, targets);
  backward(loss);
  optimizer.step();
  return loss.item();
}

void gpt_step_case(benchmark::State& state) {
  const nn::GPTConfig config;  // the toy GPT of the design notes
  const std::int64_t B = kBatch, T = config.block_size, C = config.n_embd, V = config.vocab_size;
  nn::GPT model(config);
  train::AdamW optimizer(model.named_parameters(), train::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
  const Tensor tokens = random_tokens(B, T, V, 31), targets = random_tokens(B, T, V, 32);

  // Checks before timing: at GPT-2's init (weights ~ N(0, 0.02)) the logits
  // are near zero, so the loss is near ln(V); and a few AdamW steps on one
  // batch must lower the loss on it.
  const double first = step_loss(model, optimizer, tokens, targets);
  if (!(std::abs(first - std::log(static_cast<double>(V))) < 0.1)) {
    state.SkipWithError(("check failed: initial loss " + std::to_string(first) + " is not near ln(V) = " +
                         std::to_string(std::log(static_cast<double>(V))))
                            .c_str());
    return;
  }
  double last = first;
  for (int i = 0; i < 3; ++i) last = step_loss(model, optimizer, tokens, targets);
  if (!(last < first - 0.01)) {
    state.SkipWithError(("check failed: 4 AdamW steps on one batch did not lower its loss (" +
                         std::to_string(first) + " -> " + std::to_string(last) + ")")
                            .c_str());
    return;
  }

  for (auto _ : state) benchmark::DoNotOptimize(step_loss(model, optimizer, tokens, targets));

  const double BT = static_cast<double>(B * T);
  const double layer = 24 * BT * C * C + 2.0 * B * C * T * (T + 1);
  const double flops = 3 * (config.n_layer * layer + 2 * BT * C * V);
  set_counters(state, flops, 40.0 * static_cast<double>(model.num_parameters()));
  state.counters["tokens"] = benchmark::Counter(BT * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// A step is ~0.1-1 s on two cores; a fixed count keeps the figure stable and the suite short.
const bool registered = [] {
  register_case("gpt_step", gpt_step_case)->Iterations(5);
  return true;
}();

}  // namespace
}  // namespace attograd::bench
