#pragma once
// Everything a training run is made of, as one struct: the data, the model,
// the optimisation, and the run's own settings. The first three are saved in
// every checkpoint (`config` metadata) and fixed on --resume; the run settings
// (threads, device, output, when to stop, printing) may change between runs.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/dtype.h"
#include "train/data/dataset.h"

namespace attograd::train {

struct TrainOptions {
  // ---- data: a synthetic task, or language modelling when `data` is set
  std::string task = "sort";
  int task_size = 8;             // digits (sort, reverse, copy) or digits per operand (add)
  std::int64_t heldout = 2000;   // held-out problems evaluated
  std::string data;              // a UTF-8 text file (characters), or token files (train/data/token_data.h)
  std::string data_format;       // text, shards or nanogpt; "" (auto): token files by their name
  std::string val_data;          // token files held out ("": found beside `data`)
  std::int64_t vocab_size = 0;   // the model's rows: ids with no tokenizer, or padding past it (0: the tokenizer's)

  // ---- model
  std::int64_t layers = 2, heads = 4, width = 64;
  std::int64_t block = 16;       // context length: a task's sequence length - 1, or longer
  double dropout = 0.0;

  // ---- optimisation
  std::string optimizer = "adamw";  // adamw | sgd
  std::int64_t batch = 64, steps = 400;
  double lr = 5e-3;
  std::int64_t warmup = 30;         // linear warm-up steps, then the schedule's decay to lr * min_lr_ratio
  double min_lr_ratio = 0.1;
  std::string schedule = "cosine";  // cosine | linear | constant | wsd (train/optim/schedule.h)
  double decay_fraction = 0.2;      // wsd: the last fraction of the steps that decays
  double weight_decay = 0.1;        // AdamW: decoupled; SGD: L2 (never on biases, norms, embeddings)
  double beta1 = 0.9, beta2 = 0.99; // AdamW
  double momentum = 0.9;            // SGD
  double grad_clip = 1.0;           // max global gradient norm; 0 disables
  std::uint64_t seed = 1337;

  // ---- the run itself (not part of a checkpoint's identity)
  int threads = 0;                  // 0: every core
  std::string device = "cpu";
  // float32, or bfloat16: products and attention in bfloat16 under autocast
  // (autograd/autocast.h), float32 master weights. Kept in checkpoints, and what
  // --resume, eval and sample continue in unless told otherwise ("": that).
  std::string dtype;
  std::int64_t eval_interval = 100; // steps between evaluations (and checkpoints)
  std::string out;                  // run directory; empty: runs/<task or file name>
  std::string resume;               // checkpoint to continue from
  // Weights a new run starts from (an attograd checkpoint or a Hugging Face GPT-2
  // folder): its model's shape and vocabulary; a shorter block crops the positions.
  std::string init_from;
  // GPT-2's tokenizer files for token data (a checkpoint keeps which
  // tokenizer, by fingerprint and folder: train/data/vocabulary.h).
  std::string tokenizer;
  std::int64_t stop_at = 0;         // stop (and save) after this step; 0: run to `steps`
  bool quiet = false;               // no progress line (evaluations and the summary still print)
  bool keep_best = false;           // also keep the weights of the lowest held-out loss (best.safetensors)
  std::int64_t sample_interval = 0; // steps between samples printed while training; 0: none
  // MiB of softmax probabilities each attention layer may keep for its backward on the CPU
  // (AttentionOptions::saved_probs_limit); -1: automatic (autograd/attention.h's rule).
  std::int64_t attention_memory = -1;

  // ---- data parallelism (mpirun -np N attograd train ...): how, not what, is computed
  std::int64_t grad_accum = 1;      // micro-batches per process and step (their gradients add up)
  bool shard_optimizer = false;     // ZeRO-1: each process keeps 1/N of the optimizer state
  // Pieces of every step's batch summed in one fixed order (train/distributed/fixed_split.h): the same bits
  // on any process count dividing it. 0: off (the buckets' all-reduce, overlapping backward).
  std::int64_t fixed_split = 0;
  // Seconds any wait for the other processes may last before this process stops the run,
  // naming who went silent (train/distributed/watchdog.h): longer than rank 0's checkpoint
  // and evaluation, which the others wait through.
  double comm_timeout = 600;
};

// The preset a task trains with when a flag is not given, chosen by
// `options.task`, `options.data` and (for the block size) `options.task_size`
// when `task_size_given`. The struct's own defaults are sort's preset.
TrainOptions preset_for(const TrainOptions& options, bool task_size_given);

// Whether the options train a synthetic task: not text or tokens, and not a
// model imported with no data of its own (whose task is empty).
inline bool is_task_run(const TrainOptions& o) { return o.data.empty() && !o.task.empty(); }

// Throws "[--flag] ..." naming the first invalid flag and its value.
// Checks what needs no file: sizes, ranges, finiteness, heads dividing width,
// the task name, the optimizer and the device.
void validate(const TrainOptions& options);

// Every flag of `attograd train` with its value as given ("--lr" -> "0.005"),
// for telling which flag differs between the processes of one run.
std::vector<std::pair<std::string, std::string>> flag_values(const TrainOptions& options);

// The dtype a run computes in: "float32" or "bfloat16" (what `dtype` says, float32 when empty).
DType compute_dtype(const TrainOptions& options);

// The data the options name (--data, or --task with its size, held-out count and seed).
data::DatasetSpec dataset_spec(const TrainOptions& options);

// The JSON saved in checkpoints (data, model and optimisation fields) and back.
std::string config_to_json(const TrainOptions& options);
TrainOptions config_from_json(const std::string& json);  // run fields keep their defaults

}  // namespace attograd::train
