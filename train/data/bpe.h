#pragma once
// GPT-2's byte-level BPE tokenizer, read from OpenAI's two files (encoder.json
// and vocab.bpe), giving the ids tiktoken's "gpt2" encoding gives. Text is cut
// into pieces by GPT-2's pattern (contractions, letters, numbers, other runs,
// whitespace) with PCRE2, whose Unicode tables give the letter and number
// classes; each piece's bytes are then merged by rank.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attograd::train::data {

// The 256 printable code points GPT-2's files write byte b as (its
// bytes_to_unicode): printable Latin-1 bytes stand for themselves, the others
// for U+0100 on, in byte order.
const std::vector<char32_t>& byte_stand_ins();

// The two files of a tokenizer folder: OpenAI's encoder.json and vocab.bpe,
// or the same files as Hugging Face names them, vocab.json and merges.txt.
struct BpeFiles {
  std::filesystem::path encoder, merges;
  // Hugging Face's names where `dir` holds vocab.json and no encoder.json, else OpenAI's (existing or not).
  static BpeFiles in(const std::filesystem::path& dir);
};

class BpeTokenizer {
 public:
  static constexpr const char* kEndOfText = "<|endoftext|>";

  // The files of `dir` (BpeFiles::in), checked against each other as
  // tiktoken checks them (every merge's result has the next rank, the 256
  // bytes come first); a bad file gets one line naming it and what is wrong.
  static BpeTokenizer load(const std::filesystem::path& dir);
  // The same from the files' contents; `where` and the names name them in errors.
  static BpeTokenizer from_files(const std::string& encoder_json, const std::string& vocab_bpe,
                                 const std::string& where = "tokenizer", const std::string& encoder_name = "encoder.json",
                                 const std::string& merges_name = "vocab.bpe");

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }  // 50257 for GPT-2
  std::int64_t end_of_text() const { return end_of_text_; }

  // Ids of UTF-8 text. `<|endoftext|>` in it is the special token only where
  // allow_special (tiktoken's allowed_special), else plain text. Invalid
  // UTF-8 throws "[what] invalid UTF-8 at byte N: ...", N counted from
  // `offset`, where text starts in what `what` names (a chunk of a file).
  std::vector<std::int64_t> encode(std::string_view text, bool allow_special = false,
                                   std::string_view what = "tokenizer", std::size_t offset = 0) const;
  // encode() of each text, the texts spread over the thread pool's threads (cpu/parallel.h).
  std::vector<std::vector<std::int64_t>> encode_batch(const std::vector<std::string_view>& texts,
                                                      bool allow_special = false) const;
  // The bytes the ids stand for: decode(encode(text)) == text.
  std::string decode(const std::vector<std::int64_t>& ids) const;
  const std::string& token_bytes(std::int64_t id) const;
  // 16 hex digits of FNV-1a 64 over every token's bytes in id order: equal
  // exactly when two tokenizers give the same ids (a checkpoint keeps it, to
  // know the files it is later given are the ones it was trained with).
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  struct Pattern;
  // The ids of pieces merged before (pieces repeat: words, the spaces before them), bounded.
  using PieceCache = std::unordered_map<std::string, std::vector<std::int64_t>>;
  BpeTokenizer(std::vector<std::string> tokens, std::int64_t end_of_text);
  void encode_into(std::string_view text, bool allow_special, std::string_view what, std::size_t offset,
                   PieceCache& cache, std::vector<std::int64_t>& ids) const;
  void encode_ordinary(std::string_view text, std::size_t base, std::vector<std::int64_t>& ids, PieceCache& cache,
                       std::string_view what) const;
  void merge_piece(std::string_view piece, std::vector<std::int64_t>& ids) const;
  void merge_long_piece(std::string_view piece, std::vector<std::int64_t>& ids) const;
  std::int64_t rank_of(std::string_view bytes) const;  // kNoRank where no token has these bytes

  // Lookups by string_view, with no string made for each (C++20's heterogeneous lookup).
  struct BytesHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view bytes) const { return std::hash<std::string_view>{}(bytes); }
  };

  std::vector<std::string> tokens_;                 // id -> bytes
  std::unordered_map<std::string, std::int64_t, BytesHash, std::equal_to<>> ranks_;  // bytes -> id (= rank)
  std::int64_t end_of_text_ = -1;
  std::string fingerprint_;
  std::unique_ptr<Pattern> pattern_;
};

}  // namespace attograd::train::data
