#pragma once
// train/cli/: the attograd program (namespace attograd::train::cli), built
// from the other rooms of train/.
//   cli.h (here)  run_cli: parses argv with CLI11, fills the options of a
//                 command, runs it, and turns every error into one line on
//                 stderr and a non-zero exit status (main.cpp calls it)
//   flags.h       the CLI11 app: one function per command declares its flags
//                 and binds them to the options that command runs with
//   commands.h    the four commands, train, sample, eval and attention, as
//                 functions the command line and the tests call alike
//                 (train_command: trainer.cpp, its set-up run_setup.h)
//   progress.h    the live progress line: redrawn on a terminal, plain lines in a file
//   signals.h     SIGINT, SIGTERM and SIGHUP finish the step and save a checkpoint
#include <cstdio>
#include <string>
#include <vector>

#include "train/cli/commands.h"
#include "train/cli/progress.h"
#include "train/cli/signals.h"

namespace attograd::train::cli {

// args excludes the program name; returns the process exit status
// (0 ok, 1 a run failed, 2 a usage error, 130 or 143 training stopped by SIGINT or SIGTERM
// after saving a checkpoint).
int run_cli(const std::vector<std::string>& args, std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace attograd::train::cli
