#pragma once
// The six things the attograd program does, as functions the command line
// (train/cli/cli.cpp) and the tests call alike. Each prints to `out` and throws
// attograd::Error on a user mistake.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "train/data/prepare.h"
#include "train/options.h"

namespace attograd::train::cli {

struct TrainSummary {
  std::string run_dir, checkpoint;
  std::int64_t steps_done = 0;       // the last step taken (== options.steps unless stopped early)
  double final_train_loss = 0;       // smoothed
  double val_loss = 0;               // at the last step
  std::optional<double> accuracy;    // held-out exact match (tasks)
  double unigram_entropy = 0;        // text: the loss of a context-free model, for comparison
  double seconds = 0;                // wall-clock, evaluations included
  int stop_signal = 0;               // SIGINT or SIGTERM when one stopped the run (after saving a checkpoint)
  int rank = 0, processes = 1;       // this process among those of a data-parallel run (rank 0 reports)
};
// `options` must have its presets applied (the CLI does); validated here.
TrainSummary train_command(TrainOptions options, std::FILE* out);

// Printed between samples (nanoGPT's).
inline constexpr const char* kSampleSeparator = "---------------";

struct SampleOptions {
  std::string ckpt;
  std::optional<std::string> prompt;  // none: a held-out problem's prompt (tasks), the text's first character, or
                                      // GPT-2's <|endoftext|> (unconditional samples)
  std::string prompt_file;            // the prompt from this file instead
  std::optional<std::int64_t> tokens;  // none: the answer's length for tasks, 200 characters for text
  double temperature = 1.0;           // 0: greedy
  std::int64_t top_k = 0;             // 0: the whole vocabulary
  double top_p = 1.0;                 // nucleus sampling (train/model/generate.h); 1: off
  std::int64_t num_samples = 1;       // samples from the same prompt, each its own draws
  bool stop_at_end_of_text = true;    // GPT-2 models: a sample ends at <|endoftext|>
  std::uint64_t seed = 0;
  bool use_cache = true;              // a key/value cache: each new token costs one position
  int threads = 0;
  std::string device = "cpu";
  std::string dtype;                  // float32 or bfloat16; "": the checkpoint's
  std::string tokenizer;              // GPT-2's files, where the checkpoint's have moved or it kept none
};
// Prints each sample (prompt + generated text) on its own lines, kSampleSeparator between; returns what it printed
// without the last line's end.
std::string sample_command(const SampleOptions& options, std::FILE* out);

struct EvalOptions {
  std::string ckpt;
  std::string data;  // text runs: a file other than the one trained on
  std::optional<std::int64_t> max_batches;  // read only the first N batches; none: the whole held-out set
  int threads = 0;
  std::string device = "cpu";
  std::string dtype;  // float32 or bfloat16; "": the checkpoint's
};
struct EvalSummary {
  double loss = 0;
  std::optional<double> accuracy;
  std::int64_t examples = 0;  // held-out sequences read
  std::int64_t heldout = 0;   // held-out sequences there are: every window of a text's validation split
  std::int64_t targets = 0;   // tokens scored (tasks: answer tokens only)
};
// Prints one line to `out`; a long run also prints a progress line to `progress` (the CLI: stderr).
EvalSummary eval_command(const EvalOptions& options, std::FILE* out, std::FILE* progress = nullptr);

struct AttentionPlotOptions {
  std::string ckpt, text;
  std::string tokenizer;  // as SampleOptions::tokenizer
  std::string out = "attention.svg";
  int threads = 0;
};
void attention_command(const AttentionPlotOptions& options, std::FILE* out);

struct ExportOptions {
  std::string ckpt;
  std::string hf;         // the folder to write
  std::string tokenizer;  // GPT-2's files, where the checkpoint's have moved
};
// Writes the checkpoint's model as Hugging Face's GPT-2 (train/output/hf_gpt2.h)
// into options.hf, with the tokenizer's files as vocab.json and merges.txt when
// the model reads GPT-2 tokens; one line on `out`.
void export_command(const ExportOptions& options, std::FILE* out);

// Text to token shards (train/data/prepare.h) on `threads` threads (0:
// every core): a progress line on `progress` while it runs (not for stdin,
// whose size is not known ahead), then one line on `out`.
data::PrepareSummary prepare_command(const data::PrepareOptions& options, int threads, std::FILE* out,
                                     std::FILE* progress = nullptr);

}  // namespace attograd::train::cli
