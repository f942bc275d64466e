#include "train/distributed/watchdog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

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
  std::vector<std::string> silent;
  for (const int r : s.silent) silent.push_back(rank_and_host(r, s.hosts));
  const std::string who = silent.empty() ? "every process answered, yet the operation did not complete"
                                         : fmt::format("heard nothing from {}", fmt::join(silent, ", "));
  const std::string when = s.step > 0 ? fmt::format("at step {}", s.step) : "while setting up";
  return fmt::format("attograd: error: {} stopped the run {}: {} waited {:.0f} s (--comm-timeout {:g}) and {}",
                     rank_and_host(s.rank, s.hosts), when, s.operation, s.waited, s.timeout, who);
}

void stop_local_launcher() {
  const pid_t parent = ::getppid();
  const std::string name = process_name(parent);
  if (name == "orted") {
    ::kill(parent, SIGTERM);
  } else if (name == "mpirun" || name == "mpiexec" || name == "orterun") {
    // Give it a moment to pass on this process's last line first.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(parent, SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(parent, SIGINT);
  }
}

void stop_run_after_silence(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  stop_local_launcher();
  std::_Exit(1);
}

}  // namespace attograd::train::distributed
