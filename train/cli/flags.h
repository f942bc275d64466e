#pragma once
// The attograd command line: the CLI11 app and, for each command, the flags it
// declares and the options they fill. cli.cpp parses into a CommandLine, then
// applies the rules that depend on which flags were given and runs the command.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/cli/commands.h"

namespace attograd::train::cli {

// A flag whose value comes from the task's preset unless the user gives it.
struct PresetFlag {
  CLI::Option* option;
  std::function<void(const TrainOptions& preset)> take;  // copies the preset's value
  bool fixed_on_resume;  // part of the checkpoint's identity
};

struct TrainFlags {
  CLI::App* command = nullptr;
  TrainOptions options;
  std::vector<PresetFlag> presets;  // every flag a preset fills when it is not given
};

// --prompt and --tokens fill the options' optionals only when given: CLI11
// parses them into plain values here, and run_cli copies those it saw.
struct SampleFlags {
  CLI::App* command = nullptr;
  SampleOptions options;
  std::string prompt;
  CLI::Option* prompt_flag = nullptr;
  std::int64_t tokens = 200;
  CLI::Option* tokens_flag = nullptr;
  bool no_cache = false;
  bool no_stop = false;
};

// --max-batches fills options.max_batches only when given (as SampleFlags' --tokens).
struct EvalFlags {
  CLI::App* command = nullptr;
  EvalOptions options;
  std::int64_t max_batches = 0;
  CLI::Option* max_batches_flag = nullptr;
};

struct AttentionFlags {
  CLI::App* command = nullptr;
  AttentionPlotOptions options;
};

struct ExportFlags {
  CLI::App* command = nullptr;
  ExportOptions options;
};

struct PrepareFlags {
  CLI::App* command = nullptr;
  data::PrepareOptions options;
  int threads = 0;
};

// Each add_*_command declares a subcommand on `app` with its flags bound to
// the fields of `flags`, which must therefore outlive the parse in place.
void add_train_command(CLI::App& app, TrainFlags& flags);
void add_sample_command(CLI::App& app, SampleFlags& flags);
void add_eval_command(CLI::App& app, EvalFlags& flags);
void add_attention_command(CLI::App& app, AttentionFlags& flags);
void add_prepare_command(CLI::App& app, PrepareFlags& flags);
void add_export_command(CLI::App& app, ExportFlags& flags);

// The app with its commands. CLI11 keeps pointers to the fields it
// parses into, so a CommandLine is built in place and never copied or moved.
struct CommandLine {
  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  CLI::App app;
  TrainFlags train;
  SampleFlags sample;
  EvalFlags eval;
  AttentionFlags attention;
  PrepareFlags prepare;
  ExportFlags export_;  // `export` is a keyword
};

}  // namespace attograd::train::cli
