// `attograd train`: options -> data, model, optimizer -> the training loop,
// with periodic evaluation, checkpoints, metrics.jsonl and loss.svg.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fmt/format.h>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "tensor/error.h"
#include "tensor/parallel.h"
#include "train/checkpoint.h"
#include "train/commands.h"
#include "train/evaluate.h"
#include "train/grad_clip.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/progress.h"
#include "train/run_directory.h"
#include "train/safetensors.h"
#include "train/schedule.h"
#include "train/signals.h"
#include "train/svg.h"
#include "train/tasks.h"
#include "train/text_data.h"

namespace attograd {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCheckpointName = "ckpt.safetensors";
// A text run's evaluations read the first this many windows of the validation
// split, not all of it: a 25 MB file holds about 39,000 windows of 64 characters,
// and reading them all at every --eval-interval could cost more than the steps
// between two evaluations.
// The eval line says so; `attograd eval` reads the whole split. A task's
// held-out set is --heldout problems (2000 by default), always read whole.
constexpr std::int64_t kTrainEvalWindows = 256;

// A model whose weights, gradients and AdamW moments (4 floats per parameter)
// do not fit in this machine's memory is refused before allocating any of it.
void check_memory(const TrainOptions& o, std::int64_t vocab_size) {
  const double parameters = static_cast<double>(parameter_count(gpt_config(o, vocab_size)));
  const double needed = parameters * 4 * sizeof(float);
  const double available = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  AG_CHECK(available <= 0 || needed <= available, "--width",
           "--layers {} --width {} with a vocabulary of {} make {:.3g} parameters: {:.1f} GiB of weights, "
           "gradients and optimizer state, more than this machine's {:.1f} GiB",
           o.layers, o.width, vocab_size, parameters, needed / (1 << 30), available / (1 << 30));
}

std::unique_ptr<train::Optimizer> make_optimizer(const TrainOptions& o, const nn::GPT& model) {
  if (o.optimizer == "sgd")
    return std::make_unique<train::SGD>(
        model.named_parameters(), train::SGDOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  return std::make_unique<train::AdamW>(model.named_parameters(), train::AdamWOptions{.lr = o.lr,
                                                                                      .beta1 = o.beta1,
                                                                                      .beta2 = o.beta2,
                                                                                      .eps = 1e-8,
                                                                                      .weight_decay = o.weight_decay});
}

std::string describe_data(const TrainOptions& o, const Dataset& data) {
  if (!o.data.empty()) {
    const auto& text = dynamic_cast<const TextData&>(data);
    return fmt::format("text '{}' ({} train / {} validation characters, vocabulary {}, unigram entropy {:.3f})", o.data,
                       text.train_tokens(), text.validation_tokens(), data.tokenizer().size(), text.unigram_entropy());
  }
  const auto& task = dynamic_cast<const Task&>(data);
  return fmt::format("task {} (size {}, e.g. {}{}; {} held out)", o.task, o.task_size, task.heldout()[0].prompt,
                     task.heldout()[0].answer, task.heldout().size());
}

// "eval step 250: val loss 1.8412 over the first 256 of 4,120 validation windows", or, read whole,
// "eval step 100: val loss 0.0123, exact match 99.10% of 2000".
std::string eval_line(std::int64_t step, const EvalResult& r) {
  std::string line = fmt::format("eval step {}: val loss {:.4f}", step, r.loss);
  if (!r.whole()) line += fmt::format(" over the first {} validation windows", coverage(r));
  if (r.accuracy) line += fmt::format(", exact match {:.2f}% of {}", 100 * *r.accuracy, r.examples);
  return line;
}

}  // namespace

TrainSummary train_command(TrainOptions o, std::FILE* out) {
  const auto start_time = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count(); };

