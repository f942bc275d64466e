#include "train/data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <limits>
#include <queue>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/fnv.h"
#include "cpu/parallel.h"
#include "train/data/utf8.h"
#include "train/files.h"

namespace attograd::train::data {

namespace {

// GPT-2's pre-tokenizer, as tiktoken writes it for "gpt2" (r50k): possessive
// runs, whitespace at the very end of the text (PCRE2_DOLLAR_ENDONLY: `$` is
// the end, as Rust's regex reads it, not also the place before a final
// newline), whitespace not followed by non-space, then single whitespace.
constexpr const char* kPattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";

// GPT-2's encoder.json is 1 MB and vocab.bpe 0.5 MB: far above either is not such a file.
constexpr std::uint64_t kMaxTokenizerFileBytes = 64 << 20;

// Pieces a cache holds before it starts again: a text's common words stay, and
// a corpus of rare ones does not grow it without end.
constexpr std::size_t kMaxCachedPieces = 1 << 16;

// Pieces longer than this merge through a heap (BpeTokenizer::merge_long_piece)
// and are not cached: words are far shorter, a run of one character need not be.
constexpr std::size_t kLongPiece = 256;

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof message);
  return reinterpret_cast<const char*>(message);
}

}  // namespace

const std::vector<char32_t>& byte_stand_ins() {
  static const std::vector<char32_t> stand_ins = [] {
    std::vector<char32_t> map(256);
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) map[b] = printable(b) ? char32_t(b) : next++;
    return map;
  }();
  return stand_ins;
}

// The compiled pattern, matched from any thread (each match brings its own match data).
struct BpeTokenizer::Pattern {
  pcre2_code* code = nullptr;
  Pattern() {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr);
    AG_CHECK(code != nullptr, "tokenizer", "GPT-2's pattern does not compile at {}: {}", offset,
             pcre2_message(error));
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where PCRE2 has no JIT, matching interprets
  }
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
};

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens, std::int64_t end_of_text)
    : tokens_(std::move(tokens)), end_of_text_(end_of_text), pattern_(std::make_unique<Pattern>()) {
  ranks_.reserve(tokens_.size());
  std::uint64_t hash = kFnv1aOffset;
  for (std::int64_t id = 0; id < size(); ++id) {
    if (id != end_of_text_) ranks_.emplace(tokens_[id], id);
    const std::uint64_t length = tokens_[id].size();  // so that "ab","c" and "a","bc" differ
    hash = fnv1a64(tokens_[id], fnv1a64(&length, sizeof length, hash));
  }
  fingerprint_ = fmt::format("{:016x}", fnv1a64(&end_of_text_, sizeof end_of_text_, hash));
}

BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeFiles BpeFiles::in(const std::filesystem::path& dir) {
  if (std::filesystem::exists(dir / "vocab.json") && !std::filesystem::exists(dir / "encoder.json"))
    return {dir / "vocab.json", dir / "merges.txt"};
  return {dir / "encoder.json", dir / "vocab.bpe"};
}

BpeTokenizer BpeTokenizer::load(const std::filesystem::path& dir) {
  const BpeFiles files = BpeFiles::in(dir);
  for (const auto& file : {files.encoder, files.merges})
    AG_CHECK(std::filesystem::is_regular_file(file), "tokenizer",
             "{} is missing: a GPT-2 tokenizer folder holds encoder.json and vocab.bpe (or Hugging Face's "
             "vocab.json and merges.txt)",
             file.string());
  return from_files(read_file(files.encoder.string(), "tokenizer", kMaxTokenizerFileBytes),
                    read_file(files.merges.string(), "tokenizer", kMaxTokenizerFileBytes), dir.string(),
                    files.encoder.filename().string(), files.merges.filename().string());
}

