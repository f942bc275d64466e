// `attograd sample`, `eval` and `attention`: each loads a checkpoint and asks
// one thing of the model. (`train` is in train/cli/trainer.cpp.)
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "base/error.h"
#include "cuda/runtime.h"
#include "cpu/parallel.h"
#include "train/cli/commands.h"
#include "train/cli/progress.h"
#include "train/data/tasks.h"
#include "train/data/utf8.h"
#include "train/files.h"
#include "train/model/evaluate.h"
#include "train/model/generate.h"
#include "train/model/gpt.h"
#include "train/output/checkpoint.h"
#include "train/output/hf_gpt2.h"
#include "train/output/safetensors.h"
#include "train/output/svg.h"

namespace attograd::train::cli {

namespace {

Device checked_device(const std::string& name) {
  TrainOptions probe;  // validate() owns the device checks and their messages
  probe.device = name;
  AG_CHECK(name == "cpu" || name == "cuda", "--device", "unknown device '{}' (cpu, cuda)", name);
  if (name == "cuda") validate(probe);
  return name == "cuda" ? Device::cuda() : Device::cpu();
}

// The dtype a command computes in: `name`, or the checkpoint's run's when empty;
// checked against the device as `attograd train` checks it.
DType checked_dtype(const std::string& name, const output::LoadedCheckpoint& ckpt, const std::string& device) {
  TrainOptions probe;  // validate() owns the dtype checks and their messages
  probe.dtype = name.empty() ? ckpt.info.config.dtype : name;
  probe.device = device;
  validate(probe);
  return compute_dtype(probe);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

void set_threads(int threads) {
  AG_CHECK(threads >= 0 && threads <= 1024, "--threads", "must be in [1, 1024] (0: every core), got {}", threads);
  if (threads > 0) set_num_threads(threads);
}

}  // namespace

std::string sample_command(const SampleOptions& o, std::FILE* out) {
  if (o.tokens)
    AG_CHECK(*o.tokens >= 0 && *o.tokens <= 1'000'000, "--tokens", "must be in [0, 1000000], got {}", *o.tokens);
  AG_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "--temperature", "must be finite and >= 0, got {}",
           o.temperature);
  AG_CHECK(o.top_k >= 0, "--top-k", "must be >= 0 (0: all), got {}", o.top_k);
  AG_CHECK(o.num_samples >= 1 && o.num_samples <= 10000, "--num-samples", "must be in [1, 10000], got {}",
           o.num_samples);
  AG_CHECK(!o.prompt || o.prompt_file.empty(), "--prompt-file", "cannot go with --prompt: give one of them");
  const Device device = checked_device(o.device);
  set_threads(o.threads);
  output::LoadedCheckpoint ckpt = output::load_checkpoint(o.ckpt, "--ckpt", output::CheckpointParts::weights);
  const DType dtype = checked_dtype(o.dtype, ckpt, o.device);
  const data::Vocabulary tok = ckpt.info.vocabulary.attached(o.tokenizer, "--tokenizer");