  // ---- 1. options: from a checkpoint when resuming, then every one validated
  LoadedCheckpoint resumed;
  if (!o.resume.empty()) {
    resumed = load_checkpoint(o.resume, "--resume");
    TrainOptions c = resumed.info.config;
    c.steps = o.steps > 0 ? o.steps : c.steps;  // the schedule may be lengthened
    c.eval_interval = o.eval_interval > 0 ? o.eval_interval : preset_for(c, true).eval_interval;
    c.threads = o.threads, c.device = o.device, c.stop_at = o.stop_at, c.quiet = o.quiet, c.resume = o.resume;
    c.out = o.out.empty() ? fs::path(o.resume).parent_path().string() : o.out;
    if (c.out.empty()) c.out = ".";
    o = c;
    AG_CHECK(o.steps >= resumed.info.step, "--steps", "{} is before the checkpoint's step {}", o.steps,
             resumed.info.step);
    AG_CHECK(resumed.optimizer_name == o.optimizer, "--resume", "'{}' holds no {} optimizer state", o.resume,
             o.optimizer);
  }
  validate(o);
  if (o.out.empty()) o.out = (fs::path("runs") / (o.data.empty() ? o.task : fs::path(o.data).stem().string())).string();
  std::unique_ptr<Dataset> data = make_dataset(o, o.resume.empty() ? nullptr : &resumed.info.tokenizer);
  if (const auto* text = dynamic_cast<const TextData*>(data.get())) text->check_block(o.block);
  check_output_dir(o.out);
  check_memory(o, data->tokenizer().size());
  std::unique_ptr<nn::GPT> model =
      o.resume.empty() ? build_model(o, data->tokenizer().size()) : std::move(resumed.model);

  if (o.threads > 0) set_num_threads(o.threads);
  const Device device = o.device == "cuda" ? Device::cuda() : Device::cpu();
  if (!device.is_cpu()) model->to(device);
  std::unique_ptr<train::Optimizer> optimizer = make_optimizer(o, *model);
  const std::int64_t first_step = o.resume.empty() ? 0 : resumed.info.step;
  if (!o.resume.empty()) optimizer->load_state(resumed.optimizer_state, resumed.optimizer_steps);
  const std::int64_t last_step = o.stop_at > 0 ? std::min(o.stop_at, o.steps) : o.steps;

  // ---- 2. everything is valid: only now does the run directory appear
  RunDirectory run_directory(o.out);
  remove_stale_temporaries(o.out, kCheckpointName);

  const fs::path run_dir(o.out);
  const std::string ckpt_path = (run_dir / kCheckpointName).string();
  MetricsLog metrics((run_dir / "metrics.jsonl").string(), first_step);
  const std::string title = o.data.empty() ? fmt::format("attograd: {} {}", o.task, o.task_size)
                                           : fmt::format("attograd: {}", fs::path(o.data).filename().string());
  const CheckpointInfo info{o, data->tokenizer(), 0};

  std::fprintf(out, "attograd train: %s\n", describe_data(o, *data).c_str());
  std::fprintf(out,
               "model: %lld layers, %lld heads, width %lld, block %lld, %lld parameters; %s lr %g, batch %lld, "
               "%lld steps; %d threads, %s; run dir %s\n",
               static_cast<long long>(o.layers), static_cast<long long>(o.heads), static_cast<long long>(o.width),
               static_cast<long long>(o.block), static_cast<long long>(model->num_parameters()), o.optimizer.c_str(),
               o.lr, static_cast<long long>(o.batch), static_cast<long long>(o.steps), get_num_threads(),
               device.str().c_str(), o.out.c_str());
  if (first_step > 0) std::fprintf(out, "resuming from %s at step %lld\n", o.resume.c_str(), static_cast<long long>(first_step));
  std::fflush(out);

