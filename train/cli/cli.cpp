#include "train/cli/cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "train/cli/commands.h"
#include "train/cli/flags.h"
#include "train/cli/signals.h"
#include "train/distributed/communicator.h"
#include "train/distributed/launcher.h"

namespace attograd::train::cli {

namespace {

// Where run_cli writes: the command's output, and its errors as one line each.
struct Streams {
  std::FILE* out;
  std::FILE* err;

  void error_line(std::string message) const {
    // One line, whatever the message quotes (a file's contents may hold newlines).
    std::replace(message.begin(), message.end(), '\n', ' ');
    std::replace(message.begin(), message.end(), '\r', ' ');
    std::fprintf(err, "attograd: error: %s\n", message.c_str());
    std::fflush(err);
  }

  // Output lost to a full disk or a closed file must not pass for success.
  int output_status() const {
    if (std::fflush(out) == 0 && !std::ferror(out)) return 0;
    error_line(fmt::format("[stdout] cannot write the output: {}", std::strerror(errno)));
    return 1;
  }
};

// Parses args into the commands' flags. Returns the exit status when parsing
// ends the program (--help and --version, or a usage error), nothing when the
// chosen command is to run.
std::optional<int> parse_command_line(CLI::App& app, const std::vector<std::string>& args, const Streams& streams) {
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes a reversed vector
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every process parses the same command line: rank 0 speaks for all.
    const bool speaks = distributed::launcher_speaks();
    if (e.get_exit_code() == 0) {  // --help, --version
      std::ostringstream os, es;
      app.exit(e, os, es);
      if (speaks) std::fputs(os.str().c_str(), streams.out);
      return streams.output_status();
    }
    if (speaks) streams.error_line(std::string(e.what()) + " (see --help)");
    return 2;
  }
  return std::nullopt;
}

// An empty path ("--resume $UNSET") would read as "not given": a new run, say.
void refuse_empty_paths(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    for (const char* name : {"--data", "--out", "--resume", "--ckpt", "--tokenizer", "--init-from", "--val-data", "--hf"})
      if (const CLI::Option* opt = sub->get_option_no_throw(name); opt && opt->count() > 0)
        AG_CHECK(!opt->results().front().empty(), name, "is empty: it needs a path");
}

bool flag_given(const TrainFlags& train, const char* name) { return train.command->get_option(name)->count() > 0; }

// A resumed run keeps the checkpoint's config: a flag that is part of it is
// refused (but --steps, which may lengthen the schedule), and --steps and
// --eval-interval not given become the checkpoint's.
void apply_resume_rules(TrainFlags& train) {
  for (const PresetFlag& f : train.presets)
    AG_CHECK(!f.fixed_on_resume || f.option->count() == 0 || f.option->get_name() == "--steps", "--resume",
             "{} cannot be changed when resuming: the checkpoint's config is used", f.option->get_name());
  // --data may name the run's own text again, at another path (checked by its fingerprint).
  for (const char* name : {"--task", "--data-format"})
    AG_CHECK(!flag_given(train, name), "--resume", "{} cannot be changed when resuming: the checkpoint's config is used",
             name);
  if (!flag_given(train, "--steps")) train.options.steps = 0;  // 0: the checkpoint's
  if (!flag_given(train, "--eval-interval")) train.options.eval_interval = 0;
}

// A new run takes the task's preset for every flag not given.
void apply_preset_rules(TrainFlags& train) {
  TrainOptions& o = train.options;
  AG_CHECK(o.data.empty() || !flag_given(train, "--task"), "--task",
           "cannot be combined with --data (text is its own task)");
  const TrainOptions preset = preset_for(o, flag_given(train, "--task-size"));
  for (const PresetFlag& f : train.presets)
    if (f.option->count() == 0) f.take(preset);
  // A flag that does nothing in this run is refused, not ignored: the run would seem to have used it.
  for (const char* name : {"--task-size", "--heldout"})
    AG_CHECK(o.data.empty() || !flag_given(train, name), name, "applies to the tasks, not to --data");
  for (const char* name : {"--data-format", "--val-data", "--tokenizer", "--vocab-size"})
    AG_CHECK(!o.data.empty() || !flag_given(train, name), name, "applies to --data, not to the tasks");
  if (!o.init_from.empty()) {
    // The model is the weights': their shape, their vocabulary, and their positions unless --block crops them.
    for (const char* name : {"--layers", "--heads", "--width", "--vocab-size"})
      AG_CHECK(!flag_given(train, name), name, "comes from the weights of --init-from, which cannot change it");
    if (!flag_given(train, "--block")) o.block = 0;
  }
  for (const char* name : {"--beta1", "--beta2"})
    AG_CHECK(o.optimizer != "sgd" || !flag_given(train, name), name, "applies to AdamW, not to --optimizer sgd");
  AG_CHECK(o.optimizer != "adamw" || !flag_given(train, "--momentum"), "--momentum",
           "applies to SGD, not to --optimizer adamw");
  AG_CHECK(o.schedule == "wsd" || !flag_given(train, "--decay-fraction"), "--decay-fraction",
           "applies to --schedule wsd, not to {}", o.schedule);
}

// Returns 0, or the exit status of a run stopped by a signal (after its checkpoint is saved).
int run_train(TrainFlags& train, const Streams& streams) {
  if (!train.options.resume.empty())
    apply_resume_rules(train);
  else
    apply_preset_rules(train);
  const TrainSummary summary = train_command(train.options, streams.out);
  if (summary.stop_signal != 0 && summary.rank == 0) {
    // Where the run stands, on stderr too: a job log keeps it apart from the progress lines.
    std::fprintf(streams.err, "attograd: stopped by %s after step %lld; checkpoint saved: continue with --resume %s\n",
                 signal_name(summary.stop_signal), static_cast<long long>(summary.steps_done),
                 summary.checkpoint.c_str());
    std::fflush(streams.err);
  }
  if (summary.stop_signal != 0) return 128 + summary.stop_signal;  // as a shell reports it: 130 for SIGINT, 143 for SIGTERM
  return 0;
}

void run_sample(SampleFlags& sample, const Streams& streams) {
  if (sample.prompt_flag->count() > 0) sample.options.prompt = sample.prompt;
  if (sample.tokens_flag->count() > 0) sample.options.tokens = sample.tokens;
  sample.options.use_cache = !sample.no_cache;
  sample.options.stop_at_end_of_text = !sample.no_stop;
  sample_command(sample.options, streams.out);
}

void run_eval(EvalFlags& eval, const Streams& streams) {
  if (eval.max_batches_flag->count() > 0) eval.options.max_batches = eval.max_batches;
  eval_command(eval.options, streams.out, streams.err);
}

// Runs the command the user chose (no command: the overall help). Returns 0,
// or the exit status of a training run stopped by a signal.
int run_chosen_command(CommandLine& command_line, const Streams& streams) {
  if (command_line.train.command->parsed()) return run_train(command_line.train, streams);
  if (command_line.sample.command->parsed())
    run_sample(command_line.sample, streams);
  else if (command_line.eval.command->parsed())
    run_eval(command_line.eval, streams);
  else if (command_line.attention.command->parsed())
    attention_command(command_line.attention.options, streams.out);
  else if (command_line.prepare.command->parsed())
    prepare_command(command_line.prepare.options, command_line.prepare.threads, streams.out, streams.err);
  else if (command_line.export_.command->parsed())
    export_command(command_line.export_.options, streams.out);
  else
    std::fputs(command_line.app.help().c_str(), streams.out);
  return 0;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::FILE* out, std::FILE* err) {
  CommandLine command_line;  // the app, each command's flags bound to the options it runs with
  const Streams streams{out, err};
  if (const std::optional<int> status = parse_command_line(command_line.app, args, streams)) return *status;

  try {
    refuse_empty_paths(command_line.app);
    if (const int stop_status = run_chosen_command(command_line, streams); stop_status != 0) return stop_status;
  } catch (const distributed::SharedFailure& e) {
    if (e.report()) streams.error_line(e.what());
    return 1;
  } catch (const Error& e) {
    streams.error_line(e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    streams.error_line("out of memory (try a smaller --batch, --block, --width or --layers)");
    return 1;
  } catch (const std::exception& e) {
    streams.error_line(std::string("unexpected failure: ") + e.what());
    return 1;
  }
  return streams.output_status();
}

}  // namespace attograd::train::cli
