#pragma once
// Child processes for the tests that need real ones (signals, kill -9, mpirun):
// the built attograd program, or another program, started with posix_spawn,
// signalled and waited for; and a bitwise comparison of two checkpoints.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "build_paths.h"
#include "program_helpers.h"
#include "train/output/safetensors.h"

extern char** environ;

namespace attograd::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The attograd binary (or `program`, such as mpirun) as a child process, its
// stdout and stderr in files.
class Child {
 public:
  Child(const std::vector<std::string>& args, const fs::path& log_dir, const std::vector<std::string>& extra_env = {},
        const std::string& program = kAttogradBinary)
      : out_((log_dir / ("child" + std::to_string(counter_) + ".out")).string()),
        err_((log_dir / ("child" + std::to_string(counter_) + ".err")).string()) {
    ++counter_;
    program_ = program;
    std::vector<std::string> argv_s = {program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    // extra_env replaces the inherited variables of the same names: a duplicate
    // name reads as the first to getenv() but as the last to a shell (dash), so a
    // command run through `sh -c` would see the inherited value.
    std::vector<std::string> env_s(extra_env);
    const auto overridden = [&](std::string_view entry) {
      const std::string_view name = entry.substr(0, entry.find('='));
      return std::any_of(extra_env.begin(), extra_env.end(), [&](const std::string& e) {
        return std::string_view(e).substr(0, e.find('=')) == name;
      });
    };
    for (char** e = environ; *e; ++e)
      if (!overridden(*e)) env_s.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, STDERR_FILENO, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // The child starts with default signal dispositions, whatever the test runner's are.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults, none;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGHUP);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    const int rc = ::posix_spawnp(&pid_, program.c_str(), &files, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
    REQUIRE(rc == 0);
  }
  ~Child() {
    if (pid_ > 0) {  // a failed test: never leave a process behind
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void signal(int signo) const { REQUIRE(::kill(pid_, signo) == 0); }

  // Waits for the exit (at most `timeout`); the raw wait status.
  int wait(std::chrono::seconds timeout = 120s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        // SIGTERM first: mpirun passes it on to its ranks, which a SIGKILL of mpirun
        // alone would leave running, holding the cores (or the GPU) for later tests.
        ::kill(pid_, SIGTERM);
        const auto grace = std::chrono::steady_clock::now() + 10s;
        bool reaped = false;
        while (!(reaped = ::waitpid(pid_, &status, WNOHANG) != 0) && std::chrono::steady_clock::now() < grace)
          std::this_thread::sleep_for(5ms);
        if (!reaped) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, &status, 0);
        }
        pid_ = -1;
        FAIL("the child " << program_ << " did not exit in time; stderr: " << err());
      }
      std::this_thread::sleep_for(5ms);
    }
    pid_ = -1;
    return status;
  }
  int exit_code(std::chrono::seconds timeout = 120s) {
    const int status = wait(timeout);
    INFO("stderr: " << err());
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  }
  std::string out() const { return file_text(out_); }
  std::string err() const { return file_text(err_); }

 private:
  static inline int counter_ = 0;
  std::string program_ = std::string(kAttogradBinary);
  pid_t pid_ = -1;
  std::string out_, err_;
};

// Polls `ready` every few milliseconds until it holds (false after `timeout`).
template <typename F>
bool wait_until(F ready, std::chrono::seconds timeout = 120s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Every tensor (parameters and optimizer state) bit for bit, and the RNG state.
inline void require_same_checkpoint(const std::string& a_path, const std::string& b_path) {
  const train::output::Safetensors a = train::output::load_safetensors(a_path), b = train::output::load_safetensors(b_path);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    INFO(name);
    REQUIRE(b.tensors.count(name) == 1);
    const Tensor& u = b.tensors.at(name);
    REQUIRE(t.sizes() == u.sizes());
    CHECK(std::memcmp(t.raw_data(), u.raw_data(), t.numel() * dtype_size(t.dtype())) == 0);
  }
  CHECK(a.metadata.at("step") == b.metadata.at("step"));
  CHECK(a.metadata.at("rng") == b.metadata.at("rng"));
  CHECK(a.metadata.at("optimizer") == b.metadata.at("optimizer"));
}

}  // namespace attograd::test
