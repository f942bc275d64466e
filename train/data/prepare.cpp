#include "train/data/prepare.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <climits>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>

#include "base/error.h"
#include "cpu/parallel.h"
#include "train/data/bpe.h"
#include "train/data/shards.h"
#include "train/files.h"

namespace attograd::train::data {

namespace {

namespace fs = std::filesystem;

// Text is read and encoded in chunks of about this many bytes, a batch of
// chunks (PrepareOptions::batch_bytes) at a time over the threads: memory
// stays a batch and a shard whatever the input's size.
constexpr std::size_t kChunkBytes = std::size_t(4) << 20;

// One input: a file, or stdin (path "-").
struct Source {
  std::string path;
  std::int64_t bytes = -1;  // -1: not known ahead
};

std::vector<Source> expand_inputs(const std::vector<std::string>& inputs) {
  AG_CHECK(!inputs.empty(), "prepare", "no input: give files, folders or - (stdin)");
  std::vector<Source> sources;
  for (const std::string& input : inputs) {
    if (input == "-") {
      sources.push_back({input, -1});
      continue;
    }
    std::error_code ec;
    const fs::file_status status = fs::status(input, ec);
    AG_CHECK(!ec && fs::exists(status), "prepare", "input '{}' does not exist", input);
    if (fs::is_directory(status)) {
      std::vector<std::string> files;
      for (const auto& entry : fs::recursive_directory_iterator(input))
        if (entry.is_regular_file()) files.push_back(entry.path().string());
      std::sort(files.begin(), files.end());
      AG_CHECK(!files.empty(), "prepare", "folder '{}' holds no files", input);
      for (const std::string& file : files) sources.push_back({file, static_cast<std::int64_t>(fs::file_size(file))});
    } else {
      sources.push_back({input, fs::is_regular_file(status) ? static_cast<std::int64_t>(fs::file_size(input)) : -1});
    }
  }
  return sources;
}

// A piece of one source's text. Chunks are cut after a line break between two
// printable ASCII characters ("x\nY"), where GPT-2's pattern cuts too (the
// break is a piece of its own either way), so the tokens are those of the
// whole text; only a stretch of kChunkBytes / 2 with no such break is cut
// elsewhere, at a character's start.
struct Chunk {
  std::string text;
  std::string source;
  std::size_t offset = 0;       // of text in its source, for errors
  bool starts_document = false;  // the source's first chunk: <|endoftext|> before it
};

std::size_t cut_point(const std::string& text) {
  const std::size_t half = text.size() / 2;
  const auto printable = [&](std::size_t i) { return text[i] > ' ' && text[i] < 0x7F; };
  for (std::size_t line = text.rfind('\n'); line != std::string::npos && line > half; line = text.rfind('\n', line - 1))
    if (line + 1 < text.size() && printable(line - 1) && printable(line + 1)) return line + 1;
  std::size_t cut = text.size();
  while (cut > half && (static_cast<unsigned char>(text[cut - 1]) & 0xC0) == 0x80) --cut;  // continuation bytes
  return cut > half && static_cast<unsigned char>(text[cut - 1]) >= 0xC0 ? cut - 1 : cut;
}

// Reads the sources in order, a chunk at a time.
class ChunkReader {
 public:
  ChunkReader(std::vector<Source> sources, std::FILE* stdin_stream)
      : sources_(std::move(sources)), stdin_(stdin_stream) {}

  // The next chunk; false when every source is read.
  bool next(Chunk& chunk) {
    while (true) {
      if (!file_ && !open_next()) return false;
      fill();
      if (pending_.empty() && at_end_) {
        close();
        continue;
      }
      const std::size_t cut = at_end_ && pending_.size() <= kChunkBytes ? pending_.size() : cut_point(pending_);
      chunk.text = pending_.substr(0, cut);
      pending_.erase(0, cut);
      chunk.source = sources_[index_ - 1].path;
      chunk.offset = offset_;
      chunk.starts_document = first_;
      offset_ += cut;
      first_ = false;
      bytes_read_ += static_cast<std::int64_t>(cut);
      return true;
    }
  }
  std::int64_t bytes_read() const { return bytes_read_; }
  std::int64_t documents() const { return static_cast<std::int64_t>(index_); }

