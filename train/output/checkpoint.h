#pragma once
// A run's checkpoint, one safetensors file (train/output/safetensors.h):
//   tensors   every parameter under its model name ("blocks.0.attn.qkv.weight",
//             float32, loadable by safetensors/torch as a state dict), and the
//             optimizer's buffers as "optim.<buffer>.<parameter>"
//             ("optim.exp_avg.wte.weight")
//   metadata  format, step, config (the run's options), vocab (what the ids
//             stand for: train/data/vocabulary.h), data (the data's
//             fingerprint), rng (data seed, dropout generator seed and offset)
//             and optimizer (its name and step count), each a JSON string
// Together they continue a run bit for bit: batches are a function of
// (seed, step) and dropout masks of the generator's (seed, offset).
#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>

#include "nn/gpt.h"
#include "train/data/vocabulary.h"
#include "train/optim/optimizer.h"
#include "train/options.h"

namespace attograd::train::output {

inline constexpr const char* kCheckpointFormat = "attograd.checkpoint.v1";

struct CheckpointInfo {
  TrainOptions config;  // data, model and optimisation fields
  data::Vocabulary vocabulary;
  std::int64_t step = 0;  // optimizer steps taken
  // A text run's file or a token run's files as their dataset's fingerprint()
  // gives it, checked by --resume; empty for tasks (and in checkpoints from
  // before it was kept).
  std::string data_fingerprint;
  // The held-out loss of these weights, where it is known when they are saved (--keep-best's best.safetensors).
  std::optional<double> val_loss;
};

// What a checkpoint keeps of an optimizer. A sharded optimizer's state is
// gathered from every process into one of these first (train/distributed/sharded_optimizer.h).
struct OptimizerState {
  std::string name;  // "adamw", "sgd"; empty: no optimizer
  std::int64_t step_count = 0;
  std::map<std::string, Tensor> buffers;  // "exp_avg.<parameter name>", ...
};
OptimizerState optimizer_state(const optim::Optimizer* optimizer);  // empty for null

void save_checkpoint(const std::string& path, const nn::GPT& model, const OptimizerState& optimizer,
                     const CheckpointInfo& info);
inline void save_checkpoint(const std::string& path, const nn::GPT& model, const optim::Optimizer* optimizer,
                            const CheckpointInfo& info) {
  save_checkpoint(path, model, optimizer_state(optimizer), info);
}

struct LoadedCheckpoint {
  CheckpointInfo info;
  std::unique_ptr<nn::GPT> model;  // parameters loaded, dropout generator restored, on the CPU
  std::map<std::string, Tensor> optimizer_state;  // "exp_avg.<name>", ... (empty when none was saved)
  std::string optimizer_name;                     // "adamw", "sgd" or empty
  std::int64_t optimizer_steps = 0;
};

// A checkpoint is untrusted input: every field is checked, and a malformed
// file gives "[path] ..." naming what is wrong. Nothing is allocated beyond the
// file's own size before its tensors are known to fit the model its config
// describes (dtype, vocabulary rows, parameter count, then names and shapes).
// `flag` names the option the path came from when the file cannot be read.
// A folder with a config.json is read as Hugging Face's GPT-2 (load_hf_folder).
// Weights only leaves the optimizer's state unread (optimizer_state empty):
// what sample, eval, export and --init-from need, a third of an AdamW run's file.
enum class CheckpointParts { everything, weights };
LoadedCheckpoint load_checkpoint(const std::string& path, const char* flag = "--ckpt",
                                 CheckpointParts parts = CheckpointParts::everything);
bool is_hf_folder(const std::string& path);
// What a checkpoint file says of its run (config, vocabulary, step, val_loss),
// its metadata checked as load_checkpoint checks it, no tensor read and no
// model built.
CheckpointInfo read_checkpoint_info(const std::string& path, const char* flag);
// GPT-2 weights in Hugging Face's layout (train/output/hf_gpt2.h) as a
// checkpoint of step 0 with no optimizer and no data of its own (its config's
// task and data are empty): sample, eval --data and train --init-from read it.
// Its vocabulary is the folder's tokenizer (vocab.json and merges.txt, or
// encoder.json and vocab.bpe) where it holds one, else ids of vocab_size.
LoadedCheckpoint load_hf_folder(const std::string& dir);
// The same from the file's bytes; `what` names it in errors.
LoadedCheckpoint parse_checkpoint(std::string_view bytes, const std::string& what);

}  // namespace attograd::train::output
