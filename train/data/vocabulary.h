#pragma once
// What a model's token ids stand for, as its checkpoint keeps it (the "vocab"
// metadata):
//   characters  one id per code point (the tasks, character-level text): the
//               Tokenizer itself, kept as a JSON array of strings
//   gpt2        GPT-2's byte-level BPE (train/data/bpe.h), kept as
//               {"gpt2": {"size": 50257, "fingerprint": "...", "folder": "/abs/dir"}}:
//               the files stay where they are, and attached() reads them again
//               (from there, or from a folder the user names) and checks that they
//               give the same ids
//   ids         token ids with no text attached (shards trained without
//               --tokenizer), kept as {"ids": N}: training and evaluation need no
//               text; prompts and samples need a tokenizer attached
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/data/bpe.h"
#include "train/data/tokenizer.h"

namespace attograd::train::data {

class Vocabulary {
 public:
  enum class Kind { characters, gpt2, ids };

  Vocabulary() = default;  // characters, none yet
  static Vocabulary of_characters(Tokenizer tokenizer);
  // `folder` is where the files were read from, kept for a later attached().
  static Vocabulary of_gpt2(std::shared_ptr<const BpeTokenizer> bpe, std::string folder);
  // GPT-2's tokenizer read from `folder`; its errors name `flag`.
  static Vocabulary load_gpt2(const std::string& folder, std::string_view flag);
  static Vocabulary of_ids(std::int64_t size);

  Kind kind() const { return kind_; }
  std::int64_t size() const;
  // Whether ids can be turned into text and back: characters, or GPT-2 with its files read.
  bool has_text() const { return kind_ == Kind::characters || bpe_ != nullptr; }

  // The ids of a prompt (`what` names where it came from). GPT-2's
  // `<|endoftext|>` in it is the special token: a prompt that writes it means it.
  std::vector<std::int64_t> encode(std::string_view text, std::string_view what) const;
  std::string decode(const std::vector<std::int64_t>& ids) const;
  // One token as a label (a heat map's axis): its text, with bytes that are not
  // whole UTF-8 characters written as \xNN.
  std::string token_label(std::int64_t id) const;
  // GPT-2's <|endoftext|>, which separates documents, once its files are read; none for characters and ids.
  std::optional<std::int64_t> end_of_text() const;

  const Tokenizer& characters() const;  // characters only
  const std::string& folder() const { return folder_; }  // gpt2: where the files were read from

  std::string to_json() const;
  // From to_json() (or a checkpoint's older JSON array of characters), checked;
  // reads no file: a gpt2 vocabulary comes back without its files.
  static Vocabulary from_json(const std::string& json);
  // This vocabulary with GPT-2's files read from `folder` (empty: the folder it
  // keeps) and checked to give the ids it was trained with; an ids vocabulary
  // becomes gpt2 when the tokenizer has its size; characters are returned as
  // they are. Errors name `flag` and the folder.
  Vocabulary attached(const std::string& folder, std::string_view flag) const;

  friend bool operator==(const Vocabulary& a, const Vocabulary& b) { return a.to_json() == b.to_json(); }

 private:
  // Throws "[tokenizer] ..." saying what to give when there is no text to turn ids into.
  const BpeTokenizer& text_tokenizer() const;

  Kind kind_ = Kind::characters;
  Tokenizer characters_;
  std::shared_ptr<const BpeTokenizer> bpe_;  // gpt2, once its files are read
  std::int64_t size_ = 0;                    // gpt2 and ids
  std::string fingerprint_, folder_;         // gpt2
};

}  // namespace attograd::train::data
