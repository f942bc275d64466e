#include "train/data/text_data.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "base/fnv.h"

namespace attograd::train::data {

namespace {
std::string text_fingerprint(const std::string& bytes) {
  return fmt::format("{} bytes, FNV-1a 64 {:016x}", bytes.size(), fnv1a64(bytes));
}
}  // namespace

TextData::TextData(const std::string& text, std::string path, std::uint64_t seed, std::optional<Tokenizer> tokenizer,
                   const std::string& expected_fingerprint)
    : path_(std::move(path)), fingerprint_(text_fingerprint(text)), seed_(seed) {
  // Before decoding: another text may hold characters the vocabulary lacks, and
  // "not the text" is the error that says what happened.
  AG_CHECK(expected_fingerprint.empty() || fingerprint_ == expected_fingerprint, "--resume",
           "'{}' is not the text the checkpoint was trained on ({} now, {} then): a run continues only on its own "
           "data",
           path_, fingerprint_, expected_fingerprint);
  const std::string what = fmt::format("--data {}", path_);
  // NUL is valid UTF-8 but never part of text: it marks a binary file.
  const std::size_t nul = text.find('\0');
  AG_CHECK(nul == std::string::npos, what, "a binary file, not text: NUL byte at byte {}", nul);
  // Both paths report invalid UTF-8 with its byte offset.
  vocabulary_ = Vocabulary::of_characters(tokenizer ? *tokenizer : Tokenizer::from_text(text, what));
  std::vector<std::int64_t> ids = vocabulary_.encode(text, what);
  AG_CHECK(!ids.empty(), what, "is empty");
  const auto split = static_cast<std::size_t>(std::llround(ids.size() * (1.0 - kValidationFraction)));
  train_.assign(ids.begin(), ids.begin() + split);
  validation_.assign(ids.begin() + split, ids.end());
}

double TextData::unigram_entropy() const {
  std::vector<double> counts(vocabulary_.size());
  for (std::int64_t id : train_) counts[id] += 1;
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= c / train_.size() * std::log(c / train_.size());
  return h;
}

void TextData::check_block(std::int64_t block) const {
  AG_CHECK(validation_tokens() >= block + 1, "--data",
           "'{}' is too short for --block {}: its validation split ({} of {} characters) needs at least block + 1 = {}",
           path_, block, validation_tokens(), validation_tokens() + train_tokens(), block + 1);
  AG_CHECK(train_tokens() >= block + 1, "--data", "'{}' is too short for --block {}: its training split holds {}",
           path_, block, train_tokens());
}

Batch TextData::train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const {
  check_block(block);
  const std::int64_t T = block;
  std::vector<std::int64_t> tokens(batch * T), targets(batch * T);
  for (std::int64_t b = 0; b < batch; ++b) {
    CounterRng rng(seed_, step * batch + b);
    const auto start = static_cast<std::int64_t>(rng.below(train_tokens() - T));
    std::copy_n(train_.begin() + start, T, tokens.begin() + b * T);
    std::copy_n(train_.begin() + start + 1, T, targets.begin() + b * T);
  }
  return {from_vector(tokens, {batch, T}), from_vector(targets, {batch, T})};
}

std::int64_t TextData::eval_sequences(std::int64_t block) const {
  check_block(block);
  return (validation_tokens() - 1) / block;
}

Batch TextData::eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const {
  const std::int64_t windows = eval_sequences(block), T = block;
  AG_CHECK(first >= 0 && count >= 1 && first <= windows - count, "eval",
           "windows [{}, {}) are outside the {} windows of '{}'", first, first + count, windows, path_);
  const std::int64_t B = count;
  std::vector<std::int64_t> tokens(B * T), targets(B * T);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t start = (first + b) * T;
    std::copy_n(validation_.begin() + start, T, tokens.begin() + b * T);
    std::copy_n(validation_.begin() + start + 1, T, targets.begin() + b * T);
  }
  return {from_vector(tokens, {B, T}), from_vector(targets, {B, T})};
}

std::string TextData::default_prompt() const {
  // The text's first character: a context the model has seen.
  return vocabulary_.decode({train_.front()});
}

}  // namespace attograd::train::data