  std::string prompt;
  if (o.prompt) {
    prompt = *o.prompt;
  } else if (!o.prompt_file.empty()) {
    prompt = read_file(o.prompt_file, "--prompt-file", std::uint64_t{16} << 20);
  } else if (const auto eot = tok.end_of_text()) {
    prompt = tok.decode({*eot});  // unconditional: a document's start
  } else {
    // The run's own default context; a text file that has gone away still leaves its vocabulary.
    try {
      prompt = data::make_dataset(dataset_spec(ckpt.info.config), &tok)->default_prompt();
    } catch (const Error&) {
      prompt = tok.token_label(0);
    }
  }
  AG_CHECK(!prompt.empty(), "--prompt", "must hold at least one character");
  const std::vector<std::int64_t> ids = tok.encode(prompt, o.prompt_file.empty() ? "--prompt" : "--prompt-file");
  const TrainOptions& config = ckpt.info.config;
  const std::int64_t tokens = o.tokens                ? *o.tokens
                              : is_task_run(config) ? data::task_answer_length(data::parse_task(config.task), config.task_size)
                                                    : 200;
  if (!device.is_cpu()) ckpt.model->to(device);
  model::GenerateOptions generate{.tokens = tokens,
                                  .temperature = o.temperature,
                                  .top_k = o.top_k,
                                  .top_p = o.top_p,
                                  .seed = o.seed,
                                  .use_cache = o.use_cache,
                                  .dtype = dtype,
                                  .vocab_limit = tok.size()};
  // A GPT-2 document ends at <|endoftext|>: what follows would be another.
  if (o.stop_at_end_of_text && tok.end_of_text()) generate.stop_token = *tok.end_of_text();
  std::string printed;
  for (std::int64_t n = 0; n < o.num_samples; ++n) {
    generate.stream = static_cast<std::uint64_t>(n);
    if (n > 0) printed += std::string(kSampleSeparator) + "\n";
    printed += tok.decode(model::generate(*ckpt.model, ids, generate, device)) + "\n";
  }
  std::fputs(printed.c_str(), out);
  std::fflush(out);
  printed.pop_back();  // the caller gets the text, not the line's end
  return printed;
}

EvalSummary eval_command(const EvalOptions& o, std::FILE* out, std::FILE* progress) {
  if (o.max_batches)
    AG_CHECK(*o.max_batches >= 1, "--max-batches", "must be >= 1 (leave it out to read every batch), got {}",
             *o.max_batches);
  const Device device = checked_device(o.device);
  set_threads(o.threads);
  output::LoadedCheckpoint ckpt = output::load_checkpoint(o.ckpt, "--ckpt", output::CheckpointParts::weights);
  const DType dtype = checked_dtype(o.dtype, ckpt, o.device);
  TrainOptions config = ckpt.info.config;
  if (!o.data.empty()) {
    AG_CHECK(!is_task_run(config), "--data", "'{}' was trained on the {} task, not on text or tokens", o.ckpt,
             config.task);
    config.data = o.data;
  }
  AG_CHECK(!config.data.empty() || is_task_run(config), "--data",
           "'{}' holds no data of its own (a model imported from Hugging Face's layout): name token files to "
           "evaluate on",
           o.ckpt);
  const auto data = data::make_dataset(dataset_spec(config), &ckpt.info.vocabulary);
  const char* unit = ckpt.info.vocabulary.kind() == data::Vocabulary::Kind::characters ? "characters" : "tokens";
  if (!device.is_cpu()) ckpt.model->to(device);

  const std::int64_t block = ckpt.model->config().block_size;
  model::EvaluateOptions options{.batch = model::eval_batch_rows(ckpt.model->config()), .device = device, .dtype = dtype};
  const std::int64_t batches = ceil_div(data->eval_sequences(block), options.batch);
  if (o.max_batches && *o.max_batches < batches) options.max_sequences = *o.max_batches * options.batch;
  CountProgress shown(progress, "eval", is_task_run(config) ? "problems" : "windows",
                      {.interactive = is_interactive(progress)});
  options.after_batch = [&](std::int64_t done, std::int64_t total) { shown.update(done, total); };
  const model::EvalResult r = model::evaluate(*ckpt.model, *data, options);
  shown.finish();

  // "over the whole validation split: all 4,120 windows of 64 characters (263,680 tokens)", or
  // "over the first 1,000 of 4,120 windows of 64 characters of the validation split (64,000 tokens;
  // --max-batches 2 of 9 batches)"; a task's held-out problems likewise.
  const std::string capped =
      r.whole() ? "" : fmt::format("; --max-batches {} of {} batches", r.batches, r.total_batches);
  const std::string covered = r.whole() ? model::coverage(r) : "the first " + model::coverage(r);
  std::string line = fmt::format("{} (step {}): held-out loss {:.4f} over ", o.ckpt, ckpt.info.step, r.loss);
  if (is_task_run(config))
    line += fmt::format("{} held-out problems ({} answer tokens{})", covered, model::thousands(r.targets), capped);
  else if (r.whole())
    line += fmt::format("the whole validation split: {} windows of {} {} ({} tokens)", covered, block, unit,
                        model::thousands(r.targets));
  else
    line += fmt::format("{} windows of {} {} of the validation split ({} tokens{})", covered, block, unit,
                        model::thousands(r.targets), capped);
  // A language model's loss as the number of equally likely next tokens it amounts to.
  if (!is_task_run(config)) line += fmt::format(", perplexity {:.2f}", std::exp(r.loss));
  if (r.accuracy) line += fmt::format(", exact match {:.2f}%", 100 * *r.accuracy);
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
  return {.loss = r.loss, .accuracy = r.accuracy, .examples = r.examples, .heldout = r.heldout, .targets = r.targets};
}

void attention_command(const AttentionPlotOptions& o, std::FILE* out) {
  set_threads(o.threads);
  AG_CHECK(!o.out.empty(), "--out", "must name a file");
  const std::filesystem::path parent = std::filesystem::absolute(o.out).parent_path();
  AG_CHECK(std::filesystem::is_directory(parent), "--out", "cannot write '{}': '{}' is not a directory", o.out,
           parent.string());
  check_replaceable("--out", o.out);
  output::LoadedCheckpoint ckpt = output::load_checkpoint(o.ckpt, "--ckpt", output::CheckpointParts::weights);
  const data::Vocabulary tok = ckpt.info.vocabulary.attached(o.tokenizer, "--tokenizer");
  const std::vector<std::int64_t> ids = tok.encode(o.text, "--text");
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), block = ckpt.info.config.block;
  AG_CHECK(T >= 1 && T <= block, "--text", "must be 1 to {} tokens (the block size), got {}", block, T);
  output::AttentionMaps maps;
  for (std::int64_t id : ids) maps.tokens.push_back(tok.token_label(id));
  maps.weights = model::attention_weights(*ckpt.model, from_vector(ids, {1, T}));
  const std::filesystem::path path(o.out);
  const std::string svg = output::attention_svg(maps, fmt::format("attention of {} on \"{}\"", o.ckpt, o.text));
  write_file_atomically("--out", path.string(), svg);
  std::fprintf(out, "wrote %s: %zu layers x %zu heads, %lld x %lld weights each\n", o.out.c_str(), maps.weights.size(),
               maps.weights.empty() ? size_t{0} : maps.weights[0].size(), static_cast<long long>(T),
               static_cast<long long>(T));
  std::fflush(out);
}

