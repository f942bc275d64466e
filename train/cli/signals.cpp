#include "train/cli/signals.h"

#include <atomic>
#include <csignal>
#include <iterator>

namespace attograd::train::cli {

namespace {

// Written by the handler, read by the training loop: a lock-free atomic is
// async-signal-safe. The previous handlers are restored when the guard ends.
std::atomic<int> received_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
// SIGHUP too: a dropped ssh session sends it to a run in its terminal.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction previous[std::size(kStopSignals)] {};
bool installed[std::size(kStopSignals)] = {};  // written before the handlers are, read by them

extern "C" void on_stop_signal(int signo) {
  received_signal = signo;
  // The next signal takes the default action: a second Ctrl-C kills. One left
  // ignored (SIGHUP under nohup) stays ignored.
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i)
    if (installed[i]) std::signal(kStopSignals[i], SIG_DFL);
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  received_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
    ::sigaction(kStopSignals[i], nullptr, &previous[i]);
    // nohup ignores SIGHUP, and then it stays ignored. SIGINT is caught even where
    // ignored: a shell script ignores it in the jobs it starts with &, and `kill -INT`
    // must still stop them cleanly.
    installed[i] = kStopSignals[i] != SIGHUP || previous[i].sa_handler != SIG_IGN;
    if (installed[i]) ::sigaction(kStopSignals[i], &action, nullptr);
  }
}

StopSignalGuard::~StopSignalGuard() {
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &previous[i], nullptr);
}

int StopSignalGuard::received() { return received_signal.load(); }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
  }
}

}  // namespace attograd::train::cli
