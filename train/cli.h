#pragma once
// The attograd command line: parses argv with CLI11, fills the options of a
// command, runs it, and turns every error into one line on stderr and a
// non-zero exit status.
#include <cstdio>
#include <string>
#include <vector>

namespace attograd {

// args excludes the program name; returns the process exit status
// (0 ok, 1 a run failed, 2 a usage error, 130 or 143 training stopped by SIGINT or SIGTERM
// after saving a checkpoint).
int run_cli(const std::vector<std::string>& args, std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace attograd
