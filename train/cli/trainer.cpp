// `attograd train`: options -> data, model, optimizer -> the training loop,
// with periodic evaluation, checkpoints, metrics.jsonl and loss.svg. A
// TrainingRun goes through its phases in order (run() at the bottom says
// which); what is checked and built before the first step is in run_setup.h.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "base/error.h"
#include "cuda/runtime.h"
#include "cpu/blas_setup.h"
#include "cpu/fma_peak.h"
#include "tensor/kernels.h"
#include "cpu/parallel.h"
#include "train/cli/commands.h"
#include "train/cli/progress.h"
#include "train/cli/run_setup.h"
#include "train/cli/signals.h"
#include "train/data/text_data.h"
#include "train/distributed/communicator.h"
#include "train/distributed/data_parallel.h"
#include "train/distributed/fixed_split.h"
#include "train/distributed/sharded_optimizer.h"
#include "train/distributed/step.h"
#include "train/files.h"
#include "train/model/evaluate.h"
#include "train/model/generate.h"
#include "train/model/gpt.h"
#include "train/optim/grad_clip.h"
#include "train/optim/schedule.h"
#include "train/output/checkpoint.h"
#include "train/output/metrics.h"
#include "train/output/run_directory.h"
#include "train/output/svg.h"

namespace attograd::train::cli {

namespace fs = std::filesystem;

namespace {

// A text run's evaluations read the first this many windows of the validation
// split, not all of it: a 25 MB file holds about 39,000 windows of 64 characters,
// and reading them all at every --eval-interval could cost more than the steps
// between two evaluations.
// The eval line says so; `attograd eval` reads the whole split. A task's
// held-out set is --heldout problems (2000 by default), always read whole.
// Also at most this many tokens: at GPT-2 size (block 1024) 256 windows took
// 175 s of a 6-step run's 202; past block 256, fewer windows are read.
constexpr std::int64_t kTrainEvalWindows = 256, kTrainEvalTokens = 65536;
// Tokens of each --sample-interval sample.
constexpr std::int64_t kSampleTokens = 64;

// "eval step 250: val loss 1.8412 over the first 256 of 4,120 validation windows", or, read whole,
// "eval step 100: val loss 0.0123, exact match 99.10% of 2000".
std::string eval_line(std::int64_t step, const model::EvalResult& r) {
  std::string line = fmt::format("eval step {}: val loss {:.4f}", step, r.loss);
  if (!r.whole()) line += fmt::format(" over the first {} validation windows", model::coverage(r));
  if (r.accuracy) line += fmt::format(", exact match {:.2f}% of {}", 100 * *r.accuracy, r.examples);
  return line;
}

std::string megabytes(std::size_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

// One step's figures, for the metrics, the progress line and the NaN check.
struct StepResult {
  double loss, grad_norm, lr;
  double seconds, tokens, comm_seconds;
  int signal;  // a stop signal any process received by the end of the step, else 0
};

class TrainingRun {
 public:
  TrainingRun(TrainOptions options, std::FILE* out)
      : o_(std::move(options)), comm_(distributed::world()), reporter_(comm_.rank() == 0), out_(out) {
    if (!reporter_) {  // rank 0 alone prints, evaluates and writes
      silent_.reset(std::fopen("/dev/null", "w"));
      AG_CHECK(silent_ != nullptr, "train", "cannot open /dev/null");
      out_ = silent_.get();
    }
  }

  TrainSummary run() {
    check_same_flags(o_, comm_);
    on_every_process(comm_, [&] { build(); });
    connect_processes();
    open_run_directory();
    print_header();
    progress_.emplace(out_, first_step_, last_step_,
                      ProgressOptions{.interactive = reporter_ && is_interactive(out_),
                                      .quiet = o_.quiet || !reporter_});
    const StopSignalGuard stop_signal_guard;  // from the first step to the summary
    train_steps();
    return summarize();
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  // ---- 1. options: from a checkpoint when resuming, then every one validated;
  //         data, model and optimizer built (on every process: each reads the data itself)
  void build() {
    AG_CHECK(o_.resume.empty() || o_.init_from.empty(), "--init-from",
             "starts a new run: it cannot go with --resume, which continues one");
    std::optional<InitialWeights> init;
    if (!o_.init_from.empty()) init = initial_weights(o_);
    if (!o_.resume.empty()) {
      AG_CHECK(!output::is_hf_folder(o_.resume), "--resume",
               "'{}' is a folder (Hugging Face's layout), not a run's checkpoint: start a new run from it with "
               "--init-from",
               o_.resume);
      resumed_ = output::load_checkpoint(o_.resume, "--resume");
      o_ = resumed_options(o_, resumed_);
      // A tokenizer given now is attached (checked against the one the model was trained with, if any).
      if (!o_.tokenizer.empty())
        resumed_.info.vocabulary = resumed_.info.vocabulary.attached(o_.tokenizer, "--tokenizer");
    }
    validate(o_);
    comm_.set_timeout(o_.comm_timeout);
    if (o_.dtype.empty()) o_.dtype = dtype_name(DType::f32);
    dtype_ = compute_dtype(o_);
    check_process_split(o_, comm_);
    if (o_.out.empty())
      o_.out = output::first_free_run_dir(fs::path("runs") / run_name(o_)).string();
    if (!o_.resume.empty())
      data_ = data::make_dataset(dataset_spec(o_), &resumed_.info.vocabulary, resumed_.info.data_fingerprint);
    else
      data_ = data::make_dataset(dataset_spec(o_), init ? &init->vocabulary : nullptr);
    // Text and token files are read with the weights' vocabulary; a task has its own, which must be it.
    AG_CHECK(!init || data_->vocabulary() == init->vocabulary, "--init-from",
             "'{}' was trained on another vocabulary ({} tokens) than the {} task's ({})", o_.init_from,
             init ? init->vocabulary.size() : 0, o_.task, data_->vocabulary().size());
    data_->check_block(o_.block);
    if (reporter_) output::check_output_dir(o_.out, o_.resume);
    check_memory(o_, data_->vocabulary().size(), comm_.local_size(), comm_.size());
    model_ = o_.resume.empty() ? model::build_model(o_, data_->vocabulary().size()) : std::move(resumed_.model);
    if (init) model_->load_state_dict(init->state);  // the new run's dropout and seed, the weights' values

    if (o_.threads > 0)
      set_num_threads(o_.threads);
    else if (comm_.size() > 1)
      set_num_threads(default_threads(comm_));
    device_ = o_.device == "cuda" ? Device::cuda(comm_.local_rank() % cuda::device_count()) : Device::cpu();
    if (!device_.is_cpu()) model_->to(device_);
    if (o_.shard_optimizer) {
      auto shard = std::make_unique<distributed::ShardedOptimizer>(
          model_->named_parameters(), comm_,
          [&](std::vector<nn::NamedParameter> mine) { return make_optimizer(o_, mine); });
      sharded_ = shard.get();
      optimizer_ = std::move(shard);
    } else {
      optimizer_ = make_optimizer(o_, model_->named_parameters());
    }
    if (!o_.resume.empty()) {
      try {
        optimizer_->load_state(resumed_.optimizer_state, resumed_.optimizer_steps);
      } catch (const Error& e) {
        fail(o_.resume, "{}", e.what());  // name the file the state came from
      }
      resumed_.optimizer_state.clear();  // copied into the optimizer: the file's copy would live as long as the run
    }
    first_step_ = o_.resume.empty() ? 0 : resumed_.info.step;
    last_step_ = o_.stop_at > 0 ? std::min(o_.stop_at, o_.steps) : o_.steps;
    params_ = model_->named_parameters();
  }

  // Every process starts from rank 0's weights (a resumed run's too: each read
  // its own copy of the file); the buckets' all-reduce unless --fixed-split.
  void connect_processes() {
    if (comm_.size() > 1)
      on_every_process(comm_, [&] { device_reduction_ = distributed::choose_device_reduction(comm_, device_); });
    try {
      fail_for_tests(comm_);
      distributed::broadcast_parameters(params_, comm_, 0, device_reduction_.comm.get());
      if (sharded_) sharded_->use_device_communicator(device_reduction_.comm.get());
      if (comm_.size() > 1 && o_.fixed_split == 0)
        reducer_ = std::make_unique<distributed::GradientReducer>(params_, comm_, distributed::kDefaultBucketBytes,
                                                                  device_reduction_.comm.get());
    } catch (const std::exception& e) {
      distributed::stop_every_process(comm_, e);
      throw;
    }
  }

  // ---- 2. everything is valid: only now does the run directory appear (rank 0's)
  void open_run_directory() {
    const fs::path run_dir(o_.out);
    ckpt_path_ = (run_dir / output::kCheckpointName).string();
    on_every_process(comm_, [&] {
      if (!reporter_) return;
      run_directory_.emplace(o_.out, o_.resume);
      for (const char* name : output::kRunFiles) remove_stale_temporaries(o_.out, name);
      metrics_.emplace((run_dir / "metrics.jsonl").string(), first_step_);
    });
    info_ = output::CheckpointInfo{o_, data_->vocabulary(), 0};
    if (!o_.data.empty()) {
      // Absolute: a resumed run, eval or sample then finds the data from any directory.
      info_.config.data = fs::absolute(o_.data).lexically_normal().string();
      if (!o_.val_data.empty()) info_.config.val_data = fs::absolute(o_.val_data).lexically_normal().string();
      info_.data_fingerprint = data_->fingerprint();
    }
    // A resumed run's best so far is the one its run directory keeps.
    best_path_ = (run_dir / output::kBestCheckpointName).string();
    if (o_.keep_best && reporter_ && fs::exists(best_path_))
      best_loss_ = output::read_checkpoint_info(best_path_, "--keep-best").val_loss;
    // The last checkpoint known to be good: the one resumed from until this run writes its own.
    good_checkpoint_ = o_.resume;
    good_step_ = first_step_;
  }

  // ---- 3. the header: the data, the model, the processes
  // What the matrix products run on, after the device: ", bfloat16 (amx)",
  // ", bfloat16 (widen: avx2)" (float32's products on that kernel), or
  // ", float32 (avx512)" on the CPU; ", bfloat16 (tensor cores)" on the GPU.
  std::string products_kernel() const {
    if (dtype_ == DType::bf16 && !device_.is_cpu()) return ", bfloat16 (tensor cores)";
    if (dtype_ == DType::bf16) {
      const std::string kernel = kernels::bf16_matmul_kernel();
      if (kernel != "widen") return fmt::format(", bfloat16 ({})", kernel);
      return fmt::format(", bfloat16 (widen: {})", kernels::widening_matmul_kernel());
    }
    return device_.is_cpu() ? fmt::format(", float32 ({})", kernels::f32_matmul_kernel()) : "";
  }

  void print_header() {
    std::fprintf(out_, "attograd train: %s\n", describe_data(o_, *data_).c_str());
    std::fprintf(out_,
                 "model: %lld layers, %lld heads, width %lld, block %lld, %lld parameters; %s lr %g, batch %lld, "
                 "%lld steps; %d threads, %s%s; run dir %s\n",
                 static_cast<long long>(o_.layers), static_cast<long long>(o_.heads), static_cast<long long>(o_.width),
                 static_cast<long long>(o_.block), static_cast<long long>(model_->num_parameters()),
                 o_.optimizer.c_str(), o_.lr, static_cast<long long>(o_.batch), static_cast<long long>(o_.steps),
                 get_num_threads(), device_.str().c_str(), products_kernel().c_str(), o_.out.c_str());
    // The progress line's model FLOPs utilisation is against this CPU's float32 FMA peak, measured
    // (cpu/fma_peak.h) on this process's threads; a bfloat16 run can pass 100% of it.
    if (reporter_ && !o_.quiet && device_.is_cpu()) {
      peak_flops_ = cpu::fma_peak_flops(get_num_threads());
      if (peak_flops_ > 0)
        std::fprintf(out_, "peak: %.0f GFLOP/s of float32 FMA on %d threads (measured); MFU is a step's model FLOPs "
                           "over it\n",
                     peak_flops_ / 1e9, get_num_threads());
    }
    optimizer_bytes_ = sharded_ ? sharded_->state_bytes() : distributed::optimizer_state_bytes(*optimizer_);
    if (o_.fixed_split > 0 || comm_.size() > 1 || o_.grad_accum > 1) {
      const std::string split =
          o_.fixed_split > 0
              ? fmt::format(
                    "{} of {} pieces each per step, summed in one fixed order (--fixed-split: the same bits on "
                    "any process count dividing it) through host memory",
                    o_.fixed_split / comm_.size(), o_.fixed_split)
              : fmt::format("{} sequences each per step in {} micro-batches; gradients all-reduced in {} buckets{}{}",
                            o_.batch / comm_.size(), o_.grad_accum, reducer_ ? reducer_->bucket_count() : 0,
                            device_reduction_.how.empty() ? "" : " ", device_reduction_.how);
      std::fprintf(out_, "data parallel: %d processes (%s), %s; optimizer state %s per process%s\n", comm_.size(),
                   comm_.engine().c_str(), split.c_str(), megabytes(optimizer_bytes_).c_str(),
                   sharded_ ? " (sharded, ZeRO-1)" : "");
    }
    // OpenBLAS multiplies a run's products only on the CPU where it is float32's kernel.
    if (device_.is_cpu() && std::string(kernels::f32_matmul_kernel()) == "openblas")
      if (const std::string note = blas_kernels_note(); !note.empty()) std::fprintf(out_, "%s\n", note.c_str());
    if (first_step_ > 0)
      std::fprintf(out_, "resuming from %s at step %lld\n", o_.resume.c_str(), static_cast<long long>(first_step_));
    std::fflush(out_);
  }

  // ---- 4. the steps, each followed by a checkpoint and an evaluation at every
  //         --eval-interval, at the last step, and when a signal stops the run
  void train_steps() {
    stopped_at_ = last_step_;
    try {
      for (std::int64_t step = first_step_ + 1; step <= last_step_; ++step) {
        const StepResult r = train_step(step);
        report_step(step, r);
        if (o_.sample_interval > 0 && step % o_.sample_interval == 0) print_sample(step);
        const bool stop_now = r.signal != 0;
        if (stop_now) {
          stopped_at_ = step;
          stopped_by_ = r.signal;
          progress_->message(fmt::format("{}: saving step {}; continue with --resume {}", signal_name(r.signal), step,
                                         ckpt_path_));
        }
        if (step % o_.eval_interval == 0 || step == last_step_ || stop_now) checkpoint_and_evaluate(step);
        if (stop_now) break;
      }
    } catch (const std::exception& e) {
      distributed::stop_every_process(comm_, e);
      throw;
    }
    progress_->finish();
    if (last_step_ <= first_step_ && reporter_) {  // resumed at or past the end: report where the checkpoint stands
      last_eval_ = model::evaluate(*model_, *data_, eval_options());
      progress_->message(eval_line(first_step_, last_eval_));
    }
  }

  // One optimizer step on this step's batch: gradients (all-reduced or summed
  // in the fixed split), clipping, the NaN stop, the update.
  StepResult train_step(std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    comm_.set_step(step);
    // Within a step a stop signal ends a long wait on mpirun's host (watchdog.h); after
    // it, the processes finish together (a checkpoint, rank 0's evaluation) as usual.
    comm_.set_stop_signal(&StopSignalGuard::received);
    const double lr = optim::learning_rate(o_, step);
    optimizer_->set_lr(lr);
    const data::Batch batch = data_->train_batch(static_cast<std::uint64_t>(step - 1), o_.batch, o_.block);
    model_->train();
    const distributed::StepGradients grads =
        o_.fixed_split > 0
            ? distributed::fixed_split_gradients(*model_, batch, {device_, dtype_}, o_.fixed_split, comm_)
            : distributed::compute_gradients(*model_, batch, {device_, dtype_}, o_.grad_accum, comm_, reducer_.get());
    const double grad_norm = optim::clip_grad_norm(params_, o_.grad_clip);
    stop_unless_finite(step, grads.loss, grad_norm);
    optimizer_->step();
    optimizer_->zero_grad();
    if (step == first_step_ + 3) drift_for_tests(comm_, params_);
    // A signal may reach some processes and not others (or a step apart): all stop
    // at the first step any of them saw one.
    double signal = StopSignalGuard::received();
    const auto c0 = std::chrono::steady_clock::now();
    comm_.max(&signal, 1);
    comm_.set_stop_signal(nullptr);
    const auto t1 = std::chrono::steady_clock::now();
    return {grads.loss,
            grad_norm,
            lr,
            std::chrono::duration<double>(t1 - t0).count(),
            static_cast<double>(batch.tokens.numel()),
            grads.comm_seconds + std::chrono::duration<double>(t1 - c0).count(),
            static_cast<int>(signal)};
  }

  // A non-finite loss or gradient would poison every weight: stop before the update,
  // and before any checkpoint of this step replaces the last good one. After the
  // all-reduce every process sees the same values, so all stop here together.
  void stop_unless_finite(std::int64_t step, double loss, double grad_norm) const {
    if (std::isfinite(loss) && std::isfinite(grad_norm)) return;
    const std::string kept = good_checkpoint_.empty()
                                 ? std::string("no checkpoint was saved")
                                 : fmt::format("the last good checkpoint is {} (step {})", good_checkpoint_, good_step_);
    const double bad = std::isfinite(loss) ? grad_norm : loss;
    distributed::fail_on_every_process(
        comm_, fmt::format("[train] the {} became {} at step {} (try a lower --lr or --grad-clip); {}",
                           std::isfinite(loss) ? "gradient norm" : "loss",
                           std::isnan(bad) ? "NaN" : bad > 0 ? "+inf" : "-inf", step, kept));
  }

  void report_step(std::int64_t step, const StepResult& r) {
    comm_seconds_ += r.comm_seconds;
    train_seconds_ += r.seconds;
    train_tokens_ += r.tokens;
    if (metrics_) metrics_->log(output::TrainRecord{step, r.loss, r.lr, r.grad_norm, r.tokens / r.seconds, elapsed()});
    std::string detail;
    if (comm_.size() > 1)
      detail = fmt::format("comm {:.0f}%  optimizer {}/process", 100 * comm_seconds_ / train_seconds_,
                           megabytes(optimizer_bytes_));
    if (peak_flops_ > 0) {
      // The run's average rate, as tokens/s: rows of the full block per second, shared by the processes.
      const double rows_per_second = train_tokens_ / train_seconds_ / static_cast<double>(o_.block);
      const double flops = model::step_flops(model_->config(), 1) * rows_per_second / comm_.size();
      detail += fmt::format("{}MFU {:.0f}%", detail.empty() ? "" : "  ", 100 * flops / peak_flops_);
    }
    progress_->set_detail(detail);
    progress_->update(step, r.loss, r.lr, train_tokens_ / train_seconds_);  // the run's average: a steadier figure
  }

  // A sample from the default prompt (rank 0's): how the model writes by now. It
  // changes no state training reads (eval mode draws no dropout), so a run with
  // samples is the same run.
  void print_sample(std::int64_t step) {
    const data::Vocabulary& vocabulary = data_->vocabulary();
    if (!reporter_ || !vocabulary.has_text()) return;
    const std::string prompt = data_->default_prompt();
    if (prompt.empty()) return;
    model::GenerateOptions options{.tokens = kSampleTokens, .seed = static_cast<std::uint64_t>(step), .dtype = dtype_,
                                   .vocab_limit = vocabulary.size()};
    if (const auto eot = vocabulary.end_of_text()) options.stop_token = *eot;
    const std::vector<std::int64_t> ids = model::generate(*model_, vocabulary.encode(prompt, "sample"), options, device_);
    progress_->message(fmt::format("sample at step {}:\n{}", step, vocabulary.decode(ids)));
  }

  void checkpoint_and_evaluate(std::int64_t step) {
    // Processes that drifted apart (they never should) would make a checkpoint
    // that is nobody's model: compare every parameter's bits first.
    const std::vector<std::string> checksums = comm_.all_gather(distributed::parameter_checksum(params_));
    for (int r = 1; r < comm_.size(); ++r)
      if (checksums[static_cast<std::size_t>(r)] != checksums[0])
        distributed::fail_on_every_process(
            comm_, fmt::format("[train] the processes' parameters differ at step {}: rank {} has checksum {}, "
                               "rank 0 {}; the last good checkpoint is {}",
                               step, r, checksums[static_cast<std::size_t>(r)], checksums[0],
                               good_checkpoint_.empty() ? "none" : good_checkpoint_));
    const output::OptimizerState state = sharded_ ? sharded_->gather_state() : output::optimizer_state(optimizer_.get());
    if (reporter_) {
      // The checkpoint first: after a stop signal the time left may be short (mpirun
      // sends SIGKILL a second after its SIGTERM), and evaluating can take longer.
      output::CheckpointInfo at = info_;
      at.step = step;
      output::save_checkpoint(ckpt_path_, *model_, state, at);
      run_directory_->keep();
      last_eval_ = model::evaluate(*model_, *data_, eval_options());
      metrics_->log(output::EvalRecord{step, last_eval_.loss, last_eval_.accuracy, elapsed()});
      progress_->message(eval_line(step, last_eval_));
      if (o_.keep_best && (!best_loss_ || last_eval_.loss < *best_loss_)) {
        // Weights only: the best is for sampling, evaluating, exporting and starting new runs, not for --resume.
        at.val_loss = best_loss_ = last_eval_.loss;
        output::save_checkpoint(best_path_, *model_, output::OptimizerState{}, at);
        progress_->message(fmt::format("best so far: {}", best_path_));
      }
      write_file_atomically("loss.svg", (fs::path(o_.out) / "loss.svg").string(),
                            output::loss_plot_svg(metrics_->train(), metrics_->eval(), plot_title()));
    }
    good_checkpoint_ = ckpt_path_, good_step_ = step;
  }

  model::EvaluateOptions eval_options() const {
    return {.max_sequences = o_.data.empty() ? 0 : std::max<std::int64_t>(1, std::min(kTrainEvalWindows,
                                                                                      kTrainEvalTokens / o_.block)),
            .device = device_,
            .dtype = dtype_};
  }

  std::string plot_title() const {
    return o_.data.empty() ? fmt::format("attograd: {} {}", o_.task, o_.task_size)
                           : fmt::format("attograd: {}", data::reads_token_files(dataset_spec(o_))
                                                             ? run_name(o_)
                                                             : fs::path(o_.data).filename().string());
  }

  // ---- 5. the summary: the last line, and what train_command returns
  TrainSummary summarize() const {
    TrainSummary summary;
    summary.rank = comm_.rank(), summary.processes = comm_.size();
    summary.run_dir = o_.out;
    summary.checkpoint = ckpt_path_;
    summary.steps_done = std::max(first_step_, stopped_at_);
    summary.final_train_loss = progress_->smoothed_loss();
    summary.val_loss = last_eval_.loss;
    summary.accuracy = last_eval_.accuracy;
    const auto* text = dynamic_cast<const data::TextData*>(data_.get());
    if (text) summary.unigram_entropy = text->unigram_entropy();
    summary.seconds = elapsed();
    summary.stop_signal = stopped_at_ < last_step_ ? stopped_by_ : 0;
    std::string line = fmt::format("done: step {} in {:.1f} s ({:.1f} s training); held-out loss {:.4f}",
                                   summary.steps_done, summary.seconds, train_seconds_, summary.val_loss);
    if (!last_eval_.whole()) line += fmt::format(" over the first {} validation windows", model::coverage(last_eval_));
    if (summary.accuracy) line += fmt::format(", exact match {:.2f}%", 100 * *summary.accuracy);
    if (text) line += fmt::format(" (unigram entropy {:.4f})", summary.unigram_entropy);
    if (comm_.size() > 1)
      line += fmt::format("; {} processes, {:.0f}% of the steps' time in communication", comm_.size(),
                          train_seconds_ > 0 ? 100 * comm_seconds_ / train_seconds_ : 0.0);
    line += fmt::format("; checkpoint {}", ckpt_path_);
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
    return summary;
  }

  TrainOptions o_;
  distributed::Communicator& comm_;
  const bool reporter_;
  std::FILE* out_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> silent_{nullptr, std::fclose};
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

  // Built before the first step (build, connect_processes). device_reduction_
  // (NCCL on GPUs) is declared before the optimizer and the reducer that use it,
  // so it outlives them.
  output::LoadedCheckpoint resumed_;
  std::unique_ptr<data::Dataset> data_;
  std::unique_ptr<nn::GPT> model_;
  distributed::DeviceReduction device_reduction_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  distributed::ShardedOptimizer* sharded_ = nullptr;  // optimizer_ itself, with --shard-optimizer
  std::unique_ptr<distributed::GradientReducer> reducer_;
  Device device_ = Device::cpu();
  DType dtype_ = DType::f32;  // bfloat16: every forward under autocast, float32 master weights
  std::vector<nn::NamedParameter> params_;
  std::int64_t first_step_ = 0, last_step_ = 0;

  // The run directory and what is written there (rank 0's).
  std::string ckpt_path_, best_path_;
  std::optional<double> best_loss_;  // --keep-best: the held-out loss of best.safetensors
  std::optional<output::RunDirectory> run_directory_;
  std::optional<output::MetricsLog> metrics_;
  output::CheckpointInfo info_;
  std::size_t optimizer_bytes_ = 0;
  double peak_flops_ = 0;  // this CPU's measured float32 FMA peak; 0: no MFU shown (quiet, GPU, other ranks)

  // The steps so far.
  std::optional<Progress> progress_;
  model::EvalResult last_eval_;
  double train_seconds_ = 0, train_tokens_ = 0, comm_seconds_ = 0;  // the steps alone, for tokens per second
  std::string good_checkpoint_;  // the last checkpoint known to be good ("": none yet)
  std::int64_t good_step_ = 0;
  std::int64_t stopped_at_ = 0;
  int stopped_by_ = 0;
};

}  // namespace

TrainSummary train_command(TrainOptions options, std::FILE* out) { return TrainingRun(std::move(options), out).run(); }

}  // namespace attograd::train::cli
