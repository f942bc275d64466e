// `attograd train`: options -> data, model, optimizer -> the training loop,
// with periodic evaluation, checkpoints, metrics.jsonl and loss.svg.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/error.h"
#include "cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"
#include "train/checkpoint.h"
#include "train/commands.h"
#include "train/communicator.h"
#include "train/data_parallel.h"
#include "train/evaluate.h"
#include "train/fixed_split.h"
#include "train/grad_clip.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/progress.h"
#include "train/run_directory.h"
#include "train/safetensors.h"
#include "train/schedule.h"
#include "train/sharded_optimizer.h"
#include "train/signals.h"
#include "train/step.h"
#include "train/svg.h"
#include "train/tasks.h"
#include "train/text_data.h"
#include "train/version.h"

namespace attograd {

namespace fs = std::filesystem;

namespace {

// A text run's evaluations read the first this many windows of the validation
// split, not all of it: a 25 MB file holds about 39,000 windows of 64 characters,
// and reading them all at every --eval-interval could cost more than the steps
// between two evaluations.
// The eval line says so; `attograd eval` reads the whole split. A task's
// held-out set is --heldout problems (2000 by default), always read whole.
constexpr std::int64_t kTrainEvalWindows = 256;

// A run that would not fit in this machine's memory is refused before allocating
// any of it. Per process on this machine: on the CPU the weights and gradients
// (2 floats per parameter) and the optimizer's state (AdamW 2, SGD 1; a 1/N share
// with --shard-optimizer), plus the activations backward keeps for one
// micro-batch (train/model.cpp's backward_memory); with --device cuda only the
// host copy the model is built in (1), the rest living on the GPU. --fixed-split
// adds its host sums: log2(S/N) waiting in the tree, the piece's, and the partner's.
void check_memory(const TrainOptions& o, std::int64_t vocab_size, int processes_here, int processes) {
  const double available = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (available <= 0) return;
  const bool cpu = o.device == "cpu";
  const double optimizer_floats = (o.optimizer == "sgd" ? 1.0 : 2.0) / (o.shard_optimizer ? processes : 1);
  const double tree_floats = o.fixed_split > 0 ? std::log2(static_cast<double>(o.fixed_split / processes)) + 2 : 0;
  const double floats_per_parameter = (cpu ? 2.0 + optimizer_floats : 1.0) + tree_floats;
  const double parameters = static_cast<double>(parameter_count(gpt_config(o, vocab_size)));
  const double model_bytes = parameters * floats_per_parameter * sizeof(float) * processes_here;
  constexpr double kGiB = 1 << 30;
  const std::string each = processes_here > 1 ? fmt::format(" for each of the {} processes on this machine", processes_here) : "";
  AG_CHECK(model_bytes <= available, "--width",
           "--layers {} --width {} with a vocabulary of {} make {:.3g} parameters: {:.1f} GiB of weights, gradients "
           "and optimizer state{}, more than this machine's {:.1f} GiB",
           o.layers, o.width, vocab_size, parameters, model_bytes / kGiB, each, available / kGiB);
  if (!cpu) return;
  const std::int64_t pieces = o.fixed_split > 0 ? o.fixed_split : processes * o.grad_accum;
  const BackwardMemory kept = backward_memory(o, vocab_size, o.batch / pieces);
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

std::unique_ptr<train::Optimizer> make_optimizer(const TrainOptions& o, std::vector<nn::NamedParameter> params) {
  if (o.optimizer == "sgd")
    return std::make_unique<train::SGD>(
        std::move(params), train::SGDOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  return std::make_unique<train::AdamW>(std::move(params), train::AdamWOptions{.lr = o.lr,
                                                                                      .beta1 = o.beta1,
                                                                                      .beta2 = o.beta2,
                                                                                      .eps = 1e-8,
                                                                                      .weight_decay = o.weight_decay});
}

std::string describe_data(const TrainOptions& o, const Dataset& data) {
  if (!o.data.empty()) {
    const auto& text = dynamic_cast<const TextData&>(data);
    return fmt::format("text '{}' ({} train / {} validation characters, vocabulary {}, unigram entropy {:.3f})", o.data,
                       text.train_tokens(), text.validation_tokens(), data.tokenizer().size(), text.unigram_entropy());
  }
  const auto& task = dynamic_cast<const Task&>(data);
  return fmt::format("task {} (size {}, e.g. {}{}; {} held out)", o.task, o.task_size, task.heldout()[0].prompt,
                     task.heldout()[0].answer, task.heldout().size());
}

// "eval step 250: val loss 1.8412 over the first 256 of 4,120 validation windows", or, read whole,
// "eval step 100: val loss 0.0123, exact match 99.10% of 2000".
std::string eval_line(std::int64_t step, const EvalResult& r) {
  std::string line = fmt::format("eval step {}: val loss {:.4f}", step, r.loss);
  if (!r.whole()) line += fmt::format(" over the first {} validation windows", coverage(r));
  if (r.accuracy) line += fmt::format(", exact match {:.2f}% of {}", 100 * *r.accuracy, r.examples);
  return line;
}

// Every process of a run must be started with the same flags: the first one
// that differs from rank 0's stops them all, named. One all-gather per flag
// (a few dozen at start-up); the version goes first, so processes of different
// builds, whose flag lists could differ, never reach mismatched collectives.
void check_same_flags(const TrainOptions& o, train::Communicator& comm) {
  if (comm.size() == 1) return;
  const auto differs = [&](const std::vector<std::string>& values) {
    for (std::size_t r = 1; r < values.size(); ++r)
      if (values[r] != values[0]) return static_cast<int>(r);
    return 0;
  };
  if (const int r = differs(comm.all_gather(version())))
    train::fail_on_every_process(comm, fmt::format("[mpirun] rank {} runs another attograd version than rank 0", r));
  for (const auto& [flag, value] : flag_values(o)) {
    const std::vector<std::string> values = comm.all_gather(value);
    if (const int r = differs(values))
      train::fail_on_every_process(
          comm, fmt::format("[{}] differs between the processes of this run: rank {} has '{}', rank 0 '{}' "
                            "(start every process with the same flags)",
                            flag, r, values[static_cast<std::size_t>(r)], values[0]));
  }
}

// Runs `setup` on every process. A failure on any of them stops all of them at
// this point (none is left waiting in a collective), reported once, by rank 0,
// naming the rank it happened on when that is not rank 0.
template <typename F>
void on_every_process(train::Communicator& comm, F&& setup) {
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
      train::fail_on_every_process(comm, r == 0 ? e : fmt::format("{} (on rank {} of {})", e, r, comm.size()));
}

// Threads per process when none are asked for: the machine's cores shared by
// the processes on it (two processes on two cores each take one).
int default_threads(const train::Communicator& comm) {
  return std::max(1, get_num_threads() / std::max(1, comm.local_size()));
}

// A test-only hook (tests/test_mpi.cpp): ATTOGRAD_TEST_DRIFT_RANK=r makes rank r
// nudge one weight, as a flipped bit would, so the next evaluation's parameter
// checksums must catch it.
void drift_for_tests(const train::Communicator& comm, const std::vector<nn::NamedParameter>& params) {
  const char* rank = std::getenv("ATTOGRAD_TEST_DRIFT_RANK");
  if (!rank || std::atoi(rank) != comm.rank() || comm.size() == 1) return;
  NoGradGuard no_grad;
  const Tensor& w = params.front().tensor;
  kernels::copy_(narrow(flatten(w), 0, 0, 1), narrow(flatten(w), 0, 0, 1) + 1e-3);
}

// A test-only hook (tests/test_mpi.cpp): ATTOGRAD_TEST_FAIL_RANK=r makes rank r
// fail after set-up and before the first step, as running out of GPU memory for
// the gradient buckets on one rank would.
void fail_for_tests(const train::Communicator& comm) {
  const char* rank = std::getenv("ATTOGRAD_TEST_FAIL_RANK");
  AG_CHECK(!rank || std::atoi(rank) != comm.rank() || comm.size() == 1, "train", "test failure on rank {}",
           comm.rank());
}

std::string megabytes(std::size_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

TrainSummary train_command(TrainOptions o, std::FILE* out) {
  train::Communicator& comm = train::world();
  const bool reporter = comm.rank() == 0;  // rank 0 alone prints, evaluates and writes
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> silent(nullptr, std::fclose);
  if (!reporter) {
    silent.reset(std::fopen("/dev/null", "w"));
    AG_CHECK(silent != nullptr, "train", "cannot open /dev/null");
    out = silent.get();
  }
  const auto start_time = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count(); };
  check_same_flags(o, comm);

  // ---- 1. options: from a checkpoint when resuming, then every one validated;
  //         data, model and optimizer built (on every process: each reads the data itself)
  LoadedCheckpoint resumed;
  std::unique_ptr<Dataset> data;
  std::unique_ptr<nn::GPT> model;
  train::DeviceReduction device_reduction;  // NCCL on GPUs: outlives the optimizer and the reducer that use it
  std::unique_ptr<train::Optimizer> optimizer;
  train::ShardedOptimizer* sharded = nullptr;
  Device device = Device::cpu();
  on_every_process(comm, [&] {
    if (!o.resume.empty()) {
      resumed = load_checkpoint(o.resume, "--resume");
      TrainOptions c = resumed.info.config;
      c.steps = o.steps > 0 ? o.steps : c.steps;  // the schedule may be lengthened
      c.eval_interval = o.eval_interval > 0 ? o.eval_interval : preset_for(c, true).eval_interval;
      c.threads = o.threads, c.device = o.device, c.stop_at = o.stop_at, c.quiet = o.quiet, c.resume = o.resume;
      c.grad_accum = o.grad_accum, c.shard_optimizer = o.shard_optimizer, c.fixed_split = o.fixed_split;
      c.out = o.out.empty() ? fs::path(o.resume).parent_path().string() : o.out;
      if (!o.data.empty()) {  // the same text at another path: a project moved, say
        AG_CHECK(!c.data.empty(), "--data", "'{}' is a run of the {} task: it has no text to give again", o.resume,
                 c.task);
        AG_CHECK(!resumed.info.data_fingerprint.empty(), "--data",
                 "'{}' keeps no fingerprint of its text (it predates them), so --data cannot be given when resuming it",
                 o.resume);
        c.data = o.data;
      }
      if (c.out.empty()) c.out = ".";
      o = c;
      AG_CHECK(o.steps >= resumed.info.step, "--steps", "{} is before the checkpoint's step {}", o.steps,
               resumed.info.step);
      AG_CHECK(resumed.optimizer_name == o.optimizer, "--resume", "'{}' holds no {} optimizer state", o.resume,
               o.optimizer);
    }
    validate(o);
    AG_CHECK(o.batch % (comm.size() * o.grad_accum) == 0, "--batch",
             "{} sequences do not split evenly into {} processes x --grad-accum {} micro-batches", o.batch,
             comm.size(), o.grad_accum);
    AG_CHECK(o.fixed_split == 0 || o.fixed_split % comm.size() == 0, "--fixed-split",
             "{} pieces do not split evenly over {} processes (the process count must divide it)", o.fixed_split,
             comm.size());
    AG_CHECK(!o.shard_optimizer || comm.size() > 1, "--shard-optimizer",
             "needs several processes (start the run with mpirun -np N)");
    if (o.out.empty())
      o.out = first_free_run_dir(fs::path("runs") / (o.data.empty() ? o.task : fs::path(o.data).stem().string())).string();
    data = o.resume.empty() ? make_dataset(o) : make_dataset(o, &resumed.info.tokenizer, resumed.info.data_fingerprint);
    if (const auto* text = dynamic_cast<const TextData*>(data.get())) text->check_block(o.block);
    if (reporter) check_output_dir(o.out, o.resume);
    check_memory(o, data->tokenizer().size(), comm.local_size(), comm.size());
    model = o.resume.empty() ? build_model(o, data->tokenizer().size()) : std::move(resumed.model);

    if (o.threads > 0)
      set_num_threads(o.threads);
    else if (comm.size() > 1)
      set_num_threads(default_threads(comm));
    device = o.device == "cuda" ? Device::cuda(comm.local_rank() % cuda::device_count()) : Device::cpu();
    if (!device.is_cpu()) model->to(device);
    if (o.shard_optimizer) {
      auto shard = std::make_unique<train::ShardedOptimizer>(
          model->named_parameters(), comm,
          [&](std::vector<nn::NamedParameter> mine) { return make_optimizer(o, mine); });
      sharded = shard.get();
      optimizer = std::move(shard);
    } else {
      optimizer = make_optimizer(o, model->named_parameters());
    }
    if (!o.resume.empty()) {
      try {
        optimizer->load_state(resumed.optimizer_state, resumed.optimizer_steps);
      } catch (const Error& e) {
        fail(o.resume, "{}", e.what());  // name the file the state came from
      }
    }
  });
  const std::int64_t first_step = o.resume.empty() ? 0 : resumed.info.step;
  const std::int64_t last_step = o.stop_at > 0 ? std::min(o.stop_at, o.steps) : o.steps;
  const auto params = model->named_parameters();
  if (comm.size() > 1)
    on_every_process(comm, [&] { device_reduction = train::choose_device_reduction(comm, device); });
  std::unique_ptr<train::GradientReducer> reducer;
  try {
    fail_for_tests(comm);
    // Every process starts from rank 0's weights (a resumed run's too: each read its own copy of the file).
    train::broadcast_parameters(params, comm, 0, device_reduction.comm.get());
    if (sharded) sharded->use_device_communicator(device_reduction.comm.get());
    if (comm.size() > 1 && o.fixed_split == 0)
      reducer = std::make_unique<train::GradientReducer>(params, comm, train::kDefaultBucketBytes,
                                                         device_reduction.comm.get());
  } catch (const std::exception& e) {
    train::stop_every_process(comm, e);
    throw;
  }

  // ---- 2. everything is valid: only now does the run directory appear (rank 0's)
  const fs::path run_dir(o.out);
  const std::string ckpt_path = (run_dir / kCheckpointName).string();
  std::optional<RunDirectory> run_directory;
  std::optional<MetricsLog> metrics;
  on_every_process(comm, [&] {
    if (!reporter) return;
    run_directory.emplace(o.out, o.resume);
    for (const char* name : kRunFiles) remove_stale_temporaries(o.out, name);
    metrics.emplace((run_dir / "metrics.jsonl").string(), first_step);
  });
  const std::string title = o.data.empty() ? fmt::format("attograd: {} {}", o.task, o.task_size)
                                           : fmt::format("attograd: {}", fs::path(o.data).filename().string());
  CheckpointInfo info{o, data->tokenizer(), 0};
  if (const auto* text = dynamic_cast<const TextData*>(data.get())) {
    // Absolute: a resumed run, eval or sample then finds the text from any directory.
    info.config.data = fs::absolute(o.data).lexically_normal().string();
    info.data_fingerprint = text->fingerprint();
  }

  std::fprintf(out, "attograd train: %s\n", describe_data(o, *data).c_str());
  std::fprintf(out,
               "model: %lld layers, %lld heads, width %lld, block %lld, %lld parameters; %s lr %g, batch %lld, "
               "%lld steps; %d threads, %s; run dir %s\n",
               static_cast<long long>(o.layers), static_cast<long long>(o.heads), static_cast<long long>(o.width),
               static_cast<long long>(o.block), static_cast<long long>(model->num_parameters()), o.optimizer.c_str(),
               o.lr, static_cast<long long>(o.batch), static_cast<long long>(o.steps), get_num_threads(),
               device.str().c_str(), o.out.c_str());
  const std::size_t optimizer_bytes =
      sharded ? sharded->state_bytes() : train::optimizer_state_bytes(*optimizer);
  if (o.fixed_split > 0 || comm.size() > 1 || o.grad_accum > 1) {
    const std::string split =
        o.fixed_split > 0
            ? fmt::format(
                  "{} of {} pieces each per step, summed in one fixed order (--fixed-split: the same bits on "
                  "any process count dividing it) through host memory",
                  o.fixed_split / comm.size(), o.fixed_split)
            : fmt::format("{} sequences each per step in {} micro-batches; gradients all-reduced in {} buckets{}{}",
                          o.batch / comm.size(), o.grad_accum, reducer ? reducer->bucket_count() : 0,
                          device_reduction.how.empty() ? "" : " ", device_reduction.how);
    std::fprintf(out, "data parallel: %d processes (%s), %s; optimizer state %s per process%s\n", comm.size(),
                 comm.engine().c_str(), split.c_str(), megabytes(optimizer_bytes).c_str(),
                 sharded ? " (sharded, ZeRO-1)" : "");
  }
  if (device.is_cpu())  // OpenBLAS multiplies only on the CPU
    if (const std::string note = blas_kernels_note(); !note.empty()) std::fprintf(out, "%s\n", note.c_str());
  if (first_step > 0) std::fprintf(out, "resuming from %s at step %lld\n", o.resume.c_str(), static_cast<long long>(first_step));
  std::fflush(out);

  const EvaluateOptions eval_options{.max_sequences = o.data.empty() ? 0 : kTrainEvalWindows, .device = device};
  Progress progress(out, first_step, last_step,
                    {.interactive = reporter && ::isatty(::fileno(out)) == 1, .quiet = o.quiet || !reporter});
  TrainSummary summary;
  summary.rank = comm.rank(), summary.processes = comm.size();
  EvalResult last_eval;
  double train_seconds = 0, train_tokens = 0, comm_seconds = 0;  // the steps alone, for tokens per second
  // The last checkpoint known to be good: the one resumed from until this run writes its own.
  std::string good_checkpoint = o.resume.empty() ? "" : o.resume;
  std::int64_t good_step = first_step;
  const StopSignalGuard stop_signal_guard;
  std::int64_t stopped_at = last_step;
  int stopped_by = 0;
  try {
    for (std::int64_t step = first_step + 1; step <= last_step; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const double lr = learning_rate(o, step);
      optimizer->set_lr(lr);
      const Batch batch = data->train_batch(static_cast<std::uint64_t>(step - 1), o.batch, o.block);
      model->train();
      const train::StepGradients step_grads =
          o.fixed_split > 0 ? train::fixed_split_gradients(*model, batch, device, o.fixed_split, comm)
                            : train::compute_gradients(*model, batch, device, o.grad_accum, comm, reducer.get());
      const double grad_norm = clip_grad_norm(params, o.grad_clip);
      const double loss_value = step_grads.loss;
      // A non-finite loss or gradient would poison every weight: stop before the update,
      // and before any checkpoint of this step replaces the last good one. After the
      // all-reduce every process sees the same values, so all stop here together.
      if (!std::isfinite(loss_value) || !std::isfinite(grad_norm)) {
        const std::string kept = good_checkpoint.empty()
                                     ? std::string("no checkpoint was saved")
                                     : fmt::format("the last good checkpoint is {} (step {})", good_checkpoint, good_step);
        const double bad = std::isfinite(loss_value) ? grad_norm : loss_value;
        train::fail_on_every_process(
            comm, fmt::format("[train] the {} became {} at step {} (try a lower --lr or --grad-clip); {}",
                              std::isfinite(loss_value) ? "gradient norm" : "loss",
                              std::isnan(bad) ? "NaN" : bad > 0 ? "+inf" : "-inf", step, kept));
      }
      optimizer->step();
      optimizer->zero_grad();
      if (step == first_step + 3) drift_for_tests(comm, params);
      // A signal may reach some processes and not others (or a step apart): all stop
      // at the first step any of them saw one.
      double signal = StopSignalGuard::received();
      const auto c0 = std::chrono::steady_clock::now();
      comm.max(&signal, 1);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      comm_seconds += step_grads.comm_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      train_seconds += dt;
      train_tokens += static_cast<double>(batch.tokens.numel());
      const double tokens_per_s = static_cast<double>(batch.tokens.numel()) / dt;
      if (metrics) metrics->log(TrainRecord{step, loss_value, lr, grad_norm, tokens_per_s, elapsed()});
      if (comm.size() > 1)
        progress.set_detail(fmt::format("comm {:.0f}%  optimizer {}/process", 100 * comm_seconds / train_seconds,
                                        megabytes(optimizer_bytes)));
      progress.update(step, loss_value, lr, train_tokens / train_seconds);  // the run's average: a steadier figure

      const int signo = static_cast<int>(signal);
      const bool stop_now = signo != 0;
      if (stop_now) {
        stopped_at = step;
        stopped_by = signo;
        progress.message(fmt::format("{}: saving step {}; continue with --resume {}", signal_name(signo), step,
                                     ckpt_path));
      }
      if (step % o.eval_interval == 0 || step == last_step || stop_now) {
        // Processes that drifted apart (they never should) would make a checkpoint
        // that is nobody's model: compare every parameter's bits first.
        const std::vector<std::string> checksums = comm.all_gather(train::parameter_checksum(params));
        for (int r = 1; r < comm.size(); ++r)
          if (checksums[static_cast<std::size_t>(r)] != checksums[0])
            train::fail_on_every_process(
                comm, fmt::format("[train] the processes' parameters differ at step {}: rank {} has checksum {}, "
                                  "rank 0 {}; the last good checkpoint is {}",
                                  step, r, checksums[static_cast<std::size_t>(r)], checksums[0],
                                  good_checkpoint.empty() ? "none" : good_checkpoint));
        const OptimizerState state = sharded ? sharded->gather_state() : optimizer_state(optimizer.get());
        if (reporter) {
          // The checkpoint first: after a stop signal the time left may be short (mpirun
          // sends SIGKILL a second after its SIGTERM), and evaluating can take longer.
          CheckpointInfo at = info;
          at.step = step;
          save_checkpoint(ckpt_path, *model, state, at);
          run_directory->keep();
          last_eval = evaluate(*model, *data, eval_options);
          metrics->log(EvalRecord{step, last_eval.loss, last_eval.accuracy, elapsed()});
          progress.message(eval_line(step, last_eval));
          write_file_atomically("loss.svg", (run_dir / "loss.svg").string(), loss_plot_svg(metrics->train(), metrics->eval(), title));
        }
        good_checkpoint = ckpt_path, good_step = step;
      }
      if (stop_now) break;
    }
  } catch (const std::exception& e) {
    train::stop_every_process(comm, e);
    throw;
  }
  progress.finish();
  if (last_step <= first_step && reporter) {  // resumed at or past the end: report where the checkpoint stands
    last_eval = evaluate(*model, *data, eval_options);
    progress.message(eval_line(first_step, last_eval));
  }

  summary.run_dir = o.out;
  summary.checkpoint = ckpt_path;
  summary.steps_done = std::max(first_step, stopped_at);
  summary.final_train_loss = progress.smoothed_loss();
  summary.val_loss = last_eval.loss;
  summary.accuracy = last_eval.accuracy;
  if (!o.data.empty()) summary.unigram_entropy = dynamic_cast<const TextData&>(*data).unigram_entropy();
  summary.seconds = elapsed();
  summary.stop_signal = stopped_at < last_step ? stopped_by : 0;
  std::string line = fmt::format("done: step {} in {:.1f} s ({:.1f} s training); held-out loss {:.4f}",
                                 summary.steps_done, summary.seconds, train_seconds, summary.val_loss);
  if (!last_eval.whole()) line += fmt::format(" over the first {} validation windows", coverage(last_eval));
  if (summary.accuracy) line += fmt::format(", exact match {:.2f}%", 100 * *summary.accuracy);
  if (!o.data.empty()) line += fmt::format(" (unigram entropy {:.4f})", summary.unigram_entropy);
  if (comm.size() > 1) line += fmt::format("; {} processes, {:.0f}% of the steps' time in communication", comm.size(),
                                           train_seconds > 0 ? 100 * comm_seconds / train_seconds : 0.0);
  line += fmt::format("; checkpoint {}", ckpt_path);
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
  return summary;
}

}  // namespace attograd
