#pragma once
// What the trainer asks of its data, whether a synthetic task or a text file:
// training batches that are a pure function of (seed, step), so a resumed run
// draws exactly the batches the uninterrupted one would have, and a fixed
// held-out set.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/philox.h"
#include "tensor/tensor.h"
#include "train/data/vocabulary.h"

namespace attograd::train::data {

// Targets equal to this carry no loss (prompt positions of a task).
inline constexpr std::int64_t kIgnoreIndex = -100;

// How many of `targets` carry a loss (are not kIgnoreIndex).
inline std::int64_t counted_targets(const std::vector<std::int64_t>& targets) {
  std::int64_t n = 0;
  for (std::int64_t t : targets) n += t != kIgnoreIndex;
  return n;
}

struct Batch {
  Tensor tokens;   // (B, T) int64
  Tensor targets;  // (B, T) int64: the next token, or kIgnoreIndex
};

// A seekable random stream: draw n of stream `index` is philox(seed, index, n),
// computed, never stepped through, so any example can be drawn on its own.
class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::uint64_t index) : seed_(seed), base_(index << 20) {}
  std::uint32_t next_u32() {
    const std::uint32_t bits = philox4x32(base_ + draws_ / 4, seed_).v[draws_ % 4];
    ++draws_;
    return bits;
  }
  // Uniform in [0, n): the high half of a 32x32-bit product (bias below 2^-32 * n; fine for data).
  std::uint64_t below(std::uint64_t n) { return (static_cast<std::uint64_t>(next_u32()) * n) >> 32; }
  // Uniform in [0, n) for any n (windows of terabytes of tokens): 64 bits, by the same product.
  std::uint64_t below_wide(std::uint64_t n) {
    const std::uint64_t bits = static_cast<std::uint64_t>(next_u32()) << 32 | next_u32();
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
  }
  double uniform() { return next_u32() * (1.0 / 4294967296.0); }  // [0, 1)

 private:
  std::uint64_t seed_, base_;
  std::uint64_t draws_ = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const Vocabulary& vocabulary() const = 0;
  // Training batch number `step` of `batch` rows and (at most) `block` positions.
  virtual Batch train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const = 0;
  // The held-out set: eval_sequences(block) rows, the same on every call, made a
  // slice at a time (rows [first, first + count)) so that evaluating a large
  // split never holds all of it as batches at once.
  virtual std::int64_t eval_sequences(std::int64_t block) const = 0;
  virtual Batch eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const = 0;
  // Tasks report exact-match accuracy on their held-out answers; text does not.
  virtual bool has_answers() const = 0;
  // A prompt to sample from when the user gives none.
  virtual std::string default_prompt() const = 0;
  // Throws "[--data] ..." unless training and held-out rows of `block` positions can be drawn.
  virtual void check_block(std::int64_t /*block*/) const {}
  // What a checkpoint keeps to know the same data again (--resume); empty for the tasks, which are their seed.
  virtual std::string fingerprint() const { return {}; }
};

// Which data a run reads (train/options.h's dataset_spec makes it from the flags).
struct DatasetSpec {
  std::string data;          // --data: a UTF-8 text file or token files (token_data.h), or empty for a task
  std::string format;        // --data-format: text, shards or nanogpt ("" or auto: by the name, token_data.h)
  std::string val_data;      // --val-data: token files held out
  std::string tokenizer;     // --tokenizer: GPT-2's files, for token files
  std::int64_t vocab_size = 0;  // --vocab-size: token ids with no tokenizer
  std::string task;          // --task: sort, reverse, copy or add
  int task_size = 8;         // --task-size
  std::int64_t heldout = 0;  // --heldout: problems held out of a task
  std::uint64_t seed = 0;    // --seed
};

// The task, text file or token files `spec` names; with `vocabulary` (from a
// checkpoint) the data must fit it, and with `fingerprint` (a resumed run's)
// it must be that very data ("[--resume] ... is not the text ..."). Reading and
// decoding errors name the flag and the file.
std::unique_ptr<Dataset> make_dataset(const DatasetSpec& spec, const Vocabulary* vocabulary = nullptr,
                                      const std::string& fingerprint = {});

// Whether `spec` reads token files (by --data-format, else by --data's name).
bool reads_token_files(const DatasetSpec& spec);

}  // namespace attograd::train::data
