#pragma once
// The live progress line of a training run:
//   step 1200/3000  loss 0.4121  lr 2.1e-03  41.3k tok/s  ETA 0:14
// On a terminal it is redrawn in place (at most ten times a second); when
// stdout is a file or a pipe it degrades to a plain line every ~5% of the run.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace attograd::train::cli {

// Whether `out` is a person's terminal, so progress lines are redrawn in
// place. Under mpirun a rank's output is a pseudo-terminal mpirun opened
// whatever mpirun's own output is, so there it is a terminal only when
// mpirun's (the parent's) same descriptor is one too: `mpirun ... > log`
// then gets plain lines, as a single process writing to a file does.
bool is_interactive(std::FILE* out);

struct ProgressOptions {
  bool interactive = false;  // redraw one line in place (a terminal)
  bool quiet = false;        // print nothing but message()s
};

class Progress {
 public:
  // The run goes from `first_step` (0, or where a resumed run starts) to `total_steps`.
  Progress(std::FILE* out, std::int64_t first_step, std::int64_t total_steps, ProgressOptions options);
  // After step `step` (1-based) with this raw loss.
  void update(std::int64_t step, double loss, double lr, double tokens_per_s);
  // Shown after the rate from the next update on, e.g. a data-parallel run's
  // "comm 12%  optimizer 1.2 MB/process".
  void set_detail(std::string detail) { detail_ = std::move(detail); }
  // A line of its own (evaluations, notes), printed above the live line.
  void message(const std::string& line);
  void finish();
  double smoothed_loss() const { return smoothed_; }

 private:
  std::string line(std::int64_t step, double lr, double tokens_per_s) const;
  void clear_live_line();
  std::FILE* out_;
  std::int64_t first_step_, total_steps_;
  ProgressOptions options_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  double raw_average_ = 0, smoothed_ = 0;
  std::int64_t seen_ = 0;
  bool live_line_shown_ = false;
  std::string detail_;
};

// The progress line of a long pass over a known number of items, such as
// `attograd eval` reading a large validation split:
//   eval: 1,500/4,120 sequences (36%)  ETA 0:03
// A short pass prints nothing: the line appears once `delay_s` have gone by.
// Then it is redrawn in place on a terminal (at most ten times a second), or
// printed as a plain line at every further tenth of the pass otherwise.
struct CountProgressOptions {
  bool interactive = false;  // redraw one line in place (a terminal)
  double delay_s = 2.0;      // silent for this long
};

class CountProgress {
 public:
  // `out` null: print nothing. `what` names the pass and its items: "eval", "sequences".
  CountProgress(std::FILE* out, std::string what, std::string items, CountProgressOptions options);
  void update(std::int64_t done, std::int64_t total);
  void finish();  // removes a live line, so what follows starts a clean line

 private:
  std::FILE* out_;
  std::string what_, items_;
  CountProgressOptions options_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::int64_t last_tenth_ = 0;
  bool live_line_shown_ = false;
};

}  // namespace attograd::train::cli
