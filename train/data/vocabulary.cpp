#include "train/data/vocabulary.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "train/data/utf8.h"

namespace attograd::train::data {

namespace {
// Vocabularies past this are not a model this program trains: a checkpoint saying so is damaged.
constexpr std::int64_t kMaxVocabulary = std::int64_t{1} << 24;
}  // namespace

Vocabulary Vocabulary::of_characters(Tokenizer tokenizer) {
  Vocabulary v;
  v.characters_ = std::move(tokenizer);
  return v;
}

Vocabulary Vocabulary::of_gpt2(std::shared_ptr<const BpeTokenizer> bpe, std::string folder) {
  Vocabulary v;
  v.kind_ = Kind::gpt2;
  v.size_ = bpe->size();
  v.fingerprint_ = bpe->fingerprint();
  v.folder_ = std::move(folder);
  v.bpe_ = std::move(bpe);
  return v;
}

Vocabulary Vocabulary::load_gpt2(const std::string& folder, std::string_view flag) {
  AG_CHECK(std::filesystem::is_directory(folder), flag,
           "'{}' is not a folder (GPT-2's encoder.json and vocab.bpe: tests/reference/gpt2_tokenizer.py fetch DIR)",
           folder);
  try {
    const std::string absolute = std::filesystem::absolute(folder).lexically_normal().string();
    return of_gpt2(std::make_shared<const BpeTokenizer>(BpeTokenizer::load(absolute)), absolute);
  } catch (const Error& e) {
    fail(flag, "{}", e.what());
  }
}

Vocabulary Vocabulary::of_ids(std::int64_t size) {
  AG_CHECK(size >= 1 && size <= kMaxVocabulary, "--vocab-size", "must be in [1, {}], got {}", kMaxVocabulary, size);
  Vocabulary v;
  v.kind_ = Kind::ids;
  v.size_ = size;
  return v;
}

std::int64_t Vocabulary::size() const { return kind_ == Kind::characters ? characters_.size() : size_; }

const Tokenizer& Vocabulary::characters() const {
  AG_CHECK(kind_ == Kind::characters, "tokenizer", "the model's vocabulary is not characters");
  return characters_;
}

const BpeTokenizer& Vocabulary::text_tokenizer() const {
  AG_CHECK(kind_ != Kind::ids, "tokenizer",
           "the model was trained on {} token ids with no tokenizer: give --tokenizer DIR (GPT-2's files) to turn "
           "text into ids and back",
           size_);
  AG_CHECK(bpe_ != nullptr, "tokenizer", "the model's GPT-2 tokenizer files (from '{}') are not read: give --tokenizer DIR",
           folder_);
  return *bpe_;
}

std::vector<std::int64_t> Vocabulary::encode(std::string_view text, std::string_view what) const {
  if (kind_ == Kind::characters) return characters_.encode(text, what);
  return text_tokenizer().encode(text, /*allow_special=*/true, what);
}

std::string Vocabulary::decode(const std::vector<std::int64_t>& ids) const {
  if (kind_ == Kind::characters) return characters_.decode(ids);
  return text_tokenizer().decode(ids);
}

std::string Vocabulary::token_label(std::int64_t id) const {
  if (kind_ == Kind::characters) return encode_utf8(characters_.symbol(id));
  const std::string& bytes = text_tokenizer().token_bytes(id);
  try {
    decode_utf8(bytes, "token");
    return bytes;
  } catch (const Error&) {  // part of a character: its bytes, readable
    std::string label;
    for (const unsigned char b : bytes) label += b < 0x80 ? std::string(1, static_cast<char>(b)) : fmt::format("\\x{:02X}", b);
    return label;
  }
}

std::optional<std::int64_t> Vocabulary::end_of_text() const {
  if (!bpe_) return std::nullopt;
  return bpe_->end_of_text();
}

std::string Vocabulary::to_json() const {
  switch (kind_) {
    case Kind::characters:
      return characters_.to_json();
    case Kind::gpt2:
      return nlohmann::json{{"gpt2", {{"size", size_}, {"fingerprint", fingerprint_}, {"folder", folder_}}}}.dump();
    case Kind::ids:
      return nlohmann::json{{"ids", size_}}.dump();
  }
  return {};
}

Vocabulary Vocabulary::from_json(const std::string& json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer", "vocabulary is not valid JSON: {}", e.what());
  }
  if (j.is_array()) return of_characters(Tokenizer::from_json(json));
  AG_CHECK(j.is_object() && j.size() == 1 && (j.contains("gpt2") || j.contains("ids")), "tokenizer",
           "vocabulary {} is none of: a JSON array of characters, {{\"gpt2\": ...}}, {{\"ids\": N}}", j.dump());
  const auto size_of = [](const nlohmann::json& n) {
    AG_CHECK(n.is_number_unsigned() && n.get<std::uint64_t>() >= 1 && n.get<std::uint64_t>() <= kMaxVocabulary,
             "tokenizer", "vocabulary size {} is not in [1, {}]", n.dump(), kMaxVocabulary);
    return n.get<std::int64_t>();
  };
  if (j.contains("ids")) return of_ids(size_of(j["ids"]));
  const nlohmann::json& g = j["gpt2"];
  AG_CHECK(g.is_object() && g.contains("size") && g.contains("fingerprint") && g.contains("folder") &&
               g["fingerprint"].is_string() && g["folder"].is_string(),
           "tokenizer", "GPT-2 vocabulary {} needs a size, a fingerprint and a folder", g.dump());
  Vocabulary v;
  v.kind_ = Kind::gpt2;
  v.size_ = size_of(g["size"]);
  v.fingerprint_ = g["fingerprint"].get<std::string>();
  v.folder_ = g["folder"].get<std::string>();
  return v;
}

Vocabulary Vocabulary::attached(const std::string& folder, std::string_view flag) const {
  if (kind_ == Kind::characters) {
    AG_CHECK(folder.empty(), flag, "the model reads characters, not GPT-2 tokens: it needs no tokenizer");
    return *this;
  }
  if (bpe_ && folder.empty()) return *this;
  AG_CHECK(!folder.empty() || kind_ == Kind::gpt2, flag,
           "the model was trained on {} token ids with no tokenizer: give --tokenizer DIR (GPT-2's files)", size_);
  const std::string where = folder.empty() ? folder_ : folder;
  AG_CHECK(!where.empty() && std::filesystem::is_directory(where), flag,
           "the model's GPT-2 tokenizer folder '{}' is gone: give --tokenizer DIR (GPT-2's encoder.json and "
           "vocab.bpe)",
           where);
  Vocabulary loaded = load_gpt2(where, flag);
  if (kind_ == Kind::ids) {
    AG_CHECK(loaded.size() == size_, flag, "'{}' holds {} tokens, but the model was trained on {} token ids", where,
             loaded.size(), size_);
    return loaded;
  }
  AG_CHECK(loaded.fingerprint_ == fingerprint_ && loaded.size_ == size_, flag,
           "the tokenizer in '{}' ({} tokens, fingerprint {}) is not the one the model was trained with ({} tokens, "
           "fingerprint {})",
           where, loaded.size_, loaded.fingerprint_, size_, fingerprint_);
  return loaded;
}

}  // namespace attograd::train::data
