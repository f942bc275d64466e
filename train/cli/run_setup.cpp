#include "train/cli/run_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/error.h"
#include "base/version.h"
#include "tensor/kernels.h"
#include "cpu/parallel.h"
#include "train/data/tasks.h"
#include "train/data/text_data.h"
#include "train/data/token_data.h"
#include "train/model/evaluate.h"
#include "train/model/gpt.h"

namespace attograd::train::cli {

TrainOptions resumed_options(const TrainOptions& o, const output::LoadedCheckpoint& resumed) {
  TrainOptions c = resumed.info.config;
  c.steps = o.steps > 0 ? o.steps : c.steps;  // the schedule may be lengthened
  c.eval_interval = o.eval_interval > 0 ? o.eval_interval : preset_for(c, true).eval_interval;
  c.threads = o.threads, c.device = o.device, c.stop_at = o.stop_at, c.quiet = o.quiet, c.resume = o.resume;
  c.keep_best = o.keep_best, c.sample_interval = o.sample_interval;
  c.grad_accum = o.grad_accum, c.shard_optimizer = o.shard_optimizer, c.fixed_split = o.fixed_split;
  if (!o.dtype.empty()) c.dtype = o.dtype;  // else the checkpoint's: the run continues as it was
  c.out = o.out.empty() ? std::filesystem::path(o.resume).parent_path().string() : o.out;
  if (!o.data.empty()) {  // the same text at another path: a project moved, say
    AG_CHECK(!c.data.empty(), "--data", "'{}' is a run of the {} task: it has no text to give again", o.resume, c.task);
    AG_CHECK(!resumed.info.data_fingerprint.empty(), "--data",
             "'{}' keeps no fingerprint of its text (it predates them), so --data cannot be given when resuming it",
             o.resume);
    c.data = o.data;
  }
  if (!o.val_data.empty()) {  // likewise for the held-out tokens
    AG_CHECK(data::reads_token_files(dataset_spec(c)), "--val-data", "'{}' is not a run on token files", o.resume);
    c.val_data = o.val_data;
  }
  c.tokenizer = o.tokenizer;
  if (c.out.empty()) c.out = ".";
  AG_CHECK(c.steps >= resumed.info.step, "--steps", "{} is before the checkpoint's step {}", c.steps,
           resumed.info.step);
  AG_CHECK(resumed.optimizer_name == c.optimizer, "--resume", "'{}' holds no {} optimizer state", c.resume,
           c.optimizer);
  return c;
}

InitialWeights initial_weights(TrainOptions& o) {
  output::LoadedCheckpoint source = output::load_checkpoint(o.init_from, "--init-from", output::CheckpointParts::weights);
  const TrainOptions& c = source.info.config;
  o.layers = c.layers, o.heads = c.heads, o.width = c.width, o.vocab_size = c.vocab_size;
  if (o.block == 0) o.block = c.block;
  AG_CHECK(o.block <= c.block, "--block", "{} is longer than the {} positions '{}' was trained with", o.block, c.block,
           o.init_from);
  InitialWeights init{source.model->state_dict(), source.info.vocabulary};
  Tensor& positions = init.state.at("wpe.weight");
  positions = contiguous(narrow(positions, 0, 0, o.block));
  if (!o.tokenizer.empty()) init.vocabulary = init.vocabulary.attached(o.tokenizer, "--tokenizer");
  return init;
}

void check_process_split(const TrainOptions& o, const distributed::Communicator& comm) {
  AG_CHECK(o.batch % (comm.size() * o.grad_accum) == 0, "--batch",
           "{} sequences do not split evenly into {} processes x --grad-accum {} micro-batches", o.batch, comm.size(),
           o.grad_accum);
  AG_CHECK(o.fixed_split == 0 || o.fixed_split % comm.size() == 0, "--fixed-split",
           "{} pieces do not split evenly over {} processes (the process count must divide it)", o.fixed_split,
           comm.size());
  AG_CHECK(!o.shard_optimizer || comm.size() > 1, "--shard-optimizer",
           "needs several processes (start the run with mpirun -np N)");
}

// A run that would not fit in this machine's memory is refused before allocating
// any of it. Per process on this machine: on the CPU the weights and gradients
// (2 floats per parameter) and the optimizer's state (AdamW 2, SGD 1; a 1/N share
// with --shard-optimizer), plus the activations backward keeps for one
// micro-batch (train/model/gpt.cpp's backward_memory); with --device cuda only the
// host copy the model is built in (1), the rest living on the GPU. --fixed-split
// adds its host sums: log2(S/N) waiting in the tree, the piece's, and the partner's.
void check_memory(const TrainOptions& o, std::int64_t vocab_size, int processes_here, int processes) {
  const double available = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (available <= 0) return;
  const bool cpu = o.device == "cpu";
  const double optimizer_floats = (o.optimizer == "sgd" ? 1.0 : 2.0) / (o.shard_optimizer ? processes : 1);
  const double tree_floats = o.fixed_split > 0 ? std::log2(static_cast<double>(o.fixed_split / processes)) + 2 : 0;
  const double floats_per_parameter = (cpu ? 2.0 + optimizer_floats : 1.0) + tree_floats;
  const double parameters = static_cast<double>(model::parameter_count(model::gpt_config(o, vocab_size)));
  const double model_bytes = parameters * floats_per_parameter * sizeof(float) * processes_here;
  constexpr double kGiB = 1 << 30;
  const std::string each = processes_here > 1 ? fmt::format(" for each of the {} processes on this machine", processes_here) : "";
  AG_CHECK(model_bytes <= available, "--width",
           "--layers {} --width {} with a vocabulary of {} make {:.3g} parameters: {:.1f} GiB of weights, gradients "
           "and optimizer state{}, more than this machine's {:.1f} GiB",
           o.layers, o.width, vocab_size, parameters, model_bytes / kGiB, each, available / kGiB);
  if (!cpu) return;
  const std::int64_t pieces = o.fixed_split > 0 ? o.fixed_split : processes * o.grad_accum;
  const model::BackwardMemory kept = model::backward_memory(o, vocab_size, o.batch / pieces);
  const double probs_bytes = kept.probs_bytes * processes_here;
  const double activation_bytes = kept.activation_bytes * processes_here + probs_bytes;
  const std::string probs_share =
      probs_bytes > 0 ? fmt::format(", {:.2f} GiB of them attention probabilities", probs_bytes / kGiB) : "";
  AG_CHECK(model_bytes + activation_bytes <= available, "--batch",
           "{} sequences of {} tokens in {} micro-batch(es) keep about {:.1f} GiB of activations for backward{}{} "
           "(and the model {:.1f} GiB), more than this machine's {:.1f} GiB: raise {} (the same run in "
           "smaller pieces) or lower --batch or --block",
           o.batch, o.block, o.fixed_split > 0 ? o.fixed_split : o.grad_accum, activation_bytes / kGiB, probs_share,
           each, model_bytes / kGiB, available / kGiB, o.fixed_split > 0 ? "--fixed-split" : "--grad-accum");
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<nn::NamedParameter> params) {
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(
        std::move(params), optim::SGDOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = o.lr,
                                                                                      .beta1 = o.beta1,
                                                                                      .beta2 = o.beta2,
                                                                                      .eps = 1e-8,
                                                                                      .weight_decay = o.weight_decay});
}

