#include "train/cli/flags.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <type_traits>

#include "base/version.h"

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

// A flag bound to options.*field, which the task's preset fills unless the user gives it.
template <typename T>
void add_preset_flag(TrainFlags& train, T TrainOptions::*field, const std::string& name, const std::string& help,
                     bool fixed_on_resume = true) {
  TrainOptions& o = train.options;
  CLI::Option* opt = add_number(*train.command, name, o.*field, help);
  train.presets.push_back(
      {opt, [&o, field](const TrainOptions& preset) { o.*field = preset.*field; }, fixed_on_resume});
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

// The train command's flags come in groups, declared in the order --help lists them.

// What the model learns: a synthetic task or a text file.
void add_train_problem_flags(TrainFlags& t) {
  CLI::App& c = *t.command;
  c.add_option("--task", t.options.task, "Synthetic task: sort, reverse, copy, add");
  add_preset_flag(t, &TrainOptions::task_size, "--task-size",
                  "Digits per sequence (sort, reverse, copy) or per operand (add); add's preset is 2");
  add_preset_flag(t, &TrainOptions::heldout, "--heldout",
                  "Held-out problems evaluated for exact match (all of them when fewer exist)");
  c.add_option("--data", t.options.data,
               "Language modelling instead of a task: a UTF-8 text file (characters), or token files: a folder of "
               "llm.c shards (*train*.bin, *val*.bin), a shard, a glob of them (quoted) or nanoGPT's train.bin (with "
               "--resume: the run's own data, where it has moved)");
  c.add_option("--data-format", t.options.data_format,
               "text, shards (llm.c's) or nanogpt (headerless uint16 .bin); auto: token files for a folder, a glob or "
               "a .bin name, else text")
      ->default_str("auto");
  c.add_option("--val-data", t.options.val_data,
               "Held-out token files (default: the folder's *val*.bin, or --data's name with \"val\" for \"train\")");
  c.add_option("--tokenizer", t.options.tokenizer,
               "Folder with GPT-2's encoder.json and vocab.bpe, for token files (tests/reference/gpt2_tokenizer.py "
               "fetch DIR)");
  add_preset_flag(t, &TrainOptions::vocab_size, "--vocab-size",
                  "Token files: without --tokenizer, their ids are below this; with it, a larger size pads the "
                  "vocabulary (50304 for GPT-2: whole tiles for the products; padded logits enter no loss and no "
                  "sample). 0: the tokenizer's size");
}

void add_train_model_flags(TrainFlags& t) {
  add_preset_flag(t, &TrainOptions::layers, "--layers", "Transformer blocks");
  add_preset_flag(t, &TrainOptions::heads, "--heads", "Attention heads per block (must divide --width)");
  add_preset_flag(t, &TrainOptions::width, "--width", "Model width (embedding size)");
  add_preset_flag(t, &TrainOptions::block, "--block",
                  "Context length in tokens (preset: one whole problem, or 64 for text)");
  add_preset_flag(t, &TrainOptions::dropout, "--dropout", "Dropout probability in training");
}

void add_train_optimization_flags(TrainFlags& t) {
  add_preset_flag(t, &TrainOptions::optimizer, "--optimizer", "adamw or sgd (with momentum)");
  add_preset_flag(t, &TrainOptions::batch, "--batch", "Sequences per step");
  add_preset_flag(t, &TrainOptions::steps, "--steps",
                  "Optimizer steps in the whole run (the schedule's length; may be raised on --resume)");
  add_preset_flag(t, &TrainOptions::lr, "--lr", "Peak learning rate");
  add_preset_flag(t, &TrainOptions::warmup, "--warmup",
                  "Linear warm-up steps, then the schedule's decay to lr * --min-lr-ratio");
  add_preset_flag(t, &TrainOptions::min_lr_ratio, "--min-lr-ratio", "Final learning rate / peak");
  add_preset_flag(t, &TrainOptions::schedule, "--schedule",
                  "After warm-up: cosine (to the last step), linear (to the last step), constant, or wsd (constant, "
                  "then linear over the last --decay-fraction of the steps)");
  add_preset_flag(t, &TrainOptions::decay_fraction, "--decay-fraction", "wsd: the fraction of the steps that decays");
  add_preset_flag(t, &TrainOptions::weight_decay, "--weight-decay",
                  "AdamW: decoupled weight decay; SGD: L2. Applied to Linear weights only: never to biases, "
                  "LayerNorm or embeddings");
  add_preset_flag(t, &TrainOptions::beta1, "--beta1", "AdamW first-moment decay");
  add_preset_flag(t, &TrainOptions::beta2, "--beta2", "AdamW second-moment decay");
  add_preset_flag(t, &TrainOptions::momentum, "--momentum", "SGD momentum");
  add_preset_flag(t, &TrainOptions::grad_clip, "--grad-clip",
                  "Clip gradients to this global L2 norm (0: no clipping)");
}

// Where and how the run happens: reproducibility, hardware, the run directory, resuming, stopping.
void add_train_run_flags(TrainFlags& t) {
  CLI::App& c = *t.command;
  add_preset_flag(t, &TrainOptions::seed, "--seed",
                  "Seeds the data, the held-out split, the initial weights and dropout");
  add_number(c, "--threads", t.options.threads, "CPU threads (0: every core); same seed and threads, same run");
  c.add_option("--device", t.options.device, "cpu or cuda");
  c.add_option("--dtype", t.options.dtype,
               "float32 or bfloat16 (products and attention in bfloat16, float32 master weights; the default is "
               "float32, or with --resume the checkpoint's)");
  add_preset_flag(t, &TrainOptions::eval_interval, "--eval-interval",
                  "Steps between evaluations and checkpoints", /*fixed_on_resume=*/false);
  c.add_option("--out", t.options.out, "Run directory (default: runs/<task>, or runs/<file name> for --data; with --resume, the checkpoint's)");
  c.add_option("--resume", t.options.resume,
               "Continue from this checkpoint: its config is used, and N + N steps give exactly the weights of 2N");
  c.add_option("--init-from", t.options.init_from,
               "Start a new run from these weights (a checkpoint, or a Hugging Face GPT-2 folder): their shape and "
               "vocabulary, with this run's data, schedule, dropout and steps (--block may crop the positions)");
  add_number(c, "--stop-at", t.options.stop_at, "Stop after this step, saving a checkpoint to --resume from (0: run to --steps)");
  c.add_flag("--quiet", t.options.quiet, "No progress line (evaluations and the summary still print)");
  c.add_flag("--keep-best", t.options.keep_best,
             "Also keep the weights of the lowest held-out loss so far, as best.safetensors (no optimizer state: for "
             "sample, eval, export and --init-from)");
  add_number(c, "--sample-interval", t.options.sample_interval,
             "Print a sample from the model every N steps (0: none): the default prompt, 64 tokens");
}

// Memory, and the processes of a run under mpirun.
void add_train_scaling_flags(TrainFlags& t) {
  CLI::App& c = *t.command;
  add_number(c, "--attention-memory", t.options.attention_memory,
             "MiB of softmax probabilities each attention layer may keep for its backward, which then need not "
             "recompute them (whole heads; -1: 64 on heads of 64 values or more and at most 8 times as long, none "
             "on others; 0: none, memory O(T) per head)");
  add_number(c, "--grad-accum", t.options.grad_accum,
             "Split each process's share of --batch into this many micro-batches (less memory, same result)");
  c.add_flag("--shard-optimizer", t.options.shard_optimizer,
             "Under mpirun: each process keeps the optimizer state of 1/N of the parameters (ZeRO stage 1)");
  add_number(c, "--fixed-split", t.options.fixed_split,
             "Compute every step as S pieces of --batch (a power of two) summed in one fixed order: the same "
             "bits on any process count dividing S (each process takes S/N pieces; 0: off)");
  c.add_option("--comm-timeout", t.options.comm_timeout,
               "Under mpirun: seconds a process may wait for the others (a lost link, a host gone) before it "
               "stops the run, naming the step and who went silent; must outlast rank 0's checkpoint and "
               "evaluation");
}

}  // namespace

