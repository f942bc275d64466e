#include "train/signals.h"

#include <atomic>
#include <csignal>

namespace attograd {

namespace {

// Written by the handler, read by the training loop: a lock-free atomic is
// async-signal-safe. The previous handlers are restored when the guard ends.
std::atomic<int> received_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction previous_int {}, previous_term {};

extern "C" void on_stop_signal(int signo) {
  received_signal = signo;
  // The next SIGINT or SIGTERM takes the default action: a second Ctrl-C kills.
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  received_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &previous_int);
  ::sigaction(SIGTERM, &action, &previous_term);
}

StopSignalGuard::~StopSignalGuard() {
  ::sigaction(SIGINT, &previous_int, nullptr);
  ::sigaction(SIGTERM, &previous_term, nullptr);
}

int StopSignalGuard::received() { return received_signal.load(); }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
  }
}

}  // namespace attograd