std::string run_name(const TrainOptions& o) {
  if (o.data.empty()) return o.task;
  return data::reads_token_files(dataset_spec(o)) ? data::token_data_name(o.data)
                                                  : std::filesystem::path(o.data).stem().string();
}

std::string describe_data(const TrainOptions& o, const data::Dataset& data) {
  if (const auto* text = dynamic_cast<const data::TextData*>(&data))
    return fmt::format("text '{}' ({} train / {} validation characters, vocabulary {}, unigram entropy {:.3f})", o.data,
                       text->train_tokens(), text->validation_tokens(), data.vocabulary().size(),
                       text->unigram_entropy());
  if (const auto* tokens = dynamic_cast<const data::TokenData*>(&data)) {
    const data::Vocabulary& v = data.vocabulary();
    const std::string padded = o.vocab_size > v.size() ? fmt::format(" padded to {}", o.vocab_size) : "";
    return fmt::format("tokens '{}' ({} train / {} validation tokens, {}{})", o.data,
                       model::thousands(tokens->train_tokens()), model::thousands(tokens->validation_tokens()),
                       v.kind() == data::Vocabulary::Kind::gpt2
                           ? fmt::format("GPT-2's tokenizer, vocabulary {}", v.size())
                           : fmt::format("vocabulary {} ids, no tokenizer", v.size()),
                       padded);
  }
  const auto& task = dynamic_cast<const data::Task&>(data);
  return fmt::format("task {} (size {}, e.g. {}{}; {} held out)", o.task, o.task_size, task.heldout()[0].prompt,
                     task.heldout()[0].answer, task.heldout().size());
}

