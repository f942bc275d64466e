#pragma once
// What `attograd train` (train/cli/trainer.cpp) checks and builds before its
// first step: the options a resumed run continues with, whether they split
// over the processes and fit in memory, the same flags on every process, the
// optimizer; and the two test-only hooks of the step loop.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nn/module.h"
#include "train/data/dataset.h"
#include "train/distributed/communicator.h"
#include "train/optim/optimizer.h"
#include "train/options.h"
#include "train/output/checkpoint.h"

namespace attograd::train::cli {

// The options a resumed run continues with: the checkpoint's data, model and
// optimisation, with the run's own settings (threads, device, output, when to
// stop, the data-parallel split) and a longer schedule (--steps) as `given`;
// --data only names where the same text has moved.
TrainOptions resumed_options(const TrainOptions& given, const output::LoadedCheckpoint& resumed);

// What --init-from starts a new run from: the weights (positions cropped to the
// run's block) and the vocabulary the data must be read with. Sets the
// options' model shape from them: layers, heads, width, and block when it is 0
// (not given); a longer block than the weights' is refused.
struct InitialWeights {
  nn::StateDict state;
  data::Vocabulary vocabulary;
};
InitialWeights initial_weights(TrainOptions& options);

// --batch, --fixed-split and --shard-optimizer against the process count.
void check_process_split(const TrainOptions& o, const distributed::Communicator& comm);

// Refuses, naming the flag to change, a run that would not fit in this
// machine's memory, before allocating any of it.
void check_memory(const TrainOptions& o, std::int64_t vocab_size, int processes_here, int processes);

// Every process of a run must be started with the same flags: the first one
// that differs from rank 0's stops them all, named.
void check_same_flags(const TrainOptions& o, distributed::Communicator& comm);

// Threads per process when none are asked for: the machine's cores shared by
// the processes on it.
int default_threads(const distributed::Communicator& comm);

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<nn::NamedParameter> params);

// The name of the run's default directory, runs/<name>: the task, or the data's name.
std::string run_name(const TrainOptions& o);
// The first line of a run: "task sort (size 8, e.g. ...)", "text 'f' (...)" or "tokens 'd' (...)".
std::string describe_data(const TrainOptions& o, const data::Dataset& data);

// Runs `setup` on every process. A failure on any of them stops all of them at
// this point (none is left waiting in a collective), reported once, by rank 0,
// naming the rank it happened on when that is not rank 0.
template <typename F>
void on_every_process(distributed::Communicator& comm, F&& setup) {
  if (comm.size() == 1) {
    setup();
    return;
  }
  std::string error;
  try {
    setup();
  } catch (const std::bad_alloc&) {
    error = "out of memory (try a smaller --batch, --block, --width or --layers)";
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::vector<std::string> errors = comm.all_gather(error);
  for (int r = 0; r < comm.size(); ++r)
    if (const std::string& e = errors[static_cast<std::size_t>(r)]; !e.empty())
      distributed::fail_on_every_process(comm, r == 0 ? e : fmt::format("{} (on rank {} of {})", e, r, comm.size()));
}

// Test-only hooks (tests/test_mpi.cpp), each a no-op unless its variable names this rank.
void drift_for_tests(const distributed::Communicator& comm, const std::vector<nn::NamedParameter>& params);
void fail_for_tests(const distributed::Communicator& comm);

}  // namespace attograd::train::cli
