#include "train/data/token_data.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "base/fnv.h"

namespace attograd::train::data {

namespace fs = std::filesystem;

namespace {

bool is_glob(const std::string& pattern) { return pattern.find_first_of("*?[") != std::string::npos; }

// The files a path or glob names, sorted by their bytes (glob's own order follows the locale).
std::vector<std::string> expand(const std::string& pattern, const char* flag) {
  if (!is_glob(pattern)) {
    AG_CHECK(fs::is_regular_file(pattern), flag, "cannot read '{}': {}", pattern,
             fs::exists(pattern) ? "not a regular file" : "no such file");
    return {pattern};
  }
  glob_t found{};
  const int status = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<std::string> files(found.gl_pathv, found.gl_pathv + found.gl_pathc);
  ::globfree(&found);
  AG_CHECK(status == 0 && !files.empty(), flag, "'{}' matches no file", pattern);
  std::sort(files.begin(), files.end());
  return files;
}

// nanoGPT's and llm.c's validation files are named as the training ones with "val" for "train".
std::string validation_pattern(const std::string& train) {
  const fs::path path(train);
  std::string name = path.filename().string();
  const auto at = name.rfind("train");
  AG_CHECK(at != std::string::npos, "--val-data",
           "is needed: '{}' has no \"train\" in its name to find the validation files by", train);
  name.replace(at, 5, "val");
  return (path.parent_path() / name).string();
}

// Tokens a fingerprint reads at each end of a file.
constexpr std::int64_t kFingerprintTokens = std::int64_t{1} << 19;

std::uint64_t fingerprint_file(const TokenFile& file, std::uint64_t hash) {
  const std::int64_t n = file.size(), head = std::min(n, kFingerprintTokens);
  hash = fnv1a64(&n, sizeof n, hash);
  hash = fnv1a64(file.token_bytes(0, head), hash);
  const std::int64_t tail = std::min(n - head, kFingerprintTokens);
  return fnv1a64(file.token_bytes(n - tail, tail), hash);
}

// Rows [first, first + count) of block + 1 tokens (inputs and next-token targets) at `starts`.
Batch windows(const std::vector<std::pair<const TokenFile*, std::int64_t>>& starts, std::int64_t block,
              std::int64_t vocab_size) {
  const auto rows = static_cast<std::int64_t>(starts.size());
  std::vector<std::int64_t> tokens(rows * block), targets(rows * block), window(block + 1);
  for (std::int64_t r = 0; r < rows; ++r) {
    starts[r].first->read(starts[r].second, block + 1, vocab_size, window.data());
    std::copy_n(window.begin(), block, tokens.begin() + r * block);
    std::copy_n(window.begin() + 1, block, targets.begin() + r * block);
  }
  return {from_vector(tokens, {rows, block}), from_vector(targets, {rows, block})};
}

}  // namespace

bool looks_like_token_files(const std::string& data) {
  return fs::is_directory(data) || is_glob(data) || fs::path(data).extension() == ".bin";
}

std::string token_data_name(const std::string& data) {
  const fs::path path = fs::path(data).lexically_normal();
  if (fs::is_directory(path)) return fs::absolute(path).lexically_normal().filename().string();
  if (is_glob(path.filename().string())) return fs::absolute(path).parent_path().filename().string();
  return path.stem().string();
}

TokenFiles find_token_files(const std::string& data, const std::string& val_data, TokenFormat format) {
  TokenFiles files;
  if (fs::is_directory(data)) {
    const bool nanogpt = format == TokenFormat::nanogpt_bin;
    const fs::path folder(data);
    files.train = expand((folder / (nanogpt ? "train.bin" : "*train*.bin")).string(), "--data");
    if (val_data.empty()) files.validation = expand((folder / (nanogpt ? "val.bin" : "*val*.bin")).string(), "--data");
  } else {
    files.train = expand(data, "--data");
    if (val_data.empty()) files.validation = expand(validation_pattern(data), "--val-data");
  }
  if (!val_data.empty()) files.validation = expand(val_data, "--val-data");
  const std::set<std::string> train(files.train.begin(), files.train.end());
  for (const std::string& v : files.validation)
    AG_CHECK(!train.count(v), "--val-data", "'{}' is a training file too: a held-out set must not be trained on", v);
  return files;
}

TokenData::TokenData(const TokenFiles& files, TokenFormat format, Vocabulary vocabulary, std::uint64_t seed,
                     const std::string& expected_fingerprint)
    : vocabulary_(std::move(vocabulary)), seed_(seed) {
  std::uint64_t hash = kFnv1aOffset;
  for (const auto& [paths, mapped, flag, count] :
       {std::tuple{&files.train, &train_, "--data", &train_tokens_},
        std::tuple{&files.validation, &validation_, "--val-data", &validation_tokens_}}) {
    for (const std::string& path : *paths) {
      mapped->emplace_back(path, format, flag);
      *count += mapped->back().size();
      hash = fingerprint_file(mapped->back(), hash);
    }
  }
  fingerprint_ = fmt::format("{} files, {} tokens, FNV-1a 64 {:016x}", train_.size() + validation_.size(),
                             train_tokens_ + validation_tokens_, hash);
  AG_CHECK(expected_fingerprint.empty() || fingerprint_ == expected_fingerprint, "--resume",
           "{} are not the tokens the checkpoint was trained on ({} now, {} then): a run continues only on its own "
           "data",
           files.train.front(), fingerprint_, expected_fingerprint);
}

void TokenData::check_block(std::int64_t block) const {
  const auto longest = [](const std::vector<TokenFile>& set) {
    std::int64_t n = 0;
    for (const TokenFile& f : set) n = std::max(n, f.size());
    return n;
  };
  AG_CHECK(longest(train_) >= block + 1, "--data",
           "no training file holds a window of --block {} + 1 tokens (the longest holds {})", block, longest(train_));
  AG_CHECK(longest(validation_) >= block + 1, "--val-data",
           "no validation file holds a window of --block {} + 1 tokens (the longest holds {})", block,
           longest(validation_));
}

Batch TokenData::train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const {
  check_block(block);
  // Window w of all of them is start w - ends[f - 1] of the file f whose range holds it.
  std::vector<std::uint64_t> ends;
  std::uint64_t total = 0;
  for (const TokenFile& f : train_) ends.push_back(total += static_cast<std::uint64_t>(std::max<std::int64_t>(0, f.size() - block)));
  std::vector<std::pair<const TokenFile*, std::int64_t>> starts;
  for (std::int64_t b = 0; b < batch; ++b) {
    CounterRng rng(seed_, step * batch + b);
    const std::uint64_t w = rng.below_wide(total);
    const auto f = static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), w) - ends.begin());
    starts.emplace_back(&train_[f], static_cast<std::int64_t>(w - (f == 0 ? 0 : ends[f - 1])));
  }
  return windows(starts, block, vocabulary_.size());
}

std::int64_t TokenData::eval_sequences(std::int64_t block) const {
  check_block(block);
  std::int64_t n = 0;
  for (const TokenFile& f : validation_) n += (f.size() - 1) / block;
  return n;
}

Batch TokenData::eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const {
  const std::int64_t total = eval_sequences(block);
  AG_CHECK(first >= 0 && count >= 1 && first <= total - count, "eval", "windows [{}, {}) are outside the {} windows of {}",
           first, first + count, total, validation_.front().path());
  std::vector<std::pair<const TokenFile*, std::int64_t>> starts;
  std::size_t f = 0;
  std::int64_t before = 0;  // windows in the files before f
  for (std::int64_t w = first; w < first + count; ++w) {
    while (w - before >= (validation_[f].size() - 1) / block) before += (validation_[f++].size() - 1) / block;
    starts.emplace_back(&validation_[f], (w - before) * block);
  }
  return windows(starts, block, vocabulary_.size());
}

std::string TokenData::default_prompt() const {
  const auto eot = vocabulary_.end_of_text();
  return eot ? vocabulary_.decode({*eot}) : std::string();
}

}  // namespace attograd::train::data
