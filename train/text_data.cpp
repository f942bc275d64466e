#include "train/text_data.h"

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

namespace attograd {

std::string read_text_file(const std::string& path, const char* flag, std::uint64_t max_bytes, int fifo_wait_ms) {
  AG_CHECK(!std::filesystem::is_directory(path), flag, "'{}' is a directory, not a file", path);
  // Opened without blocking: open() on a FIFO would wait for a writer for ever.
  // A FIFO then waits for its writer in poll() (no POLLHUP before one has come),
  // at most fifo_wait_ms; reads block again, as a pipe's writer may be slow.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  AG_CHECK(fd >= 0, flag, "cannot read '{}': {}", path, std::strerror(errno));
  const std::unique_ptr<const int, void (*)(const int*)> closer(&fd, [](const int* f) { ::close(*f); });
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
    pollfd writer{fd, POLLIN, 0};
    int ready;
    while ((ready = ::poll(&writer, 1, fifo_wait_ms)) < 0 && errno == EINTR) {
    }
    AG_CHECK(ready > 0, flag, "'{}' is a FIFO, and nothing wrote to it within {} s", path, fifo_wait_ms / 1000.0);
  }
  // Read in chunks and stop one byte past the limit: never an endless or unbounded read.
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= max_bytes) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    // Unreadable devices open but fail to read.
    AG_CHECK(n >= 0, flag, "cannot read '{}': {}", path, std::strerror(errno));
    if (n == 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
  }
  AG_CHECK(text.size() <= max_bytes, flag, "'{}' holds more than {} bytes, the limit", path, max_bytes);
  AG_CHECK(!text.empty(), flag, "'{}' is empty (or not a regular file)", path);
  return text;
}

namespace {
std::string text_fingerprint(const std::string& bytes) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (const unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return fmt::format("{} bytes, FNV-1a 64 {:016x}", bytes.size(), hash);
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
  tokenizer_ = tokenizer ? *tokenizer : Tokenizer::from_text(text, what);
  std::vector<std::int64_t> ids = tokenizer_.encode(text, what);
  AG_CHECK(!ids.empty(), what, "is empty");
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
  return tokenizer_.decode({train_.front()});
}

}  // namespace attograd
