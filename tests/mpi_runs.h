#pragma once
// Runs of the attograd program under mpirun, for the tests that start them
// (test_mpi.cpp on this machine, test_hosts.cpp across network namespaces):
// the launch, the default run's flags, and what a run left behind (its
// metrics, its processes).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.h"
#include "program_helpers.h"
#include "train/distributed/communicator.h"

namespace attograd::test {

// mpirun as root (CI runs as root) and beyond the core count.
// No core binding: with -np 2 or less Open MPI binds rank r to core r, and the
// mpiruns that ctest -j starts at once would all pile onto the same cores.
inline const std::vector<std::string> kMpiEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                          "OMPI_MCA_rmaps_base_oversubscribe=1",
                                          "OMPI_MCA_hwloc_base_binding_policy=none"};

inline bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((fs::path(dir) / program).c_str(), X_OK) == 0) return true;
  return false;
}

// Skips the test case, visibly, where runs under mpirun cannot happen.
#define SKIP_WITHOUT_MPI()                                                                        \
  do {                                                                                            \
    if (!train::distributed::built_with_mpi() || !on_path("mpirun")) {                                         \
      WARN("skipped: " << (train::distributed::built_with_mpi() ? "mpirun is not installed (openmpi-bin)"     \
                                                     : "this build has no MPI (ATTOGRAD_MPI)")); \
      return;                                                                                     \
    }                                                                                             \
  } while (0)

// Under AddressSanitizer (the asan-ubsan preset) the ranks keep every check
// but the leak check at exit: Open MPI leaves allocations behind in PMIx
// plugins it has unloaded by then, whose stacks LeakSanitizer cannot name, so
// they cannot be suppressed by library. Our own data-parallel code is leak-checked
// in this process (the cases above).
inline std::vector<std::string> mpi_env() {
  std::vector<std::string> env = kMpiEnv;
  if (const char* asan = std::getenv("ASAN_OPTIONS")) env.push_back(std::string("ASAN_OPTIONS=") + asan + ":detect_leaks=0");
  return env;
}

// `mpirun -np n [mpirun_options] attograd <args>`, or the program alone for n = 1.
inline std::unique_ptr<Child> start(int n, const std::vector<std::string>& args, const TempDir& tmp,
                             std::vector<std::string> env = {}, const std::vector<std::string>& mpirun_options = {}) {
  const std::vector<std::string> launch_env = mpi_env();
  env.insert(env.end(), launch_env.begin(), launch_env.end());
  if (n == 1) return std::make_unique<Child>(args, tmp.path, env);
  std::vector<std::string> mpi = {"-np", std::to_string(n)};
  mpi.insert(mpi.end(), mpirun_options.begin(), mpirun_options.end());
  mpi.push_back(kAttogradBinary);
  mpi.insert(mpi.end(), args.begin(), args.end());
  return std::make_unique<Child>(mpi, tmp.path, env, "mpirun");
}

inline void run_ok(int n, const std::vector<std::string>& args, const TempDir& tmp) {
  const auto child = start(n, args, tmp);
  const int code = child->exit_code(300s);
  // Read once it has exited: what mpirun and the ranks printed, Open MPI's start-up errors among them.
  INFO("mpirun -np " << n << " attograd " << fmt::format("{}", fmt::join(args, " ")) << "\nstdout: " << child->out()
                     << "\nstderr: " << child->err());
  REQUIRE(code == 0);
}

struct Metrics {
  std::vector<double> losses;  // per step, in order
  double accuracy = -1;        // the last evaluation's exact match
};

inline Metrics read_metrics(const std::string& path) {
  Metrics m;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (in.eof()) break;  // no newline yet: a running process is still writing this line
    const auto j = nlohmann::json::parse(line);
    if (j.at("kind") == "train") m.losses.push_back(j.at("loss").get<double>());
    if (j.at("kind") == "eval" && j.contains("accuracy")) m.accuracy = j.at("accuracy").get<double>();
  }
  return m;
}

// Step for step within the reference's losses, and the same exact match. A sum
// split across processes rounds differently (about 1e-7 relative), and training
// amplifies that: over the first 30 steps it stays below 1e-6 relative, which
// any real error in the sums (a bucket not summed, or summed twice) exceeds at
// step 2; over 100 steps it grows to 1e-5. The one-process run with --grad-accum
// 2, which communicates nothing, differs from the plain run as much (Release,
// g++ -O3, largest over 100 steps: Ice Lake 7e-6 at np 4; Zen 5 1.06e-5 at np 2
// and 9.8e-6 for that one process), so the whole run is held to 2e-5. Other
// batch sizes amplify differently (at --batch 96 that one process's difference is
// 9e-5): a case at another size passes `rtol`, twice what it measured for that
// one process there (largest_difference).
inline constexpr std::size_t kEarlySteps = 30;