// Every process of a run must be started with the same flags: the first one
// that differs from rank 0's stops them all, named. One all-gather per flag
// (a few dozen at start-up); the version goes first, so processes of different
// builds, whose flag lists could differ, never reach mismatched collectives.
void check_same_flags(const TrainOptions& o, distributed::Communicator& comm) {
  if (comm.size() == 1) return;
  const auto differs = [&](const std::vector<std::string>& values) {
    for (std::size_t r = 1; r < values.size(); ++r)
      if (values[r] != values[0]) return static_cast<int>(r);
    return 0;
  };
  if (const int r = differs(comm.all_gather(version())))
    distributed::fail_on_every_process(comm, fmt::format("[mpirun] rank {} runs another attograd version than rank 0", r));
  for (const auto& [flag, value] : flag_values(o)) {
    const std::vector<std::string> values = comm.all_gather(value);
    if (const int r = differs(values))
      distributed::fail_on_every_process(
          comm, fmt::format("[{}] differs between the processes of this run: rank {} has '{}', rank 0 '{}' "
                            "(start every process with the same flags)",
                            flag, r, values[static_cast<std::size_t>(r)], values[0]));
  }
}

// Threads per process when none are asked for: the machine's cores shared by
// the processes on it (two processes on two cores each take one).
int default_threads(const distributed::Communicator& comm) {
  return std::max(1, get_num_threads() / std::max(1, comm.local_size()));
}

// A test-only hook (tests/test_mpi.cpp): ATTOGRAD_TEST_DRIFT_RANK=r makes rank r
// nudge one weight, as a flipped bit would, so the next evaluation's parameter
// checksums must catch it.
void drift_for_tests(const distributed::Communicator& comm, const std::vector<nn::NamedParameter>& params) {
  const char* rank = std::getenv("ATTOGRAD_TEST_DRIFT_RANK");
  if (!rank || std::atoi(rank) != comm.rank() || comm.size() == 1) return;
  NoGradGuard no_grad;
  const Tensor& w = params.front().tensor;
  kernels::copy_(narrow(flatten(w), 0, 0, 1), narrow(flatten(w), 0, 0, 1) + 1e-3);
}

// A test-only hook (tests/test_mpi.cpp): ATTOGRAD_TEST_FAIL_RANK=r makes rank r
// fail after set-up and before the first step, as running out of GPU memory for
// the gradient buckets on one rank would.
void fail_for_tests(const distributed::Communicator& comm) {
  const char* rank = std::getenv("ATTOGRAD_TEST_FAIL_RANK");
  AG_CHECK(!rank || std::atoi(rank) != comm.rank() || comm.size() == 1, "train", "test failure on rank {}",
           comm.rank());
}

}  // namespace attograd::train::cli
