#pragma once
// Character-level language modelling on a UTF-8 text file: the vocabulary is
// the file's code points (or the checkpoint's, when resuming or evaluating),
// the first 90% of the characters train and the last 10% validate, and a
// training row is a random contiguous window of block + 1 characters.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/data/dataset.h"

namespace attograd::train::data {

// A character-level model holds its whole text in memory (8 bytes of token id
// per character): larger files are refused rather than read (train/files.h).
inline constexpr std::uint64_t kMaxTextBytes = std::uint64_t{256} << 20;

class TextData final : public Dataset {
 public:
  static constexpr double kValidationFraction = 0.1;

  // `text` is the file's content; `path` names it in errors. It must be UTF-8
  // (an error names the byte offset where it is not) without NUL bytes (a binary
  // file). With a tokenizer (from a checkpoint), every character must be in it;
  // with a fingerprint (a resumed run's), it must be that very text, checked
  // first ("[--resume] ... is not the text ...").
  TextData(const std::string& text, std::string path, std::uint64_t seed,
           std::optional<Tokenizer> tokenizer = std::nullopt, const std::string& expected_fingerprint = {});

  std::int64_t train_tokens() const { return static_cast<std::int64_t>(train_.size()); }
  std::int64_t validation_tokens() const { return static_cast<std::int64_t>(validation_.size()); }
  // Entropy in nats of the training split's character frequencies: the loss of
  // a model that ignores context, which a language model must beat.
  double unigram_entropy() const;
  // "N bytes, FNV-1a 64 H" of the file's bytes: a checkpoint keeps it, and --resume
  // continues only on the same text (another text would not be the same run).
  std::string fingerprint() const override { return fingerprint_; }

  // Dataset
  const Vocabulary& vocabulary() const override { return vocabulary_; }
  Batch train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const override;
  // The held-out rows are the non-overlapping windows that tile the validation
  // split from its start: window w is characters [w * block, (w + 1) * block]
  // (block inputs, each predicting the next), every one of them, so
  // (validation characters - 1) / block windows; only the last few characters,
  // too few for a window, are left out.
  std::int64_t eval_sequences(std::int64_t block) const override;
  Batch eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const override;
  bool has_answers() const override { return false; }
  std::string default_prompt() const override;
  // Throws "[--data] 'f' is too short for --block N ..." unless both splits hold a window.
  void check_block(std::int64_t block) const override;

 private:
  std::string path_;
  std::string fingerprint_;
  std::uint64_t seed_;
  Vocabulary vocabulary_;
  std::vector<std::int64_t> train_, validation_;
};

}  // namespace attograd::train::data
