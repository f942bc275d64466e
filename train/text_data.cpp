#include "train/text_data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tensor/error.h"

namespace attograd {

std::string read_text_file(const std::string& path, const char* flag) {
  AG_CHECK(!std::filesystem::is_directory(path), flag, "'{}' is a directory, not a file", path);
  std::ifstream in(path, std::ios::binary);
  AG_CHECK(in.good(), flag, "cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  // A directory opens but fails to read; so do unreadable devices.
  AG_CHECK(!in.bad(), flag, "cannot read '{}': {}", path, std::strerror(errno));
  std::string text = bytes.str();
  AG_CHECK(!text.empty(), flag, "'{}' is empty (or not a regular file)", path);
  return text;
}

TextData::TextData(const std::string& text, std::string path, std::uint64_t seed, std::optional<Tokenizer> tokenizer)
    : path_(std::move(path)), seed_(seed) {
  const std::string what = fmt::format("--data {}", path_);
  // Both paths report invalid UTF-8 with its byte offset.
  tokenizer_ = tokenizer ? *tokenizer : Tokenizer::from_text(text, what);
  std::vector<std::int64_t> ids = tokenizer_.encode(text, what);
  const auto split = static_cast<std::size_t>(std::llround(ids.size() * (1.0 - kValidationFraction)));
  train_.assign(ids.begin(), ids.begin() + split);
  validation_.assign(ids.begin() + split, ids.end());
}

double TextData::unigram_entropy() const {
  std::vector<double> counts(tokenizer_.size());
  for (std::int64_t id : train_) counts[id] += 1;
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= c / train_.size() * std::log(c / train_.size());
  return h;
}

void TextData::check_block(std::int64_t block) const {
  AG_CHECK(validation_tokens() >= block + 1, "--data",
           "'{}' is too short: its validation split ({} of {} characters) needs at least block size + 1 = {}", path_,
           validation_tokens(), validation_tokens() + train_tokens(), block + 1);
  AG_CHECK(train_tokens() >= block + 1, "--data", "'{}' is too short for a block size of {}", path_, block);
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

std::vector<Batch> TextData::eval_batches(std::int64_t batch, std::int64_t block) const {
  check_block(block);
  const std::int64_t T = block;
  const std::int64_t windows = std::min(kMaxEvalWindows, (validation_tokens() - 1) / T);
  std::vector<Batch> batches;
  for (std::int64_t w0 = 0; w0 < windows; w0 += batch) {
    const std::int64_t B = std::min(batch, windows - w0);
    std::vector<std::int64_t> tokens(B * T), targets(B * T);
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t start = (w0 + b) * T;
      std::copy_n(validation_.begin() + start, T, tokens.begin() + b * T);
      std::copy_n(validation_.begin() + start + 1, T, targets.begin() + b * T);
    }
    batches.push_back({from_vector(tokens, {B, T}), from_vector(targets, {B, T})});
  }
  return batches;
}

std::string TextData::default_prompt() const {
  // The text's first character: a context the model has seen.
  return tokenizer_.decode({train_.front()});
}

}  // namespace attograd
