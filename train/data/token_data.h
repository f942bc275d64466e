#pragma once
// Language modelling on token files (llm.c's shards or nanoGPT's .bin,
// train/data/shards.h), memory-mapped: nothing is read whole, so the data may
// be any size. A training row is a window of block + 1 tokens drawn uniformly
// from every window of every training file (a window never spans two files),
// as a pure function of (seed, step, row); the held-out rows tile each
// validation file with non-overlapping windows, file after file.
#include <cstdint>
#include <string>
#include <vector>

#include "train/data/dataset.h"
#include "train/data/shards.h"

namespace attograd::train::data {

// Which token files a run reads, from --data and --val-data, in byte order of
// their paths:
// - a folder: its *train*.bin and *val*.bin (llm.c's and `attograd prepare`'s
//   names), or its train.bin and val.bin for nanoGPT's format;
// - a file or a glob ("fineweb/*_train_*.bin"): those files, and for
//   validation --val-data, or else the same pattern with its name's last
//   "train" made "val".
// Errors name the flag: a pattern matching no file, no way to find the
// validation files, a file in both sets.
struct TokenFiles {
  std::vector<std::string> train, validation;
};
TokenFiles find_token_files(const std::string& data, const std::string& val_data, TokenFormat format);

// Whether --data names token files rather than text, for --data-format auto:
// a folder, a glob, or a name ending in .bin.
bool looks_like_token_files(const std::string& data);
// A short name for runs/<name>: the folder's, a glob's folder's, or the file's stem.
std::string token_data_name(const std::string& data);

class TokenData final : public Dataset {
 public:
  // Every file is mapped and its header checked here; token ids are checked
  // against the vocabulary's size where they are read. With a fingerprint (a
  // resumed run's), the files must be the same tokens ("[--resume] ... are not
  // the tokens ...").
  TokenData(const TokenFiles& files, TokenFormat format, Vocabulary vocabulary, std::uint64_t seed,
            const std::string& expected_fingerprint = {});

  std::int64_t train_tokens() const { return train_tokens_; }
  std::int64_t validation_tokens() const { return validation_tokens_; }
  // "F files, N tokens, FNV-1a 64 H", H over each file's token count and its
  // first and last MiB of tokens: cheap on terabytes, and enough to tell one
  // data set from another (a checkpoint keeps it for --resume).
  std::string fingerprint() const override { return fingerprint_; }

  // Dataset
  const Vocabulary& vocabulary() const override { return vocabulary_; }
  Batch train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const override;
  std::int64_t eval_sequences(std::int64_t block) const override;
  Batch eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const override;
  bool has_answers() const override { return false; }
  // GPT-2's <|endoftext|>: unconditional samples start at a document's start.
  std::string default_prompt() const override;
  void check_block(std::int64_t block) const override;

 private:
  std::vector<TokenFile> train_, validation_;
  Vocabulary vocabulary_;
  std::uint64_t seed_;
  std::int64_t train_tokens_ = 0, validation_tokens_ = 0;
  std::string fingerprint_;
};

}  // namespace attograd::train::data