 private:
  bool open_next() {
    if (index_ == sources_.size()) return false;
    const Source& source = sources_[index_++];
    file_ = source.path == "-" ? stdin_ : std::fopen(source.path.c_str(), "rb");
    AG_CHECK(file_ != nullptr, "prepare", "cannot read '{}': {}", source.path, std::strerror(errno));
    pending_.clear();
    offset_ = 0;
    first_ = true;
    at_end_ = false;
    return true;
  }
  void fill() {
    std::size_t have = pending_.size();
    if (at_end_ || have >= kChunkBytes) return;
    pending_.resize(kChunkBytes);
    while (have < kChunkBytes) {
      const std::size_t got = std::fread(pending_.data() + have, 1, kChunkBytes - have, file_);
      have += got;
      if (got == 0) {
        AG_CHECK(!std::ferror(file_), "prepare", "cannot read '{}': {}", sources_[index_ - 1].path,
                 std::strerror(errno));
        at_end_ = true;
        break;
      }
    }
    pending_.resize(have);
  }
  void close() {
    if (file_ != stdin_) std::fclose(file_);
    file_ = nullptr;
  }

  std::vector<Source> sources_;
  std::FILE* stdin_;
  std::size_t index_ = 0;  // sources opened
  std::FILE* file_ = nullptr;
  std::string pending_;
  std::size_t offset_ = 0;
  bool first_ = true, at_end_ = false;
  std::int64_t bytes_read_ = 0;
};

// Writes tokens into shards of at most shard_tokens each, <out>/<split>_NNNNNN.bin.
class ShardWriter {
 public:
  ShardWriter(std::string out, std::string split, std::int64_t shard_tokens)
      : out_(std::move(out)), split_(std::move(split)), shard_tokens_(shard_tokens) {}
  void add(const std::uint16_t* tokens, std::int64_t n) {
    while (n > 0) {
      const std::int64_t take = std::min<std::int64_t>(n, shard_tokens_ - static_cast<std::int64_t>(buffer_.size()));
      buffer_.insert(buffer_.end(), tokens, tokens + take);
      tokens += take, n -= take, total_ += take;
      if (static_cast<std::int64_t>(buffer_.size()) == shard_tokens_) flush();
    }
  }
  void flush() {
    if (buffer_.empty()) return;
    char name[32];
    std::snprintf(name, sizeof name, "%s_%06zu.bin", split_.c_str(), paths_.size());
    paths_.push_back((fs::path(out_) / name).string());
    sizes_.push_back(static_cast<std::int64_t>(buffer_.size()));
    write_file_atomically("prepare", paths_.back(), shard_bytes(buffer_));
    buffer_.clear();
  }
  const std::vector<std::string>& paths() const { return paths_; }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }  // tokens of each shard written
  std::int64_t total() const { return total_; }

