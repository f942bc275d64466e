#pragma once
// Stopping a training run cleanly: while a StopSignalGuard lives, SIGINT
// (Ctrl-C), SIGTERM (kill, a job scheduler's time limit) and SIGHUP (a closed
// terminal or ssh session; not when ignored, as under nohup) only set a flag.
// The trainer checks it after each step, saves a checkpoint and returns; the
// program then exits with 128 + the signal's number (130, 143, 129), as a shell
// reports a process killed by it. A second signal kills at once.
namespace attograd::train::cli {

class StopSignalGuard {
 public:
  StopSignalGuard();   // installs the handlers and clears the flag
  ~StopSignalGuard();  // restores the previous handlers
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

  // The signal received since construction (SIGINT, SIGTERM or SIGHUP), or 0.
  static int received();
};

// "SIGINT", "SIGTERM", "SIGHUP", or "signal".
const char* signal_name(int signo);

}  // namespace attograd::train::cli