void add_train_command(CLI::App& app, TrainFlags& flags) {
  flags.command = app.add_subcommand(
      "train", "Train a GPT on next-token prediction (no arguments: sort 8 digits to 99%, ~10 s)");
  flags.command->footer(kTrainEpilog);
  add_train_problem_flags(flags);
  add_train_model_flags(flags);
  add_train_optimization_flags(flags);
  add_train_run_flags(flags);
  add_train_scaling_flags(flags);
}

void add_sample_command(CLI::App& app, SampleFlags& flags) {
  flags.command = app.add_subcommand("sample", "Generate text from a checkpoint (with a key/value cache)");
  CLI::App& c = *flags.command;
  SampleOptions& o = flags.options;
  c.add_option("--ckpt", o.ckpt, "Checkpoint file, or a Hugging Face GPT-2 folder")->required();
  flags.prompt_flag = c.add_option(
      "--prompt", flags.prompt,
      "Text to continue (default: a held-out problem for tasks, the text's first character, <|endoftext|> for GPT-2 "
      "tokens)");
  flags.tokens_flag =
      add_number(c, "--tokens,--max-tokens", flags.tokens, "Tokens to generate at most (tasks: the answer's length unless given)");
  c.add_option("--temperature", o.temperature, "Softmax temperature (0: greedy)");
  add_number(c, "--top-k", o.top_k, "Sample among the k likeliest tokens (0: all)");
  c.add_option("--top-p", o.top_p, "Sample among the likeliest tokens holding this much probability (1: all)");
  add_number(c, "--num-samples", o.num_samples, "Samples from the prompt, each its own draws");
  c.add_option("--prompt-file", o.prompt_file, "Read the prompt from this file");
  c.add_flag("--no-stop", flags.no_stop, "GPT-2 models: go on past <|endoftext|> (default: a sample ends there)");
  add_number(c, "--seed", o.seed, "Sampling seed");
  add_number(c, "--threads", o.threads, "CPU threads (0: every core)");
  c.add_option("--device", o.device, "cpu or cuda");
  c.add_option("--dtype", o.dtype, "float32 or bfloat16 (default: the checkpoint's)");
  c.add_flag("--no-cache", flags.no_cache, "Recompute the whole context for every token (slower; same tokens)");
  c.add_option("--tokenizer", o.tokenizer,
               "GPT-2's tokenizer folder, where the checkpoint's has moved (or for a model trained on ids alone)");
}

