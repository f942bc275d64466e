#pragma once
// A character-level tokenizer: one token per Unicode code point, ids in the
// order the code points first sort (so a vocabulary built from the same text
// is always the same). Stored in checkpoints as a JSON array of strings.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attograd::train::data {

class Tokenizer {
 public:
  Tokenizer() = default;
  // The distinct code points of `symbols`, sorted; `symbols` must be valid UTF-8.
  static Tokenizer from_text(std::string_view text, std::string_view what = "tokenizer");
  static Tokenizer from_json(const std::string& json);  // from to_json(); checked
  std::string to_json() const;

  std::int64_t size() const { return static_cast<std::int64_t>(symbols_.size()); }
  bool contains(char32_t symbol) const { return ids_.count(symbol) != 0; }
  std::int64_t id(char32_t symbol) const;  // throws "[tokenizer] 'x' is not in the vocabulary"
  char32_t symbol(std::int64_t id) const;

  // `what` names the flag or file the text came from, for error messages.
  std::vector<std::int64_t> encode(std::string_view text, std::string_view what = "tokenizer") const;
  std::string decode(const std::vector<std::int64_t>& ids) const;

 private:
  explicit Tokenizer(std::vector<char32_t> symbols);
  std::vector<char32_t> symbols_;
  std::unordered_map<char32_t, std::int64_t> ids_;
};

}  // namespace attograd::train::data
