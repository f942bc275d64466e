#include "train/cli/cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <sstream>
#include <type_traits>

#include "base/error.h"
#include "base/version.h"
#include "train/cli/commands.h"
#include "train/cli/signals.h"
#include "train/distributed/communicator.h"
#include "train/distributed/launcher.h"

namespace attograd::train::cli {

namespace {

// CLI11 turns "99999999999999999999" into INT64_MAX and "-1" into 2^64 - 1
// without a word; this check reads the text before it is converted and
// refuses anything that is not exactly an integer of the flag's type.
template <typename T>
CLI::Validator exact_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc::result_out_of_range)
          return fmt::format("{} is out of range [{}, {}]", text, std::numeric_limits<T>::min(),
                             std::numeric_limits<T>::max());
        if (ec != std::errc() || stop != end)
          return fmt::format("{} is not {}", text, std::is_signed_v<T> ? "an integer" : "a non-negative integer");
        return "";
      },
      "");  // no description: --help keeps showing "INT"
}

// An option whose integer values are checked by exact_integer.
template <typename T>
CLI::Option* add_number(CLI::App& cmd, const std::string& name, T& value, const std::string& help) {
  CLI::Option* opt = cmd.add_option(name, value, help);
  if constexpr (std::is_integral_v<T>) opt->check(exact_integer<T>());
  return opt;
}

// A flag whose value comes from the task's preset unless the user gives it.
struct PresetFlag {
  CLI::Option* option;
  std::function<void(const TrainOptions& preset)> take;  // copies the preset's value
  bool fixed_on_resume;  // part of the checkpoint's identity
};

template <typename T>
void add_preset_flag(CLI::App& cmd, std::vector<PresetFlag>& flags, TrainOptions& o, T TrainOptions::*field,
                     const std::string& name, const std::string& help, bool fixed_on_resume = true) {
  CLI::Option* opt = add_number(cmd, name, o.*field, help);
  flags.push_back({opt, [&o, field](const TrainOptions& preset) { o.*field = preset.*field; }, fixed_on_resume});
}

constexpr const char* kTrainEpilog = R"(
Presets: flags not given take the task's preset. The defaults shown are sort's
(reaching 99% exact match on 8 digits in about 400 steps); the others differ in:
  add     --layers 3 --width 48 --batch 128 --weight-decay 0
  --data  --layers 4 --width 64 --block 64 --batch 32 --steps 1000 --lr 3e-3
          --warmup 100 --dropout 0.1 --eval-interval 250
and --block is always one whole problem (2n for sort, reverse, copy; 3n+2 for add).

Tasks ("prompt=answer", loss on the answer only, one problem in ten held out):
  sort     31415926=11234569     reverse  31415926=62951413
  copy     31415926=31415926     add      07+45=250 (the sum, least significant digit first)

Writes to the run directory: ckpt.safetensors (safetensors layout: parameters,
optimizer state, step, RNG state, config and vocabulary), metrics.jsonl, loss.svg.
Ctrl-C (SIGINT), SIGTERM or SIGHUP finishes the current step, saves the checkpoint
and exits with 130, 143 or 129: --resume it. A loss that becomes NaN or infinite
stops the run (exit 1) before the checkpoint is overwritten. A run directory that
holds another run's checkpoint is refused (the default one is numbered instead:
runs/sort-2, ...), as is one that another run is using.)";

}  // namespace