void add_eval_command(CLI::App& app, EvalFlags& flags) {
  flags.command = app.add_subcommand(
      "eval", "Held-out loss over the whole held-out set and, for tasks, exact-match accuracy of a checkpoint");
  CLI::App& c = *flags.command;
  EvalOptions& o = flags.options;
  c.add_option("--ckpt", o.ckpt, "Checkpoint file, or a Hugging Face GPT-2 folder")->required();
  c.add_option("--data", o.data,
               "Evaluate on this text or these token files instead of the run's own (a Hugging Face folder has none: "
               "name them)");
  flags.max_batches_flag =
      add_number(c, "--max-batches", flags.max_batches,
                 "Read only the first N batches of the held-out set (default: all of it, every window of a text's "
                 "validation split)")
          ->default_str("all");
  add_number(c, "--threads", o.threads, "CPU threads (0: every core)");
  c.add_option("--device", o.device, "cpu or cuda");
  c.add_option("--dtype", o.dtype, "float32 or bfloat16 (default: the checkpoint's)");
}

void add_attention_command(CLI::App& app, AttentionFlags& flags) {
  flags.command =
      app.add_subcommand("attention", "Draw every head's attention weights for a text as an SVG heat map");
  CLI::App& c = *flags.command;
  AttentionPlotOptions& o = flags.options;
  c.add_option("--ckpt", o.ckpt, "Checkpoint file")->required();
  c.add_option("--text", o.text, "Text to attend over (at most the block size)")->required();
  c.add_option("--out", o.out, "SVG file to write");
  c.add_option("--tokenizer", o.tokenizer, "GPT-2's tokenizer folder, as for sample");
  add_number(c, "--threads", o.threads, "CPU threads (0: every core)");
}

void add_prepare_command(CLI::App& app, PrepareFlags& flags) {
  flags.command = app.add_subcommand(
      "prepare", "Turn text into GPT-2 token shards in llm.c's format (each file a document, after <|endoftext|>)");
  CLI::App& c = *flags.command;
  data::PrepareOptions& o = flags.options;
  c.add_option("inputs", o.inputs, "Text files, folders of them, or - for stdin")->required();
  c.add_option("--tokenizer", o.tokenizer,
               "Folder with GPT-2's encoder.json and vocab.bpe (tests/reference/gpt2_tokenizer.py fetch DIR)")
      ->required();
  c.add_option("--out", o.out, "Folder for train_NNNNNN.bin and val_NNNNNN.bin (new, or without shards)")->required();
  c.add_option("--val-fraction", o.val_fraction, "The last fraction of the tokens, held out as validation shards");
  add_number(c, "--shard-tokens", o.shard_tokens, "Tokens a shard holds at most");
  add_number(c, "--threads", flags.threads, "CPU threads (0: every core)");
}

void add_export_command(CLI::App& app, ExportFlags& flags) {
  flags.command = app.add_subcommand(
      "export", "Write a checkpoint as Hugging Face's GPT-2 (config.json, model.safetensors, the tokenizer's files)");
  CLI::App& c = *flags.command;
  ExportOptions& o = flags.options;
  c.add_option("--ckpt", o.ckpt, "Checkpoint file, or a Hugging Face GPT-2 folder")->required();
  c.add_option("--hf", o.hf, "Folder to write (transformers' GPT2LMHeadModel.from_pretrained reads it)")->required();
  c.add_option("--tokenizer", o.tokenizer, "GPT-2's tokenizer folder, where the checkpoint's has moved");
}

CommandLine::CommandLine()
    : app("attograd: a minimal reverse-mode autograd framework, training a small GPT", "attograd") {
  app.set_version_flag("--version", std::string("attograd ") + version());
  app.require_subcommand(0, 1);
  app.option_defaults()->always_capture_default();  // before the commands, which inherit it
  // In the order --help lists the commands.
  add_train_command(app, train);
  add_sample_command(app, sample);
  add_eval_command(app, eval);
  add_attention_command(app, attention);
  add_prepare_command(app, prepare);
  add_export_command(app, export_);
}

}  // namespace attograd::train::cli
