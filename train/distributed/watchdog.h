#pragma once
// A deadline on every wait for other processes (--comm-timeout). A link that
// goes down mid-run leaves MPI waiting for ever, and Open MPI's launcher too:
// it notices a daemon it cannot reach only after TCP's keepalive (300 s, then
// 9 probes 20 s apart). Past the deadline a process stops the run instead:
// one line naming the step, the operation and the processes it heard nothing
// from, then its launcher stopped (stop_local_launcher) and an exit. Every
// surviving process does the same at its own deadline, so the whole run ends
// within the timeout and a few seconds; the last checkpoint is untouched (it
// is replaced only whole, by a rename).
//
// The MPI side (mpi_communicator.cpp) waits by polling; while a wait lasts
// beyond kQuietSeconds, every waiting process sends each other one a small
// message a second on a communicator of their own, so that at the deadline it
// can tell who went silent. These parts need no MPI.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace attograd::train::distributed {

// A sensible deadline for real runs: rank 0's checkpoint and evaluation happen
// while the others wait in the next step's all-reduce, so it must outlast them.
inline constexpr double kDefaultCommTimeoutSeconds = 600;
// Waits shorter than this send and read no liveness messages: the step's own
// all-reduces never pay for them.
inline constexpr double kQuietSeconds = 1;

struct Silence {
  int rank = 0;                     // this process
  std::string host;                 // its host
  std::int64_t step = 0;            // the run's step (0: setting up)
  std::string operation;            // "the all-reduce of gradients"
  double waited = 0;                // seconds
  double timeout = 0;               // --comm-timeout
  std::vector<int> silent;          // ranks nothing was heard from in the wait
  std::vector<int> stopped;         // ranks that said they stopped the run themselves, before this one
  std::vector<std::string> hosts;   // every rank's host, by rank
  std::string signal;               // a stop signal that came before the deadline ("SIGTERM"), or ""
};

// The line a process prints when its deadline passes, e.g. "attograd: rank 0
// (h1) stopped the run at step 57: the all-reduce of gradients waited 10 s
// (--comm-timeout 10) and heard nothing from rank 1 (h2)", with "; rank 2 (h3)
// stopped the run first" where another process's deadline came sooner.
std::string silence_message(const Silence& s);

// Who was heard from lately in one long wait, timed on a clock that runs only
// while this process polls. A message is read when this process next polls, not
// when it came: after this process was descheduled for seconds (a loaded or
// slow machine), what a peer sent just before its link went down is read late,
// and timed by the wall clock it would look recent at the deadline. On the
// polling clock a gap between two polls counts as kLongestGap at most, so such
// a peer falls silent after kRecentSeconds of polling, as it would have without
// the gap. The MPI messages themselves are mpi_communicator.cpp's.
class SignsOfLife {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kRecentSeconds = 3;  // three of the messages a second
  static constexpr double kLongestGap = 0.1;   // seconds of polling a gap between polls counts as, at most

  SignsOfLife(int size, int rank);
  // A new wait: nobody heard from yet, the deadline not yet passed.
  void begin(Clock::time_point now);
  // A poll at `now`: advances the polling clock.
  void poll(Clock::time_point now);
  // A sign of life from `rank`, read at the latest poll.
  void heard(int rank);
  // `rank` said it stopped the run (its own deadline came first): it falls
  // silent from now on, and must not be blamed for it. Kept across waits.
  void stopped(int rank);
  // The ranks heard nothing from in the last kRecentSeconds of polling, those
  // that said they stopped left out.
  std::vector<int> silent() const;
  // The ranks that said they stopped the run.
  std::vector<int> stopped() const;
  // Past the deadline with every rank heard lately: whether to poll on for one
  // to fall silent, so that a link cut just before the deadline is named. Up
  // to kRecentSeconds and half a second of polling past the deadline, and no
  // more than twice kRecentSeconds of wall time.
  bool grace(Clock::time_point now, Clock::time_point deadline);

 private:
  static constexpr double kNever = -1e30;
  int rank_;
  std::vector<double> heard_;  // the polling clock when each rank was last heard from
  std::vector<bool> stopped_;  // whether each rank said it stopped the run
  double polled_ = 0;          // seconds of polling in this wait
  double polled_at_deadline_ = kNever;
  Clock::time_point last_poll_;
};

// Whether this process's parent is Open MPI's mpirun itself (the processes on
// the first host), not a daemon of it. Such a process must not wait for its
// deadline once a stop signal came in a long wait: mpirun sends it when another
// process's failure made it end the job (SIGTERM, then SIGKILL a second later),
// and if a host is unreachable mpirun would then wait for that host's daemon for
// minutes, with nobody left to stop it. So it stops the run at once.
bool child_of_mpirun();

// Ends the launcher that started this process on its machine, so that no
// daemon is left waiting for a host it cannot reach: Open MPI's mpirun takes
// two SIGINTs to stop without its daemons (the first asks it to end the job,
// which needs them), an orted one SIGTERM (it ends its processes, this one
// too). A parent that is neither (a plain shell, srun) is left alone.
void stop_local_launcher();

// Prints `line` (on mpirun's own stderr for its children: what they write to
// theirs goes through mpirun's forwarding, which its forced stop can cut short),
// stops the launcher and exits with status 1.
[[noreturn]] void stop_run_after_silence(const std::string& line);

// The same for a child of mpirun that got a stop signal in a long wait: mpirun
// is ending the job, and will end by itself unless a daemon is unreachable, so
// mpirun is stopped only if it is still there 3 s after this process exited
// (by a helper process; stopping it at once would cut short its own report,
// such as which rank died).
[[noreturn]] void stop_run_after_signal(const std::string& line);

}  // namespace attograd::train::distributed