 private:
  std::string out_, split_;
  std::int64_t shard_tokens_;
  std::vector<std::uint16_t> buffer_;
  std::vector<std::string> paths_;
  std::vector<std::int64_t> sizes_;
  std::int64_t total_ = 0;
};

void check_options(const PrepareOptions& o) {
  AG_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction", "must be in [0, 1), got {}", o.val_fraction);
  AG_CHECK(o.shard_tokens >= 1, "--shard-tokens", "must be at least 1, got {}", o.shard_tokens);
  AG_CHECK(o.batch_bytes >= 1, "prepare", "batch_bytes must be at least 1");
  AG_CHECK(o.shard_tokens <= INT32_MAX, "--shard-tokens", "must fit the shard header's int32 count, got {}",
           o.shard_tokens);
  AG_CHECK(!o.out.empty(), "--out", "is empty: it needs a folder");
  std::error_code ec;
  fs::create_directories(o.out, ec);
  AG_CHECK(fs::is_directory(o.out), "--out", "cannot make folder '{}': {}", o.out, ec.message());
  for (const auto& entry : fs::directory_iterator(o.out)) {
    const std::string name = entry.path().filename().string();
    AG_CHECK(!((name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) && entry.path().extension() == ".bin"),
             "--out", "'{}' already holds shards ({}): give an empty or new folder", o.out, name);
  }
}

// Moves the last `val_tokens` of the train shards into val shards: those
// shards' tails are copied a shard at a time and the train shards cut.
std::vector<std::string> split_off_validation(const ShardWriter& train, std::int64_t val_tokens,
                                              const PrepareOptions& o, std::vector<std::string>& kept_train) {
  ShardWriter val(o.out, "val", o.shard_tokens);
  const std::vector<std::string>& train_paths = train.paths();
  const std::vector<std::int64_t>& sizes = train.sizes();
  const std::int64_t split = train.total() - val_tokens;
  std::int64_t start = 0;
  std::vector<std::int64_t> ids;
  std::vector<std::uint16_t> tokens;
  for (std::size_t i = 0; i < train_paths.size(); start += sizes[i], ++i) {
    const std::int64_t end = start + sizes[i];
    if (end <= split) {
      kept_train.push_back(train_paths[i]);
      continue;
    }
    const TokenFile file(train_paths[i], TokenFormat::llmc_shard, "prepare");
    const std::int64_t from = std::max<std::int64_t>(0, split - start);
    ids.resize(static_cast<std::size_t>(sizes[i]));
    file.read(0, sizes[i], 65536, ids.data());
    tokens.assign(ids.begin(), ids.end());
    val.add(tokens.data() + from, sizes[i] - from);
    if (from > 0) {
      tokens.resize(static_cast<std::size_t>(from));
      write_file_atomically("prepare", train_paths[i], shard_bytes(tokens));
      kept_train.push_back(train_paths[i]);
    } else {
      fs::remove(train_paths[i]);
    }
  }
  val.flush();
  return val.paths();
}

// Every chunk of the reader's sources, encoded a batch at a time on the
// thread pool and added to the train shards in order; progress after each batch.
void encode_documents(ChunkReader& reader, const BpeTokenizer& tokenizer, std::size_t batch_bytes, ShardWriter& train,
                      PrepareProgress& done, const std::function<void(const PrepareProgress&)>& progress,
                      std::chrono::steady_clock::time_point start) {
  std::vector<Chunk> batch;
  std::vector<std::vector<std::uint16_t>> encoded;
  for (bool more = true; more;) {
    batch.clear();
    std::size_t bytes = 0;
    Chunk chunk;
    while (bytes < batch_bytes && (more = reader.next(chunk))) {
      bytes += chunk.text.size();
      batch.push_back(std::move(chunk));
    }
    encoded.assign(batch.size(), {});
    parallel_tasks(0, static_cast<std::int64_t>(batch.size()), 1, [&](TaskQueue& queue) {
      for (std::int64_t lo, hi; queue.next(lo, hi);)
        for (std::int64_t i = lo; i < hi; ++i) {
          const Chunk& c = batch[i];
          const std::vector<std::int64_t> ids = tokenizer.encode(c.text, false, c.source, c.offset);
          std::vector<std::uint16_t>& out = encoded[i];
          if (c.starts_document) out.push_back(static_cast<std::uint16_t>(tokenizer.end_of_text()));
          out.insert(out.end(), ids.begin(), ids.end());
        }
    });
    for (const auto& tokens : encoded) train.add(tokens.data(), static_cast<std::int64_t>(tokens.size()));
    done.bytes_read = reader.bytes_read();
    done.documents = reader.documents();
    done.tokens = train.total();
    done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(done);
  }
}

}  // namespace

PrepareSummary prepare_shards(const PrepareOptions& o, const std::function<void(const PrepareProgress&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_options(o);
  const BpeTokenizer tokenizer = BpeTokenizer::load(o.tokenizer);
  AG_CHECK(tokenizer.size() <= 65536, "--tokenizer", "{} tokens do not fit llm.c's uint16 shards", tokenizer.size());
  std::vector<Source> sources = expand_inputs(o.inputs);
  PrepareSummary summary;
  PrepareProgress& done = summary.done;
  done.total_bytes = 0;
  for (const Source& s : sources) done.total_bytes = s.bytes < 0 || done.total_bytes < 0 ? -1 : done.total_bytes + s.bytes;
  ChunkReader reader(std::move(sources), o.stdin_stream);
  ShardWriter train(o.out, "train", o.shard_tokens);
  try {
    encode_documents(reader, tokenizer, o.batch_bytes, train, done, progress, start);
    train.flush();
  } catch (...) {
    // A failed run leaves no shards behind, so the folder can take the next try.
    std::error_code ignored;
    for (const std::string& path : train.paths()) fs::remove(path, ignored);
    throw;
  }
  const auto val_tokens = static_cast<std::int64_t>(std::llround(o.val_fraction * static_cast<double>(train.total())));
  summary.val_tokens = val_tokens;
  summary.train_tokens = train.total() - val_tokens;
  if (val_tokens > 0)
    summary.val_shards = split_off_validation(train, val_tokens, o, summary.train_shards);
  else
    summary.train_shards = train.paths();
  done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace attograd::train::data