// The largest relative loss difference between two runs, over their first `steps` steps.
inline double largest_difference(const Metrics& reference, const Metrics& run, std::size_t steps = SIZE_MAX) {
  double worst = 0;
  for (std::size_t i = 0; i < std::min({run.losses.size(), reference.losses.size(), steps}); ++i)
    worst = std::max(worst, std::abs(run.losses[i] - reference.losses[i]) / std::abs(reference.losses[i]));
  return worst;
}

inline void check_follows(const Metrics& reference, const Metrics& run, double rtol = 2e-5) {
  constexpr double kEarlyRtol = 1e-6;
  REQUIRE(run.losses.size() == reference.losses.size());
  const double worst = largest_difference(reference, run), worst_early = largest_difference(reference, run, kEarlySteps);
  INFO("largest relative loss difference " << worst << ", over the first " << kEarlySteps << " steps "
                                           << worst_early);
  CHECK(worst_early <= kEarlyRtol);
  CHECK(worst <= rtol);
  CHECK(run.accuracy == reference.accuracy);
}

// Two run directories that must hold one run: every loss, the last exact match
// and every byte of the checkpoint the same.
inline void require_same_run(const std::string& reference, const std::string& run) {
  const Metrics a = read_metrics(reference + "/metrics.jsonl"), b = read_metrics(run + "/metrics.jsonl");
  CHECK(b.losses == a.losses);
  CHECK(b.accuracy == a.accuracy);
  require_same_checkpoint(reference + "/ckpt.safetensors", run + "/ckpt.safetensors");
}

// The default run's length: 100 steps of the default batch (64), evaluated
// halfway and at the end on the task's 2000 held-out problems. Under the
// sanitizers 30 steps of 16 sequences, past the learning rate's warm-up, where
// the loss has halved, evaluated on 200 problems (2000 took as long as the
// training): every property the runs check (the same bits at every process
// count, a run stopped halfway and resumed at another count, training) holds
// at any length, and 16 splits as every case splits a batch (4 pieces, 4
// processes, 2 processes of 2 accumulated micro-batches).
inline constexpr int kRunSteps = kSanitized ? 30 : 100;
inline const std::string kHalfway = std::to_string(kRunSteps / 2);
inline const std::vector<std::pair<std::string, std::string>> kSanitizedRunFlags = {{"--heldout", "200"},
                                                                                     {"--batch", "16"}};

// The default task and model (sort 8 digits), kRunSteps steps, one thread per process;
// `extra` flags (each with its value, or a bare switch) add to these or replace them.
inline std::vector<std::string> default_run(const std::string& out, const std::vector<std::string>& extra = {}) {
  std::vector<std::pair<std::string, std::string>> flags = {
      {"--steps", std::to_string(kRunSteps)}, {"--eval-interval", kHalfway}, {"--threads", "1"}, {"--out", out}};
  if (kSanitized) flags.insert(flags.end(), kSanitizedRunFlags.begin(), kSanitizedRunFlags.end());
  std::vector<std::string> switches = {"--quiet"};
  for (std::size_t i = 0; i < extra.size(); ++i) {
    const bool has_value = i + 1 < extra.size() && extra[i + 1].rfind("--", 0) != 0;
    if (!has_value) {
      switches.push_back(extra[i]);
      continue;
    }
    const auto it = std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == extra[i]; });
    if (it != flags.end())
      it->second = extra[i + 1];
    else
      flags.emplace_back(extra[i], extra[i + 1]);
    ++i;
  }
  std::vector<std::string> args = {"train"};
  for (const auto& [flag, value] : flags) args.insert(args.end(), {flag, value});
  args.insert(args.end(), switches.begin(), switches.end());
  return args;
}

// The rank of a process mpirun started, from its environment.
inline int rank_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  for (std::string entry; std::getline(in, entry, '\0');)
    if (entry.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) return std::stoi(entry.substr(21));
  return -1;
}

// The attograd processes of a run, by rank.
inline std::map<int, pid_t> ranks_running(const std::string& out_dir) {
  std::map<int, pid_t> ranks;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = file_text("/proc/" + name + "/cmdline");
    if (cmdline.rfind(kAttogradBinary, 0) != 0 || cmdline.find(out_dir) == std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (const int r = rank_of(pid); r >= 0) ranks[r] = pid;
  }
  return ranks;
}

inline std::int64_t count_lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }


}  // namespace attograd::test