BpeTokenizer BpeTokenizer::from_files(const std::string& encoder_json, const std::string& vocab_bpe,
                                      const std::string& where, const std::string& encoder_name,
                                      const std::string& merges_name) {
  const std::vector<char32_t>& stand_ins = byte_stand_ins();
  // Ranks as tiktoken derives them: the 256 bytes in the order of their
  // stand-ins, then each merge's result in the order of vocab.bpe.
  std::vector<int> byte_of(512, -1);
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) byte_of[stand_ins[b]] = b;
  for (bool printable : {true, false})
    for (int b = 0; b < 256; ++b)
      if ((stand_ins[b] == char32_t(b)) == printable) tokens.push_back(std::string(1, static_cast<char>(b)));
  const auto to_bytes = [&](std::string_view text, const std::string& file, std::string_view line) {
    std::string bytes;
    for (char32_t cp : decode_utf8(text, file)) {
      AG_CHECK(cp < byte_of.size() && byte_of[cp] >= 0, "tokenizer",
               "{}: U+{:04X} in '{}' stands for no byte (not a GPT-2 byte-level file)", file,
               static_cast<std::uint32_t>(cp), line);
      bytes.push_back(static_cast<char>(byte_of[cp]));
    }
    return bytes;
  };
  const std::string merges_file = where + "/" + merges_name, encoder_file = where + "/" + encoder_name;
  std::istringstream lines(vocab_bpe);
  std::string line;
  for (std::int64_t number = 1; std::getline(lines, line); ++number) {
    if (number == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    AG_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string::npos,
             "tokenizer", "{} line {}: expected two symbols separated by one space, got '{}'", merges_file, number,
             line);
    tokens.push_back(to_bytes(std::string_view(line).substr(0, space), merges_file, line) +
                     to_bytes(std::string_view(line).substr(space + 1), merges_file, line));
  }
  // encoder.json: the same ids for the same bytes, and <|endoftext|> after them.
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_json);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer", "{} is not JSON: {}", encoder_file, e.what());
  }
  AG_CHECK(encoder.is_object(), "tokenizer", "{} must be an object of token -> id", encoder_file);
  std::int64_t end_of_text = -1;
  std::int64_t checked = 0;
  for (const auto& [key, value] : encoder.items()) {
    AG_CHECK(value.is_number_integer(), "tokenizer", "{}: the id of '{}' is not an integer", encoder_file, key);
    const std::int64_t id = value.get<std::int64_t>();
    if (key == kEndOfText) {
      end_of_text = id;
      continue;
    }
    AG_CHECK(id >= 0 && id < static_cast<std::int64_t>(tokens.size()) && tokens[id] == to_bytes(key, encoder_file, key),
             "tokenizer", "{}: '{}' has id {}, but vocab.bpe gives those bytes another rank (the files disagree)",
             encoder_file, key, id);
    ++checked;
  }
  AG_CHECK(checked == static_cast<std::int64_t>(tokens.size()), "tokenizer",
           "{} has {} tokens besides {}, {} makes {}", encoder_file, checked, kEndOfText, merges_name, tokens.size());
  AG_CHECK(end_of_text == static_cast<std::int64_t>(tokens.size()), "tokenizer",
           "{}: {} must follow the {} merged tokens, got id {}", encoder_file, kEndOfText, tokens.size(), end_of_text);
  tokens.push_back(kEndOfText);
  return BpeTokenizer(std::move(tokens), end_of_text);
}

std::vector<std::int64_t> BpeTokenizer::encode(std::string_view text, bool allow_special, std::string_view what,
                                               std::size_t offset) const {
  std::vector<std::int64_t> ids;
  PieceCache cache;
  encode_into(text, allow_special, what, offset, cache, ids);
  return ids;
}

std::vector<std::vector<std::int64_t>> BpeTokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                                  bool allow_special) const {
  std::vector<std::vector<std::int64_t>> ids(texts.size());
  // Texts in the order threads ask for them (their lengths vary), each thread with its own cache.
  parallel_tasks(0, static_cast<std::int64_t>(texts.size()), 1, [&](TaskQueue& queue) {
    PieceCache cache;
    for (std::int64_t lo, hi; queue.next(lo, hi);)
      for (std::int64_t i = lo; i < hi; ++i) encode_into(texts[i], allow_special, "tokenizer", 0, cache, ids[i]);
  });
  return ids;
}

void BpeTokenizer::encode_into(std::string_view text, bool allow_special, std::string_view what,
                               std::size_t offset, PieceCache& cache, std::vector<std::int64_t>& ids) const {
  ids.reserve(ids.size() + text.size() / 3);
  const std::string_view special = kEndOfText;
  std::size_t begin = 0;
  while (allow_special) {
    const std::size_t at = text.find(special, begin);
    if (at == std::string_view::npos) break;
    encode_ordinary(text.substr(begin, at - begin), offset + begin, ids, cache, what);
    ids.push_back(end_of_text_);
    begin = at + special.size();
  }
  encode_ordinary(text.substr(begin), offset + begin, ids, cache, what);
}

