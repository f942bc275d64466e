#include "train/distributed/watchdog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace attograd::train::distributed {
namespace {

std::string rank_and_host(int rank, const std::vector<std::string>& hosts) {
  if (rank >= 0 && static_cast<std::size_t>(rank) < hosts.size() && !hosts[static_cast<std::size_t>(rank)].empty())
    return fmt::format("rank {} ({})", rank, hosts[static_cast<std::size_t>(rank)]);
  return fmt::format("rank {}", rank);
}

// The name of process `pid` (its /proc comm), or "" when it cannot be read.
std::string process_name(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

std::string silence_message(const Silence& s) {
  std::vector<std::string> silent, stopped;
  for (const int r : s.silent) silent.push_back(rank_and_host(r, s.hosts));
  for (const int r : s.stopped) stopped.push_back(rank_and_host(r, s.hosts));
  std::string who = silent.empty() ? "every process answered, yet the operation did not complete"
                                   : fmt::format("heard nothing from {}", fmt::join(silent, ", "));
  if (!stopped.empty()) who += fmt::format("; {} stopped the run first", fmt::join(stopped, ", "));
  const std::string when = s.step > 0 ? fmt::format("at step {}", s.step) : "while setting up";
  const std::string why = !s.signal.empty() ? fmt::format("{} from mpirun before --comm-timeout {:g}", s.signal, s.timeout)
                                   : fmt::format("--comm-timeout {:g}", s.timeout);
  return fmt::format("attograd: error: {} stopped the run {}: {} waited {:.0f} s ({}) and {}",
                     rank_and_host(s.rank, s.hosts), when, s.operation, s.waited, why, who);
}

SignsOfLife::SignsOfLife(int size, int rank)
    : rank_(rank), heard_(static_cast<std::size_t>(size), kNever), stopped_(static_cast<std::size_t>(size), false) {}

void SignsOfLife::begin(Clock::time_point now) {
  std::fill(heard_.begin(), heard_.end(), kNever);
  polled_ = 0;
  polled_at_deadline_ = kNever;
  last_poll_ = now;
}

void SignsOfLife::poll(Clock::time_point now) {
  polled_ += std::min(std::chrono::duration<double>(now - last_poll_).count(), kLongestGap);
  last_poll_ = now;
}

void SignsOfLife::heard(int rank) {
  if (rank >= 0 && static_cast<std::size_t>(rank) < heard_.size()) heard_[static_cast<std::size_t>(rank)] = polled_;
}

void SignsOfLife::stopped(int rank) {
  if (rank >= 0 && static_cast<std::size_t>(rank) < stopped_.size()) stopped_[static_cast<std::size_t>(rank)] = true;
}

std::vector<int> SignsOfLife::silent() const {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(heard_.size()); ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (r != rank_ && !stopped_[i] && polled_ - heard_[i] > kRecentSeconds) ranks.push_back(r);
  }
  return ranks;
}

std::vector<int> SignsOfLife::stopped() const {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(stopped_.size()); ++r)
    if (stopped_[static_cast<std::size_t>(r)]) ranks.push_back(r);
  return ranks;
}

bool SignsOfLife::grace(Clock::time_point now, Clock::time_point deadline) {
  if (polled_at_deadline_ == kNever) polled_at_deadline_ = polled_;
  const bool polling_left = polled_ - polled_at_deadline_ < kRecentSeconds + 0.5;
  const bool wall_left = now < deadline + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(2 * kRecentSeconds));
  return polling_left && wall_left && silent().empty();
}

bool child_of_mpirun() {
  const std::string name = process_name(::getppid());
  return name == "mpirun" || name == "mpiexec" || name == "orterun";
}

namespace {

// A pidfd for process `pid`, so that no later process that reuses the number is
// signalled, or -1. Through syscall(): glibc 2.36's <sys/pidfd.h> declares the
// pidfd calls without C linkage.
int open_pidfd(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Whether the process behind `pidfd` ends within `ms` milliseconds.
bool gone_within(int pidfd, int ms) {
  pollfd gone{pidfd, POLLIN, 0};
  return ::poll(&gone, 1, ms) > 0;
}

// SIGINTs to mpirun until it has gone: a SIGINT that finds its abort already
// under way only prints "hit ctrl-c again". Up to three, 300 ms apart.
void interrupt_mpirun(pid_t pid, int pidfd) {
  for (int i = 0; i < 3; ++i) {
    if (pidfd >= 0 ? ::syscall(SYS_pidfd_send_signal, pidfd, SIGINT, nullptr, 0) != 0 : ::kill(pid, SIGINT) != 0)
      return;
    if (pidfd >= 0 ? gone_within(pidfd, 300) : (std::this_thread::sleep_for(std::chrono::milliseconds(300)), false))
      return;
  }
}

}  // namespace

void stop_local_launcher() {
  const pid_t parent = ::getppid();
  if (process_name(parent) == "orted") {
    ::kill(parent, SIGTERM);
  } else if (child_of_mpirun()) {
    const int pidfd = open_pidfd(parent);
    interrupt_mpirun(parent, pidfd);
    if (pidfd >= 0) ::close(pidfd);
  }
}

// mpirun's own stderr, shared (the same open file, so the same offset in a log
// file, which a fresh open of /proc/PID/fd/2 would write over), or -1 where
// this process may not take it (pidfd_getfd needs the right to trace mpirun).
int mpirun_stderr() {
  if (!child_of_mpirun()) return -1;
  const int pidfd = open_pidfd(::getppid());
  if (pidfd < 0) return -1;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, 2, 0));
  ::close(pidfd);
  return fd;
}

namespace {

void print_last_line(const std::string& line) {
  std::fflush(stdout);
  const std::string text = line + "\n";
  const int fd = mpirun_stderr();
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    // mpirun passes it on from a pipe: give it a moment before stopping it.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  if (fd >= 0) ::close(fd);
}

}  // namespace

void stop_run_after_silence(const std::string& line) {
  print_last_line(line);
  stop_local_launcher();
  std::_Exit(1);
}

void stop_run_after_signal(const std::string& line) {
  print_last_line(line);
  // A helper outlives this process (its own session: mpirun kills this one's
  // group) and stops mpirun only if it has not ended by itself 3 s later.
  const pid_t parent = ::getppid();
  if (::fork() == 0) {
    ::setsid();
    const int pidfd = open_pidfd(parent);
    if (pidfd >= 0 && !gone_within(pidfd, 3000)) interrupt_mpirun(parent, pidfd);
    std::_Exit(0);
  }
  std::_Exit(1);
}

}  // namespace attograd::train::distributed