void export_command(const ExportOptions& o, std::FILE* out) {
  AG_CHECK(!o.hf.empty(), "--hf", "must name a folder");
  AG_CHECK(!std::filesystem::exists(o.hf) || std::filesystem::is_directory(o.hf), "--hf", "'{}' is not a folder", o.hf);
  const output::LoadedCheckpoint ckpt = output::load_checkpoint(o.ckpt, "--ckpt", output::CheckpointParts::weights);
  const data::Vocabulary& kept = ckpt.info.vocabulary;
  // GPT-2's files go with the weights, checked to be the model's own, as transformers names them.
  const bool with_tokenizer = kept.kind() == data::Vocabulary::Kind::gpt2 || !o.tokenizer.empty();
  const data::Vocabulary vocabulary = with_tokenizer ? kept.attached(o.tokenizer, "--tokenizer") : kept;
  output::write_hf_gpt2(o.hf, *ckpt.model, {.vocab_size = vocabulary.size()});
  if (with_tokenizer) {
    const data::BpeFiles from = data::BpeFiles::in(vocabulary.folder());
    const std::filesystem::path to(o.hf);
    for (const auto& [source, name] : {std::pair{from.encoder, "vocab.json"}, std::pair{from.merges, "merges.txt"}})
      write_file_atomically("--hf", (to / name).string(), read_file(source.string(), "--tokenizer", std::uint64_t{64} << 20));
  }
  std::fprintf(out, "wrote %s: GPT-2 of %lld layers, width %lld, %lld positions, vocabulary %lld%s\n", o.hf.c_str(),
               static_cast<long long>(ckpt.info.config.layers), static_cast<long long>(ckpt.info.config.width),
               static_cast<long long>(ckpt.info.config.block), static_cast<long long>(vocabulary.size()),
               with_tokenizer ? ", with GPT-2's tokenizer" : "");
  std::fflush(out);
}

data::PrepareSummary prepare_command(const data::PrepareOptions& o, int threads, std::FILE* out,
                                     std::FILE* progress) {
  set_threads(threads);
  CountProgress shown(progress, "prepare", "MB read", {.interactive = is_interactive(progress)});
  const data::PrepareSummary s = data::prepare_shards(o, [&](const data::PrepareProgress& p) {
    shown.update(p.bytes_read >> 20, p.total_bytes < 0 ? -1 : p.total_bytes >> 20);
  });
  shown.finish();
  const double mb = static_cast<double>(s.done.bytes_read) / 1e6;
  std::fprintf(out, "prepared %s documents (%.1f MB) in %.1f s (%.1f MB/s): %s train tokens in %zu shards, %s "
               "validation tokens in %zu, in %s\n",
               model::thousands(s.done.documents).c_str(), mb, s.done.seconds, mb / std::max(s.done.seconds, 1e-9),
               model::thousands(s.train_tokens).c_str(), s.train_shards.size(), model::thousands(s.val_tokens).c_str(),
               s.val_shards.size(), o.out.c_str());
  std::fflush(out);
  return s;
}

}  // namespace attograd::train::cli
