// One GPT training step as a benchmark case, on either device (bench_step_case.h).
#include "bench_step_case.h"

#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/storage.h"
#include "train/model/gpt.h"
#include "train/optim/grad_clip.h"

namespace attograd::bench {
namespace {

// One step in the trainer's order: loss, backward, clip, update, zero_grad. Returns the loss.
double step_loss(nn::GPT& model, train::optim::AdamW& optimizer, const Tensor& tokens, const Tensor& targets,
                 double clip_norm, DType dtype) {
  Tensor loss;
  {
    const AutocastGuard autocast(dtype);
    loss = model.loss(tokens, targets);
  }
  backward(loss);
  if (clip_norm > 0) train::optim::clip_grad_norm(optimizer.params(), clip_norm);
  optimizer.step();
  optimizer.zero_grad();
  return loss.item();
}

}  // namespace

StepCase gpt_step() {
  return {.config = nn::GPTConfig{}, .batch = 32, .adamw = {.lr = 1e-3, .weight_decay = 0.01}, .clip_norm = 0};
}

StepCase real_size(std::int64_t layers, std::int64_t width, std::int64_t heads, std::int64_t block,
                   std::int64_t batch, std::int64_t vocab) {
  return {.config = {.vocab_size = vocab, .block_size = block, .n_layer = layers, .n_head = heads, .n_embd = width},
          .batch = batch,
          .adamw = {.lr = 1e-5, .weight_decay = 0.1},
          .clip_norm = 1.0,
          .initial_loss_tolerance = 0.3};
}

StepCase in_bf16(StepCase c) {
  c.dtype = DType::bf16;
  return c;
}

void step_case(benchmark::State& state, const StepCase& c, Device device) {
  const std::int64_t B = c.batch, T = c.config.block_size, C = c.config.n_embd, V = c.config.vocab_size;
  nn::GPT model(c.config);
  model.to(device);
  model.train();  // dropout on, when the config has any
  train::optim::AdamW optimizer(model.named_parameters(), c.adamw);
  const Tensor tokens = kernels::to_device(random_tokens(B, T, V, 31), device);
  const Tensor targets = kernels::to_device(random_tokens(B, T, V, 32), device);
  const auto step = [&] { return step_loss(model, optimizer, tokens, targets, c.clip_norm, c.dtype); };

  // Checks before timing: at GPT-2's init (weights ~ N(0, 0.02)) the logits
  // are near zero, so the loss is near ln(V); and a few AdamW steps on one
  // batch must lower the loss on it.
  const double first = step();
  if (!(std::abs(first - std::log(static_cast<double>(V))) < c.initial_loss_tolerance)) {
    state.SkipWithError(("check failed: initial loss " + std::to_string(first) + " is not near ln(V) = " +
                         std::to_string(std::log(static_cast<double>(V))))
                            .c_str());
    return;
  }
  double last = first;
  for (int i = 0; i < 3; ++i) last = step();
  if (!(last < first - 0.01)) {
    state.SkipWithError(("check failed: 4 AdamW steps on one batch did not lower its loss (" +
                         std::to_string(first) + " -> " + std::to_string(last) + ")")
                            .c_str());
    return;
  }

  cpu_reset_alloc_peaks();
  const std::size_t allocated_before = cpu_alloc_stats().bytes_allocated;
  for (auto _ : state) {
    if (device.is_cuda())
      state.SetIterationTime(cuda::time_gpu_ms(device.index, [&] { benchmark::DoNotOptimize(step()); }) / 1000.0);
    else
      benchmark::DoNotOptimize(step());
  }

  const double BT = static_cast<double>(B * T);
  set_counters(state, train::model::step_flops(c.config, B), 40.0 * static_cast<double>(model.num_parameters()));
  state.counters["tokens"] = benchmark::Counter(BT * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  if (device.is_cpu()) {
    // A steady step's host memory: what its tensors needed at once, what the allocator held with them, and
    // how much it took fresh from the system (the rest served from its cache).
    const CpuAllocStats alloc = cpu_alloc_stats();
    state.counters["peak_in_use_MB"] = static_cast<double>(alloc.peak_bytes_in_use) / 1e6;
    state.counters["peak_held_MB"] = static_cast<double>(alloc.peak_bytes_held) / 1e6;
    state.counters["fresh_MB_per_step"] = static_cast<double>(alloc.bytes_allocated - allocated_before) / 1e6 /
                                          static_cast<double>(state.iterations());
  }
}

}  // namespace attograd::bench