int run_cli(const std::vector<std::string>& args, std::FILE* out, std::FILE* err) {
  CLI::App app{"attograd: a minimal reverse-mode autograd framework, training a small GPT", "attograd"};
  app.set_version_flag("--version", std::string("attograd ") + version());
  app.require_subcommand(0, 1);
  app.option_defaults()->always_capture_default();

  // ---- train
  TrainOptions train;
  std::vector<PresetFlag> presets;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a GPT on next-token prediction (no arguments: sort 8 digits to 99%, ~10 s)");
  train_cmd->footer(kTrainEpilog);
  {
    auto& c = *train_cmd;
    auto& p = presets;
    c.add_option("--task", train.task, "Synthetic task: sort, reverse, copy, add");
    add_preset_flag(c, p, train, &TrainOptions::task_size, "--task-size",
                    "Digits per sequence (sort, reverse, copy) or per operand (add); add's preset is 2");
    add_preset_flag(c, p, train, &TrainOptions::heldout, "--heldout",
                    "Held-out problems evaluated for exact match (all of them when fewer exist)");
    c.add_option("--data", train.data,
                 "Character-level language modelling on this UTF-8 text file instead of a task (with --resume: the "
                 "run's own text, where it has moved)");
    add_preset_flag(c, p, train, &TrainOptions::layers, "--layers", "Transformer blocks");
    add_preset_flag(c, p, train, &TrainOptions::heads, "--heads", "Attention heads per block (must divide --width)");
    add_preset_flag(c, p, train, &TrainOptions::width, "--width", "Model width (embedding size)");
    add_preset_flag(c, p, train, &TrainOptions::block, "--block",
                    "Context length in tokens (preset: one whole problem, or 64 for text)");
    add_preset_flag(c, p, train, &TrainOptions::dropout, "--dropout", "Dropout probability in training");
    add_preset_flag(c, p, train, &TrainOptions::optimizer, "--optimizer", "adamw or sgd (with momentum)");
    add_preset_flag(c, p, train, &TrainOptions::batch, "--batch", "Sequences per step");
    add_preset_flag(c, p, train, &TrainOptions::steps, "--steps",
                    "Optimizer steps in the whole run (the schedule's length; may be raised on --resume)");
    add_preset_flag(c, p, train, &TrainOptions::lr, "--lr", "Peak learning rate");
    add_preset_flag(c, p, train, &TrainOptions::warmup, "--warmup",
                    "Linear warm-up steps, then cosine decay to lr * --min-lr-ratio");
    add_preset_flag(c, p, train, &TrainOptions::min_lr_ratio, "--min-lr-ratio", "Final learning rate / peak");
    add_preset_flag(c, p, train, &TrainOptions::weight_decay, "--weight-decay",
                    "AdamW: decoupled weight decay; SGD: L2. Applied to Linear weights only: never to biases, "
                    "LayerNorm or embeddings");
    add_preset_flag(c, p, train, &TrainOptions::beta1, "--beta1", "AdamW first-moment decay");
    add_preset_flag(c, p, train, &TrainOptions::beta2, "--beta2", "AdamW second-moment decay");
    add_preset_flag(c, p, train, &TrainOptions::momentum, "--momentum", "SGD momentum");
    add_preset_flag(c, p, train, &TrainOptions::grad_clip, "--grad-clip",
                    "Clip gradients to this global L2 norm (0: no clipping)");
    add_preset_flag(c, p, train, &TrainOptions::seed, "--seed",
                    "Seeds the data, the held-out split, the initial weights and dropout");
    add_number(c, "--threads", train.threads, "CPU threads (0: every core); same seed and threads, same run");
    c.add_option("--device", train.device, "cpu or cuda");
    c.add_option("--dtype", train.dtype,
                 "float32 or bfloat16 (products and attention in bfloat16, float32 master weights; the default is "
                 "float32, or with --resume the checkpoint's)");
    add_preset_flag(c, p, train, &TrainOptions::eval_interval, "--eval-interval",
                    "Steps between evaluations and checkpoints", /*fixed_on_resume=*/false);
    c.add_option("--out", train.out, "Run directory (default: runs/<task>, or runs/<file name> for --data; with --resume, the checkpoint's)");
    c.add_option("--resume", train.resume,
                 "Continue from this checkpoint: its config is used, and N + N steps give exactly the weights of 2N");
    add_number(c, "--stop-at", train.stop_at, "Stop after this step, saving a checkpoint to --resume from (0: run to --steps)");
    c.add_flag("--quiet", train.quiet, "No progress line (evaluations and the summary still print)");
    add_number(c, "--attention-memory", train.attention_memory,
               "MiB of softmax probabilities each attention layer may keep for its backward, which then need not "
               "recompute them (whole heads; -1: 64 on heads of 64 values or more, none on narrower; 0: none, "
               "memory O(T) per head)");
    add_number(c, "--grad-accum", train.grad_accum,
               "Split each process's share of --batch into this many micro-batches (less memory, same result)");
    c.add_flag("--shard-optimizer", train.shard_optimizer,
               "Under mpirun: each process keeps the optimizer state of 1/N of the parameters (ZeRO stage 1)");
    add_number(c, "--fixed-split", train.fixed_split,
               "Compute every step as S pieces of --batch (a power of two) summed in one fixed order: the same "
               "bits on any process count dividing S (each process takes S/N pieces; 0: off)");
    c.add_option("--comm-timeout", train.comm_timeout,
                 "Under mpirun: seconds a process may wait for the others (a lost link, a host gone) before it "
                 "stops the run, naming the step and who went silent; must outlast rank 0's checkpoint and "
                 "evaluation");
  }

  // ---- sample
  SampleOptions sample;
  std::string sample_prompt;
  CLI::App* sample_cmd = app.add_subcommand("sample", "Generate text from a checkpoint (with a key/value cache)");
  sample_cmd->add_option("--ckpt", sample.ckpt, "Checkpoint file")->required();
  CLI::Option* prompt_opt = sample_cmd->add_option(
      "--prompt", sample_prompt, "Text to continue (default: a held-out problem for tasks, the text's first character)");
  std::int64_t sample_tokens = 200;
  CLI::Option* tokens_opt =
      add_number(*sample_cmd, "--tokens", sample_tokens, "Tokens to generate (tasks: the answer's length unless given)");
  sample_cmd->add_option("--temperature", sample.temperature, "Softmax temperature (0: greedy)");
  add_number(*sample_cmd, "--top-k", sample.top_k, "Sample among the k likeliest tokens (0: all)");
  add_number(*sample_cmd, "--seed", sample.seed, "Sampling seed");
  add_number(*sample_cmd, "--threads", sample.threads, "CPU threads (0: every core)");
  sample_cmd->add_option("--device", sample.device, "cpu or cuda");
  sample_cmd->add_option("--dtype", sample.dtype, "float32 or bfloat16 (default: the checkpoint's)");
  bool no_cache = false;
  sample_cmd->add_flag("--no-cache", no_cache, "Recompute the whole context for every token (slower; same tokens)");

  // ---- eval
  EvalOptions eval;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Held-out loss over the whole held-out set and, for tasks, exact-match accuracy of a checkpoint");
  eval_cmd->add_option("--ckpt", eval.ckpt, "Checkpoint file")->required();
  eval_cmd->add_option("--data", eval.data, "Text runs: evaluate on this file instead of the one trained on");
  std::int64_t eval_max_batches = 0;
  CLI::Option* max_batches_opt = add_number(
      *eval_cmd, "--max-batches", eval_max_batches,
      "Read only the first N batches of the held-out set (default: all of it, every window of a text's validation "
      "split)")
      ->default_str("all");
  add_number(*eval_cmd, "--threads", eval.threads, "CPU threads (0: every core)");
  eval_cmd->add_option("--device", eval.device, "cpu or cuda");
  eval_cmd->add_option("--dtype", eval.dtype, "float32 or bfloat16 (default: the checkpoint's)");

  // ---- attention
  AttentionPlotOptions attention;
  CLI::App* attention_cmd =
      app.add_subcommand("attention", "Draw every head's attention weights for a text as an SVG heat map");
  attention_cmd->add_option("--ckpt", attention.ckpt, "Checkpoint file")->required();
  attention_cmd->add_option("--text", attention.text, "Text to attend over (at most the block size)")->required();
  attention_cmd->add_option("--out", attention.out, "SVG file to write");
  add_number(*attention_cmd, "--threads", attention.threads, "CPU threads (0: every core)");

  const auto error_line = [&](std::string message) {
    // One line, whatever the message quotes (a file's contents may hold newlines).
    std::replace(message.begin(), message.end(), '\n', ' ');
    std::replace(message.begin(), message.end(), '\r', ' ');
    std::fprintf(err, "attograd: error: %s\n", message.c_str());
    std::fflush(err);
  };

  // Output lost to a full disk or a closed file must not pass for success.
  const auto output_status = [&] {
    if (std::fflush(out) == 0 && !std::ferror(out)) return 0;
    error_line(fmt::format("[stdout] cannot write the output: {}", std::strerror(errno)));
    return 1;
  };

  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes a reversed vector
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every process parses the same command line: rank 0 speaks for all.
    const bool speaks = distributed::launcher_speaks();
    if (e.get_exit_code() == 0) {  // --help, --version
      std::ostringstream os, es;
      app.exit(e, os, es);
      if (speaks) std::fputs(os.str().c_str(), out);
      return output_status();
    }
    if (speaks) error_line(std::string(e.what()) + " (see --help)");
    return 2;
  }

  try {
    // An empty path ("--resume $UNSET") would read as "not given": a new run, say.
    for (const CLI::App* sub : app.get_subcommands())
      for (const char* name : {"--data", "--out", "--resume", "--ckpt"})
        if (const CLI::Option* opt = sub->get_option_no_throw(name); opt && opt->count() > 0)
          AG_CHECK(!opt->results().front().empty(), name, "is empty: it needs a path");
    if (train_cmd->parsed()) {
      if (!train.resume.empty()) {
        for (const PresetFlag& f : presets)
          AG_CHECK(!f.fixed_on_resume || f.option->count() == 0 || f.option->get_name() == "--steps", "--resume",
                   "{} cannot be changed when resuming: the checkpoint's config is used", f.option->get_name());
        // --data may name the run's own text again, at another path (checked by its fingerprint).
        AG_CHECK(train_cmd->get_option("--task")->count() == 0, "--resume",
                 "--task cannot be changed when resuming: the checkpoint's config is used");
        if (train_cmd->get_option("--steps")->count() == 0) train.steps = 0;  // 0: the checkpoint's
        if (train_cmd->get_option("--eval-interval")->count() == 0) train.eval_interval = 0;
      } else {
        AG_CHECK(train.data.empty() || train_cmd->get_option("--task")->count() == 0, "--task",
                 "cannot be combined with --data (text is its own task)");
        const TrainOptions preset = preset_for(train, train_cmd->get_option("--task-size")->count() > 0);
        for (const PresetFlag& f : presets)
          if (f.option->count() == 0) f.take(preset);
        // A flag that does nothing in this run is refused, not ignored: the run would seem to have used it.
        const auto given = [&](const char* name) { return train_cmd->get_option(name)->count() > 0; };
        for (const char* name : {"--task-size", "--heldout"})
          AG_CHECK(train.data.empty() || !given(name), name, "applies to the tasks, not to --data");
        for (const char* name : {"--beta1", "--beta2"})
          AG_CHECK(train.optimizer != "sgd" || !given(name), name, "applies to AdamW, not to --optimizer sgd");
        AG_CHECK(train.optimizer != "adamw" || !given("--momentum"), "--momentum",
                 "applies to SGD, not to --optimizer adamw");
      }
      const TrainSummary summary = train_command(train, out);
      if (summary.stop_signal != 0 && summary.rank == 0) {
        // Where the run stands, on stderr too: a job log keeps it apart from the progress lines.
        std::fprintf(err, "attograd: stopped by %s after step %lld; checkpoint saved: continue with --resume %s\n",
                     signal_name(summary.stop_signal), static_cast<long long>(summary.steps_done),
                     summary.checkpoint.c_str());
        std::fflush(err);
      }
      if (summary.stop_signal != 0) return 128 + summary.stop_signal;  // as a shell reports it: 130 for SIGINT, 143 for SIGTERM
    } else if (sample_cmd->parsed()) {
      if (prompt_opt->count() > 0) sample.prompt = sample_prompt;
      if (tokens_opt->count() > 0) sample.tokens = sample_tokens;
      sample.use_cache = !no_cache;
      sample_command(sample, out);
    } else if (eval_cmd->parsed()) {
      if (max_batches_opt->count() > 0) eval.max_batches = eval_max_batches;
      eval_command(eval, out, err);
    } else if (attention_cmd->parsed()) {
      attention_command(attention, out);
    } else {
      std::fputs(app.help().c_str(), out);
    }
  } catch (const distributed::SharedFailure& e) {
    if (e.report()) error_line(e.what());
    return 1;
  } catch (const Error& e) {
    error_line(e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    error_line("out of memory (try a smaller --batch, --block, --width or --layers)");
    return 1;
  } catch (const std::exception& e) {
    error_line(std::string("unexpected failure: ") + e.what());
    return 1;
  }
  return output_status();
}

}  // namespace attograd::train::cli