  const EvaluateOptions eval_options{.max_sequences = o.data.empty() ? 0 : kTrainEvalWindows, .device = device};
  Progress progress(out, first_step, last_step, {.interactive = ::isatty(::fileno(out)) == 1, .quiet = o.quiet});
  const auto params = model->named_parameters();
  TrainSummary summary;
  EvalResult last_eval;
  double train_seconds = 0, train_tokens = 0;  // the steps alone, for tokens per second
  // The last checkpoint known to be good: the one resumed from until this run writes its own.
  std::string good_checkpoint = o.resume.empty() ? "" : o.resume;
  std::int64_t good_step = first_step;
  const StopSignalGuard stop_signal_guard;
  std::int64_t stopped_at = last_step;
  int stopped_by = 0;
  for (std::int64_t step = first_step + 1; step <= last_step; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(o, step);
    optimizer->set_lr(lr);
    const Batch batch = data->train_batch(static_cast<std::uint64_t>(step - 1), o.batch, o.block);
    model->train();
    const Tensor loss = model->loss(to(batch.tokens, device), to(batch.targets, device), kIgnoreIndex);
    backward(loss);
    const double grad_norm = clip_grad_norm(params, o.grad_clip);
    const double loss_value = loss.item();
    // A non-finite loss or gradient would poison every weight: stop before the update,
    // and before any checkpoint of this step replaces the last good one.
    if (!std::isfinite(loss_value) || !std::isfinite(grad_norm)) {
      const std::string kept = good_checkpoint.empty()
                                   ? std::string("no checkpoint was saved")
                                   : fmt::format("the last good checkpoint is {} (step {})", good_checkpoint, good_step);
      const double bad = std::isfinite(loss_value) ? grad_norm : loss_value;
      fail("train", "the {} became {} at step {} (try a lower --lr or --grad-clip); {}",
           std::isfinite(loss_value) ? "gradient norm" : "loss", std::isnan(bad) ? "NaN" : bad > 0 ? "+inf" : "-inf",
           step, kept);
    }
    optimizer->step();
    optimizer->zero_grad();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_seconds += dt;
    train_tokens += static_cast<double>(batch.tokens.numel());
    const double tokens_per_s = static_cast<double>(batch.tokens.numel()) / dt;
    metrics.log(TrainRecord{step, loss_value, lr, grad_norm, tokens_per_s, elapsed()});
    progress.update(step, loss_value, lr, train_tokens / train_seconds);  // the run's average: a steadier figure

    const int signo = StopSignalGuard::received();
    const bool stop_now = signo != 0;
    if (stop_now) {
      stopped_at = step;
      stopped_by = signo;
      progress.message(fmt::format("{}: saving step {}; continue with --resume {}", signal_name(signo), step,
                                   ckpt_path));
    }
    if (step % o.eval_interval == 0 || step == last_step || stop_now) {
      last_eval = evaluate(*model, *data, eval_options);
      metrics.log(EvalRecord{step, last_eval.loss, last_eval.accuracy, elapsed()});
      progress.message(eval_line(step, last_eval));
      CheckpointInfo at = info;
      at.step = step;
      save_checkpoint(ckpt_path, *model, optimizer.get(), at);
      good_checkpoint = ckpt_path, good_step = step;
      run_directory.keep();
      write_file_atomically((run_dir / "loss.svg").string(), loss_plot_svg(metrics.train(), metrics.eval(), title));
    }
    if (stop_now) break;
  }
  progress.finish();
  if (last_step <= first_step) {  // resumed at or past the end: report where the checkpoint stands
    last_eval = evaluate(*model, *data, eval_options);
    progress.message(eval_line(first_step, last_eval));
  }

  summary.run_dir = o.out;
  summary.checkpoint = ckpt_path;
  summary.steps_done = std::max(first_step, stopped_at);
  summary.final_train_loss = progress.smoothed_loss();
  summary.val_loss = last_eval.loss;
  summary.accuracy = last_eval.accuracy;
  if (!o.data.empty()) summary.unigram_entropy = dynamic_cast<const TextData&>(*data).unigram_entropy();
  summary.seconds = elapsed();
  summary.stop_signal = stopped_at < last_step ? stopped_by : 0;
  std::string line = fmt::format("done: step {} in {:.1f} s ({:.1f} s training); held-out loss {:.4f}",
                                 summary.steps_done, summary.seconds, train_seconds, summary.val_loss);
  if (!last_eval.whole()) line += fmt::format(" over the first {} validation windows", coverage(last_eval));
  if (summary.accuracy) line += fmt::format(", exact match {:.2f}%", 100 * *summary.accuracy);
  if (!o.data.empty()) line += fmt::format(" (unigram entropy {:.4f})", summary.unigram_entropy);
  line += fmt::format("; checkpoint {}", ckpt_path);
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
  return summary;
}

}  // namespace attograd