// The pieces GPT-2's pattern cuts `text` into, each merged. PCRE2 checks the
// UTF-8 of the whole text on the first match only; base is text's offset in
// what the caller was given, for the error's byte offset.
void BpeTokenizer::encode_ordinary(std::string_view text, std::size_t base, std::vector<std::int64_t>& ids,
                                   PieceCache& cache, std::string_view what) const {
  if (text.empty()) return;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::uint32_t options = 0;
  for (PCRE2_SIZE start = 0; start < text.size();) {
    const int found = pcre2_match(pattern_->code, subject, text.size(), start, options, match, nullptr);
    if (found <= 0) {
      const PCRE2_SIZE bad = pcre2_get_startchar(match);
      pcre2_match_data_free(match);
      AG_CHECK(found != PCRE2_ERROR_NOMATCH, what, "GPT-2's pattern matches nothing at byte {}", base + start);
      fail(what, "invalid UTF-8 at byte {}: {}", base + bad, pcre2_message(found));
    }
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
    const std::string_view piece = text.substr(span[0], span[1] - span[0]);
    if (const auto known = ranks_.find(piece); known != ranks_.end()) {
      ids.push_back(known->second);
    } else if (piece.size() > kLongPiece) {
      merge_piece(piece, ids);
    } else {
      if (cache.size() >= kMaxCachedPieces) cache.clear();
      auto [entry, fresh] = cache.try_emplace(std::string(piece));
      if (fresh) merge_piece(piece, entry->second);
      ids.insert(ids.end(), entry->second.begin(), entry->second.end());
    }
    start = span[1] > span[0] ? span[1] : span[1] + 1;  // the pattern never matches empty; guard anyway
  }
  pcre2_match_data_free(match);
}

constexpr std::int64_t kNoRank = std::numeric_limits<std::int64_t>::max();

std::int64_t BpeTokenizer::rank_of(std::string_view bytes) const {
  const auto found = ranks_.find(bytes);
  return found == ranks_.end() ? kNoRank : found->second;
}

// tiktoken's byte-pair merge: of the adjacent parts, the pair whose
// concatenation has the lowest rank joins first (the leftmost of equals),
// until no pair is a token; then each part is one. A scan finds the pair,
// which is quadratic in the piece's length: long pieces go to merge_long_piece.
void BpeTokenizer::merge_piece(std::string_view piece, std::vector<std::int64_t>& ids) const {
  if (piece.size() > kLongPiece) return merge_long_piece(piece, ids);
  struct Part {
    std::size_t start;
    std::int64_t rank;  // of this part joined with the next
  };
  std::vector<Part> parts;
  parts.reserve(piece.size() + 1);
  for (std::size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, rank_of(piece.substr(i, 2))});
  parts.push_back({piece.size() - 1, kNoRank});
  parts.push_back({piece.size(), kNoRank});
  const auto joined_rank = [&](std::size_t i) {
    return i + 3 < parts.size() ? rank_of(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start))
                                : kNoRank;
  };
  while (parts.size() > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < parts.size(); ++i)
      if (parts[i].rank < parts[best].rank) best = i;
    if (parts[best].rank == kNoRank) break;
    parts[best].rank = joined_rank(best);
    if (best > 0) parts[best - 1].rank = joined_rank(best - 1);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (std::size_t i = 0; i + 1 < parts.size(); ++i)
    ids.push_back(rank_of(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
}

// The same merges for a long piece (a megabyte of one letter, say): the parts
// as a linked list by their starts, the joinable pairs in a heap ordered by
// (rank, start), which pops the pair the scan would pick; a pair whose part
// has changed since it was pushed is skipped when it comes up.
void BpeTokenizer::merge_long_piece(std::string_view piece, std::vector<std::int64_t>& ids) const {
  const std::size_t n = piece.size();
  std::vector<std::size_t> next(n), prev(n);
  std::vector<std::uint32_t> version(n, 0);
  for (std::size_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;  // prev[0] unused
  struct Pair {
    std::int64_t rank;
    std::size_t start;
    std::uint32_t version;
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Pair, std::vector<Pair>, std::greater<>> heap;
  const auto push = [&](std::size_t start) {  // the part at start joined with its next, if that is a token
    if (next[start] >= n) return;
    const std::size_t end = next[next[start]];
    if (const std::int64_t rank = rank_of(piece.substr(start, end - start)); rank != kNoRank)
      heap.push({rank, start, version[start]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Pair top = heap.top();
    heap.pop();
    if (top.version != version[top.start]) continue;  // its part changed after the push
    const std::size_t s = top.start, t = next[s];
    next[s] = next[t];
    if (next[t] < n) prev[next[t]] = s;
    ++version[s];
    ++version[t];  // t is gone: its pushed pairs are stale
    push(s);
    if (s > 0) {
      ++version[prev[s]];
      push(prev[s]);
    }
  }
  for (std::size_t s = 0; s < n; s = next[s]) ids.push_back(rank_of(piece.substr(s, next[s] - s)));
}

std::string BpeTokenizer::decode(const std::vector<std::int64_t>& ids) const {
  std::string bytes;
  for (std::int64_t id : ids) bytes += token_bytes(id);
  return bytes;
}

const std::string& BpeTokenizer::token_bytes(std::int64_t id) const {
  AG_CHECK(id >= 0 && id < size(), "tokenizer", "token id {} is outside the vocabulary of {}", id, size());
  return tokens_[id];
}

}  // namespace attograd::train::data
