#include "train/data/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "train/data/utf8.h"

namespace attograd::train::data {

namespace {
// A symbol as a person would read it in an error message.
std::string printable(char32_t cp) {
  if (cp == '\n') return "\\n";
  if (cp == '\t') return "\\t";
  if (cp < 0x20 || cp == 0x7F) return fmt::format("U+{:04X}", static_cast<std::uint32_t>(cp));
  return encode_utf8(cp);
}
}  // namespace

Tokenizer::Tokenizer(std::vector<char32_t> symbols) : symbols_(std::move(symbols)) {
  for (std::size_t i = 0; i < symbols_.size(); ++i) ids_[symbols_[i]] = static_cast<std::int64_t>(i);
}

Tokenizer Tokenizer::from_text(std::string_view text, std::string_view what) {
  std::vector<char32_t> cps = decode_utf8(text, what);
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  return Tokenizer(std::move(cps));
}

std::string Tokenizer::to_json() const {
  nlohmann::json symbols = nlohmann::json::array();
  for (char32_t cp : symbols_) symbols.push_back(encode_utf8(cp));
  return symbols.dump();
}

Tokenizer Tokenizer::from_json(const std::string& json) {
  nlohmann::json symbols;
  try {
    symbols = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer", "vocabulary is not valid JSON: {}", e.what());
  }
  AG_CHECK(symbols.is_array() && !symbols.empty(), "tokenizer", "vocabulary must be a non-empty JSON array");
  std::vector<char32_t> cps;
  for (const auto& s : symbols) {
    AG_CHECK(s.is_string(), "tokenizer", "vocabulary entry {} is not a string", s.dump());
    const std::vector<char32_t> one = decode_utf8(s.get<std::string>(), "tokenizer");
    AG_CHECK(one.size() == 1, "tokenizer", "vocabulary entry {} is not one code point", s.dump());
    cps.push_back(one[0]);
  }
  Tokenizer t(cps);
  AG_CHECK(t.ids_.size() == cps.size(), "tokenizer", "vocabulary has duplicate entries");
  return t;
}

std::int64_t Tokenizer::id(char32_t symbol) const {
  const auto it = ids_.find(symbol);
  AG_CHECK(it != ids_.end(), "tokenizer", "'{}' is not in the vocabulary", printable(symbol));
  return it->second;
}

char32_t Tokenizer::symbol(std::int64_t id) const {
  AG_CHECK(id >= 0 && id < size(), "tokenizer", "token id {} out of range for a vocabulary of {}", id, size());
  return symbols_[id];
}

std::vector<std::int64_t> Tokenizer::encode(std::string_view text, std::string_view what) const {
  std::vector<std::int64_t> ids;
  for (char32_t cp : decode_utf8(text, what)) {
    const auto it = ids_.find(cp);
    AG_CHECK(it != ids_.end(), what, "'{}' is not in the model's vocabulary", printable(cp));
    ids.push_back(it->second);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<std::int64_t>& ids) const {
  std::string s;
  for (std::int64_t id : ids) s += encode_utf8(symbol(id));
  return s;
}

}  // namespace attograd::train::data
